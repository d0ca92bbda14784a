-- The workflow engine, the reconciler's shard leases and the agent
-- sessions of joined ramdisks and installed OSes.

ALTER TABLE workflows DROP CONSTRAINT workflows_status_check;
ALTER TABLE workflows ADD CONSTRAINT workflows_status_check
    CHECK (status IN ('running', 'failing-cleanup', 'cancelling-cleanup', 'succeeded', 'failed', 'cancelled'));
ALTER TABLE workflows
    ADD COLUMN definition JSONB NOT NULL DEFAULT '{}',
    ADD COLUMN cancel_requested BOOLEAN NOT NULL DEFAULT false,
    ADD COLUMN wipe_verified BOOLEAN NOT NULL DEFAULT false;
CREATE INDEX workflows_node ON workflows (node_id, created_at);

ALTER TABLE workflow_steps
    ADD COLUMN definition JSONB NOT NULL DEFAULT '{}',
    ADD COLUMN due_at TIMESTAMPTZ,
    ADD COLUMN deadline_at TIMESTAMPTZ,
    ADD COLUMN command_id TEXT;
ALTER TABLE workflow_steps DROP CONSTRAINT workflow_steps_target_check;
ALTER TABLE workflow_steps ADD CONSTRAINT workflow_steps_target_check
    CHECK (target IN ('control-plane', 'site', 'node', 'ramdisk'));
CREATE INDEX workflow_steps_due ON workflow_steps (due_at) WHERE due_at IS NOT NULL;

ALTER TABLE commands ADD COLUMN target TEXT NOT NULL DEFAULT 'site'
    CHECK (target IN ('control-plane', 'site', 'node', 'ramdisk'));
CREATE INDEX commands_ramdisk_pending ON commands (node_id) WHERE target = 'ramdisk' AND status IN ('pending', 'sent');

-- Which worker owns which shard of a kind of work, until when.
CREATE TABLE shard_leases (
    kind         TEXT NOT NULL,
    shard        INTEGER NOT NULL,
    holder       TEXT NOT NULL,
    expires_at   TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (kind, shard)
);

-- Workers alive per kind of work, for a fair share of shards.
CREATE TABLE workers (
    kind        TEXT NOT NULL,
    holder      TEXT NOT NULL,
    last_seen   TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (kind, holder)
);

-- A joined agent's bearer session (hash only), bound to a node and key.
CREATE TABLE agent_sessions (
    token_hash   BYTEA PRIMARY KEY,
    node_id      TEXT NOT NULL REFERENCES nodes (id),
    cert_serial  TEXT NOT NULL REFERENCES node_certs (serial),
    purpose      TEXT NOT NULL,
    expires_at   TIMESTAMPTZ NOT NULL,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- What a node's agent reported (inventory), newest per kind.
CREATE TABLE node_facts (
    node_id      TEXT NOT NULL REFERENCES nodes (id),
    kind         TEXT NOT NULL,
    data         JSONB NOT NULL,
    updated_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (node_id, kind)
);
