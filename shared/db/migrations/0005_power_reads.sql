-- When each node's power was last asked of its BMC by the power sync: the
-- sync picks the longest-unread nodes from this small table instead of
-- scanning every node's commands.
CREATE TABLE power_reads (
    node_id        TEXT PRIMARY KEY REFERENCES nodes (id),
    requested_at   TIMESTAMPTZ NOT NULL
);
CREATE INDEX power_reads_requested ON power_reads (requested_at);

-- Commands still waiting for a result, by kind (the sync's in-flight bound).
CREATE INDEX commands_outstanding ON commands (kind) WHERE status IN ('pending', 'sent');
