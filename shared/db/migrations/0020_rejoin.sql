-- An installed OS's agent rejoins with its identity (no token): the newest
-- signedAt each certificate signed a rejoin with, so an older signature
-- (a captured request) is refused.
ALTER TABLE node_certs ADD COLUMN last_rejoin_at TIMESTAMPTZ;
