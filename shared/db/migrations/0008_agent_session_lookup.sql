-- Commands go to the node's newest live session only: find a node's
-- sessions by age without scanning them all.
CREATE INDEX agent_sessions_node_created ON agent_sessions (node_id, created_at DESC);
