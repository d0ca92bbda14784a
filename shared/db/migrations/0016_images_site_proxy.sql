-- The image catalog: a tenant's images by name, each with where it is
-- fetched from, its format, digest, size and publisher signature. A
-- registered name is immutable: the same name with other content is
-- refused (a new image is a new name).
CREATE TABLE images (
    tenant_id      TEXT NOT NULL REFERENCES tenants (id),
    name           TEXT NOT NULL,
    url            TEXT NOT NULL,
    format         TEXT NOT NULL CHECK (format IN ('raw', 'qcow2')),
    sha256         TEXT NOT NULL CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    size_bytes     BIGINT NOT NULL CHECK (size_bytes > 0),
    signature      TEXT,
    registered_by  TEXT NOT NULL,
    registered_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, name)
);

-- The site's upstream HTTP proxy (`http://host:port`): `site.httpProxy`
-- fetches catalog images through it. NULL: the site goes direct. Who set
-- it last is kept beside it.
ALTER TABLE sites ADD COLUMN http_proxy TEXT, ADD COLUMN http_proxy_set_by TEXT;

-- A site's own commands (no node), newest first per kind: the image
-- cache's state per site is read from them.
CREATE INDEX commands_site_kind ON commands (site_id, kind, created_at DESC)
    WHERE node_id IS NULL;

-- Commissioning's wipe: the pool's policy (quick unless it says more).
ALTER TABLE pools
    ADD COLUMN commission_wipe TEXT NOT NULL DEFAULT 'quick'
        CHECK (commission_wipe IN ('quick', 'secure-erase', 'crypto-erase'));

-- Adoption's acceptance checks: the least an adopted machine must have
-- (bcm_core's AdoptAcceptance as JSON; NULL: any machine whose agent joined).
ALTER TABLE pools ADD COLUMN adopt_acceptance JSONB;

-- A BMC address is unique within a site among live nodes that have a BMC:
-- adopted machines have none (an empty address), and a site holds many.
DROP INDEX nodes_site_bmc;
CREATE UNIQUE INDEX nodes_site_bmc ON nodes (site_id, bmc_address)
    WHERE provision_state <> 'retired' AND bmc_driver <> 'none';
