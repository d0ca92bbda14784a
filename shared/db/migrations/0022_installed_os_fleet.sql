-- The installed operating systems that heartbeat (nodes deployed or
-- adopted in a pool that runs bcd): the API sizes their idle heartbeat
-- cadence to their count, read by every replica every 30 s by default,
-- so it is kept cheap.
CREATE INDEX nodes_installed_os ON nodes (pool_id)
    WHERE provision_state IN ('deployed', 'adopted');
