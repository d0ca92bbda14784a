-- Dedicated-root leases: a whole machine leased to a tenant with root (a
-- deploy of a profile whose role is `dedicated`) and its teardown. A node
-- holds at most one open lease; a refused request is kept with its reason
-- (its node did not change).
CREATE TABLE tenant_root_leases (
    id              TEXT PRIMARY KEY,
    tenant_id       TEXT NOT NULL REFERENCES tenants (id),
    pool_id         TEXT NOT NULL REFERENCES pools (id),
    node_id         TEXT NOT NULL REFERENCES nodes (id),
    deploy_profile  TEXT NOT NULL,
    state           TEXT NOT NULL
        CHECK (state IN ('leased', 'bound', 'ending', 'ended', 'refused')),
    reason          TEXT,
    requested_by    TEXT,
    started_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    bound_at        TIMESTAMPTZ,
    ending_at       TIMESTAMPTZ,
    ended_at        TIMESTAMPTZ
);
CREATE UNIQUE INDEX tenant_root_leases_open ON tenant_root_leases (node_id)
    WHERE state IN ('leased', 'bound', 'ending');
CREATE INDEX tenant_root_leases_tenant ON tenant_root_leases (tenant_id, started_at);
CREATE INDEX tenant_root_leases_pool_open ON tenant_root_leases (pool_id)
    WHERE state IN ('leased', 'bound', 'ending');

-- Pool policy: how many dedicated-root leases the pool holds at once
-- (NULL: no limit; 0: none).
ALTER TABLE pools ADD COLUMN max_dedicated_leases INTEGER
    CHECK (max_dedicated_leases >= 0);
