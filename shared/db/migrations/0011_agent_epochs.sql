-- Bound agent identities. A node's identity epoch counts the times every
-- identity of the node was ended (release, undeploy, retire): a
-- certificate names the epoch it was issued in, and only a certificate of
-- the node's current epoch, unrevoked, answers for it. A node without a
-- row is in epoch 0.
CREATE TABLE node_agent_epochs (
    node_id TEXT PRIMARY KEY REFERENCES nodes (id) ON DELETE CASCADE,
    epoch   INTEGER NOT NULL CHECK (epoch >= 0)
);
ALTER TABLE node_certs ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0;
-- A transition expires the unused join tokens of what it ends.
CREATE INDEX join_tokens_node_unused ON join_tokens (node_id) WHERE used_at IS NULL;
