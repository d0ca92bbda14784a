-- The destructive-batch quorum: approvers and their ed25519 keys, each
-- pool's quorum policy, batches (the header approvers sign, committed to
-- its node set by a Merkle root), each batch's nodes with their inclusion
-- proofs and bulk progress, and the approvals. A node names the batch its
-- current verb's chain runs under; a command, the batch it was sent under.

CREATE TABLE approvers (
    id          TEXT PRIMARY KEY,
    tenant_id   TEXT NOT NULL REFERENCES tenants (id),
    -- The principal (token name) who signs as this approver.
    principal   TEXT NOT NULL,
    -- ed25519, base64 of the 32 bytes.
    public_key  TEXT NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    revoked_at  TIMESTAMPTZ
);
CREATE INDEX approvers_tenant ON approvers (tenant_id);
-- One key, one approver: a key registered twice would sign twice.
CREATE UNIQUE INDEX approvers_key ON approvers (public_key) WHERE revoked_at IS NULL;

ALTER TABLE pools
    ADD COLUMN quorum_required INT NOT NULL DEFAULT 1 CHECK (quorum_required BETWEEN 1 AND 16),
    ADD COLUMN requester_may_approve BOOLEAN NOT NULL DEFAULT false,
    ADD COLUMN auto_approve_single BOOLEAN NOT NULL DEFAULT true,
    ADD COLUMN bulk_concurrency INT NOT NULL DEFAULT 200 CHECK (bulk_concurrency BETWEEN 1 AND 10000);

CREATE TABLE batches (
    id                     TEXT PRIMARY KEY,
    tenant_id              TEXT NOT NULL REFERENCES tenants (id),
    pool_id                TEXT NOT NULL REFERENCES pools (id),
    site_id                TEXT NOT NULL REFERENCES sites (id),
    -- 'node': one verb on one node; 'bulk': metal.bulk.
    scope                  TEXT NOT NULL CHECK (scope IN ('node', 'bulk')),
    operation              TEXT NOT NULL,
    wipe                   TEXT,
    reason                 TEXT NOT NULL,
    reason_sha256          TEXT NOT NULL,
    requested_by           TEXT NOT NULL,
    state                  TEXT NOT NULL CHECK (state IN ('awaiting-approval', 'approved', 'running', 'finished', 'expired', 'rejected', 'cancelled')),
    -- The policy as it was when the batch was made.
    quorum_required        INT NOT NULL,
    requester_may_approve  BOOLEAN NOT NULL,
    expires_at             TIMESTAMPTZ NOT NULL,
    root                   TEXT NOT NULL,
    leaf_count             INT NOT NULL CHECK (leaf_count >= 1),
    -- A one-leaf command (metal.power) held until the batch is approved:
    -- its outbox row, published by the approval that completes the quorum.
    held_message           JSONB,
    state_reason           TEXT,
    created_at             TIMESTAMPTZ NOT NULL DEFAULT now(),
    approved_at            TIMESTAMPTZ,
    finished_at            TIMESTAMPTZ
);
CREATE INDEX batches_open ON batches (state, id) WHERE state IN ('awaiting-approval', 'approved', 'running');
CREATE INDEX batches_tenant ON batches (tenant_id, id);

CREATE TABLE batch_nodes (
    batch_id     TEXT NOT NULL REFERENCES batches (id),
    node_id      TEXT NOT NULL,
    -- Its position in the request; the leaf index when admitted.
    position     INT NOT NULL,
    leaf_index   INT,
    -- The inclusion proof: sibling hashes, 64 hex characters each.
    proof        TEXT,
    state        TEXT NOT NULL CHECK (state IN ('queued', 'refused', 'started', 'succeeded', 'failed', 'cancelled')),
    code         TEXT,
    message      TEXT,
    started_at   TIMESTAMPTZ,
    finished_at  TIMESTAMPTZ,
    PRIMARY KEY (batch_id, node_id)
);
CREATE INDEX batch_nodes_state ON batch_nodes (batch_id, state, position);

CREATE TABLE batch_approvals (
    batch_id     TEXT NOT NULL REFERENCES batches (id),
    approver_id  TEXT NOT NULL,
    -- Who posted it (the approver's principal, or 'policy').
    principal    TEXT NOT NULL,
    signature    TEXT NOT NULL,
    approved_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (batch_id, approver_id)
);

ALTER TABLE nodes ADD COLUMN batch_id TEXT REFERENCES batches (id);
ALTER TABLE commands ADD COLUMN batch_id TEXT REFERENCES batches (id);
