-- Attestation: which certificate a node-signed result verified against
-- (set only by the attestation service), pool-scoped join tokens for the
-- adopt path, and the join purpose a certificate was issued for.
ALTER TABLE commands ADD COLUMN attested_by TEXT, ADD COLUMN attested_at TIMESTAMPTZ;
ALTER TABLE join_tokens ADD COLUMN pool_id TEXT REFERENCES pools (id);
ALTER TABLE node_certs ADD COLUMN purpose TEXT NOT NULL DEFAULT 'discovery';
-- A pool whose machines have no GPU accepts `diag.dcgm` answering
-- `unsupported` (never a fake pass) during commissioning.
ALTER TABLE pools ADD COLUMN accept_unsupported_diag BOOLEAN NOT NULL DEFAULT false;
