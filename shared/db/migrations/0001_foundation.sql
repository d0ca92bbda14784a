-- Foundation: tenants, sites, pools, nodes and their authorization
-- projection, sealed secrets, workflows, steps, commands, the outbox, node
-- certificates, join tokens and API tokens. Migrations are append-only.

CREATE TABLE tenants (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE sites (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE pools (
    id                TEXT PRIMARY KEY,
    tenant_id         TEXT NOT NULL REFERENCES tenants (id),
    site_id           TEXT NOT NULL REFERENCES sites (id),
    name              TEXT NOT NULL,
    hardware_profile  TEXT NOT NULL,
    agent_mode        TEXT NOT NULL CHECK (agent_mode IN ('bcd', 'none')),
    created_at        TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX pools_tenant ON pools (tenant_id);

-- Values sealed with AEAD; the plaintext never reaches Postgres.
CREATE TABLE sealed_secrets (
    id          TEXT PRIMARY KEY,
    owner       TEXT NOT NULL,
    purpose     TEXT NOT NULL,
    key_id      TEXT NOT NULL,
    nonce       BYTEA NOT NULL,
    ciphertext  BYTEA NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE nodes (
    id                 TEXT PRIMARY KEY,
    tenant_id          TEXT NOT NULL REFERENCES tenants (id),
    pool_id            TEXT NOT NULL REFERENCES pools (id),
    site_id            TEXT NOT NULL REFERENCES sites (id),
    provision_state    TEXT NOT NULL,
    failed_from        TEXT,
    last_error         TEXT,
    maintenance        BOOLEAN NOT NULL DEFAULT false,
    power              TEXT NOT NULL DEFAULT 'unknown',
    role               TEXT,
    bmc_driver         TEXT NOT NULL,
    bmc_address        TEXT NOT NULL,
    bmc_secret_id      TEXT REFERENCES sealed_secrets (id),
    macs               TEXT[] NOT NULL DEFAULT '{}',
    hardware_profile   TEXT NOT NULL,
    workflow_id        TEXT,
    deploy_profile     JSONB,
    release_wipe       TEXT,
    unrescue_pending   BOOLEAN NOT NULL DEFAULT false,
    version            BIGINT NOT NULL DEFAULT 1,
    created_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    CHECK ((failed_from IS NULL) = (provision_state <> 'failed'))
);
-- One node per BMC in a site, unless the node was retired.
CREATE UNIQUE INDEX nodes_site_bmc ON nodes (site_id, bmc_address) WHERE provision_state <> 'retired';
CREATE INDEX nodes_tenant_state ON nodes (tenant_id, provision_state, id);
CREATE INDEX nodes_pool ON nodes (pool_id, id);

-- The authorization projection: where a node sits, refreshed in the same
-- transaction as every change of the node.
CREATE TABLE node_placements (
    node_id     TEXT PRIMARY KEY REFERENCES nodes (id),
    tenant_id   TEXT NOT NULL,
    pool_id     TEXT NOT NULL,
    version     BIGINT NOT NULL
);

CREATE TABLE workflows (
    id                TEXT PRIMARY KEY,
    node_id           TEXT NOT NULL REFERENCES nodes (id),
    owner             TEXT NOT NULL,
    profile_id        TEXT NOT NULL,
    profile_version   INTEGER NOT NULL,
    for_state         TEXT NOT NULL,
    for_version       BIGINT NOT NULL,
    status            TEXT NOT NULL CHECK (status IN ('running', 'cancelling', 'succeeded', 'failed', 'cancelled')),
    error             TEXT,
    created_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
    finished_at       TIMESTAMPTZ
);
-- One workflow per node state entry: the reconciler can never start two.
CREATE UNIQUE INDEX workflows_once_per_entry ON workflows (node_id, for_state, for_version);

CREATE TABLE workflow_steps (
    workflow_id   TEXT NOT NULL REFERENCES workflows (id),
    idx           INTEGER NOT NULL,
    name          TEXT NOT NULL,
    target        TEXT NOT NULL CHECK (target IN ('control-plane', 'site', 'node', 'ramdisk')),
    cleanup       BOOLEAN NOT NULL DEFAULT false,
    status        TEXT NOT NULL,
    attempt       INTEGER NOT NULL DEFAULT 0,
    output        JSONB,
    error         TEXT,
    started_at    TIMESTAMPTZ,
    finished_at   TIMESTAMPTZ,
    PRIMARY KEY (workflow_id, idx)
);

CREATE TABLE commands (
    id                TEXT PRIMARY KEY,
    idempotency_key   TEXT NOT NULL UNIQUE,
    workflow_id       TEXT REFERENCES workflows (id),
    step_idx          INTEGER,
    attempt           INTEGER NOT NULL DEFAULT 1,
    node_id           TEXT REFERENCES nodes (id),
    site_id           TEXT REFERENCES sites (id),
    kind              TEXT NOT NULL,
    params            JSONB NOT NULL,
    status            TEXT NOT NULL CHECK (status IN ('pending', 'sent', 'succeeded', 'failed')),
    result            JSONB,
    signature         BYTEA,
    created_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
    sent_at           TIMESTAMPTZ,
    completed_at      TIMESTAMPTZ
);
CREATE INDEX commands_node ON commands (node_id, created_at);

-- Messages committed with the change that caused them; the relay publishes
-- them to JetStream with Nats-Msg-Id = id and marks them published.
CREATE TABLE outbox (
    seq           BIGSERIAL PRIMARY KEY,
    id            TEXT NOT NULL UNIQUE,
    subject       TEXT NOT NULL,
    payload       JSONB NOT NULL,
    headers       JSONB NOT NULL DEFAULT '{}',
    node_id       TEXT,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    published_at  TIMESTAMPTZ
);
CREATE INDEX outbox_unpublished ON outbox (seq) WHERE published_at IS NULL;

CREATE TABLE node_certs (
    serial       TEXT PRIMARY KEY,
    node_id      TEXT NOT NULL REFERENCES nodes (id),
    public_key   BYTEA NOT NULL,
    cert_pem     TEXT NOT NULL,
    not_before   TIMESTAMPTZ NOT NULL,
    not_after    TIMESTAMPTZ NOT NULL,
    revoked_at   TIMESTAMPTZ
);
CREATE INDEX node_certs_node ON node_certs (node_id);

CREATE TABLE join_tokens (
    id           TEXT PRIMARY KEY,
    token_hash   BYTEA NOT NULL UNIQUE,
    purpose      TEXT NOT NULL CHECK (purpose IN ('discovery', 'provisioned', 'node')),
    node_id      TEXT REFERENCES nodes (id),
    expires_at   TIMESTAMPTZ NOT NULL,
    used_at      TIMESTAMPTZ,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE api_tokens (
    id           TEXT PRIMARY KEY,
    token_hash   BYTEA NOT NULL UNIQUE,
    principal    TEXT NOT NULL,
    grants       JSONB NOT NULL,
    expires_at   TIMESTAMPTZ,
    revoked_at   TIMESTAMPTZ,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now()
);
