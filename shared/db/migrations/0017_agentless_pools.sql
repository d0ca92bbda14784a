-- Agentless pools (agent_mode 'none'): what a release that ended without
-- an attested erase comes to ('failed' holds the node for an operator with
-- UNVERIFIED_WIPE; 'ready' returns it). Either way the release publishes
-- node.release.unverified.
ALTER TABLE pools
    ADD COLUMN unattested_release TEXT NOT NULL DEFAULT 'failed'
        CHECK (unattested_release IN ('failed', 'ready'));

-- An agentless deploy's installer ISO may be a catalog image.
ALTER TABLE images DROP CONSTRAINT images_format_check;
ALTER TABLE images ADD CONSTRAINT images_format_check
    CHECK (format IN ('raw', 'qcow2', 'iso'));
