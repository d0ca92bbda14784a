-- A pool's erase policy: the methods that satisfy secure-erase and
-- crypto-erase, in the order the agent tries them on each disk
-- (bcm_core's ErasePolicy as JSON; NULL: the default policy).
ALTER TABLE pools ADD COLUMN erase_methods JSONB;
