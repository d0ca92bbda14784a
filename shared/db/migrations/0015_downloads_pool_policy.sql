-- Files the API serves to machines (bcd for the installed OS): one row per
-- published name, platform and version, with the digest user data carries.
-- A published version is immutable: the same key with another digest is
-- refused. The latest registration of a platform is what user data names.
CREATE TABLE downloads (
    name           TEXT NOT NULL,
    os             TEXT NOT NULL,
    arch           TEXT NOT NULL,
    version        TEXT NOT NULL,
    sha256         TEXT NOT NULL CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    size_bytes     BIGINT NOT NULL CHECK (size_bytes > 0),
    registered_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (name, os, arch, version)
);

-- Pool policy: the deploy profiles a pool accepts (NULL: every profile of
-- its tenant) and a release's wipe when the request names none.
ALTER TABLE pools
    ADD COLUMN deploy_profiles TEXT[],
    ADD COLUMN release_wipe TEXT NOT NULL DEFAULT 'quick'
        CHECK (release_wipe IN ('quick', 'secure-erase', 'crypto-erase'));

-- Who published a deploy profile version (the API's principal; `seed` for
-- the configuration's).
ALTER TABLE deploy_profiles ADD COLUMN published_by TEXT;

-- The drivers a node's effective hardware profile bound, per concern, as
-- they were when it was enrolled (NULL: every concern is its BMC driver).
ALTER TABLE nodes ADD COLUMN drivers JSONB;
