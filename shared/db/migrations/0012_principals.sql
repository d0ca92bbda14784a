-- Who did what. A verb's principal (an API token's name) is recorded with
-- the node it moved (`node_actors`: the principal whose verb started what
-- the node is doing, kept through the moves the reconciler chains after
-- it), copied onto the workflow its state runs, and onto every command the
-- verb or that workflow issues. The control plane's own work (a power
-- read, a chain nobody asked for) carries none.
CREATE TABLE node_actors (
    node_id TEXT PRIMARY KEY REFERENCES nodes (id) ON DELETE CASCADE,
    actor   TEXT NOT NULL,
    at      TIMESTAMPTZ NOT NULL DEFAULT now()
);
ALTER TABLE workflows ADD COLUMN actor TEXT;
ALTER TABLE commands ADD COLUMN actor TEXT;
