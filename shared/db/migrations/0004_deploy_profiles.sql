-- The tenant deploy profile catalog. A version is immutable: a changed
-- image or template is a new version. `definition` is bcm_core's
-- DeployProfile as JSON, validated before it is stored.
CREATE TABLE deploy_profiles (
    tenant_id    TEXT NOT NULL REFERENCES tenants (id),
    id           TEXT NOT NULL,
    version      INTEGER NOT NULL CHECK (version >= 1),
    definition   JSONB NOT NULL,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, id, version)
);
