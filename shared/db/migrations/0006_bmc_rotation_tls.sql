-- A node's own TLS policy for its Redfish BMC (CA, pinned fingerprint or
-- insecure; NULL: the bmc service's setting), and the pending half of a
-- two-phase password rotation: while `bmc_pending_secret_id` is set the
-- record holds both the current and the new password, and
-- `bmc_rotation_command_id` names the command carrying it out.
ALTER TABLE nodes ADD COLUMN bmc_tls JSONB;
ALTER TABLE nodes ADD COLUMN bmc_pending_secret_id TEXT REFERENCES sealed_secrets (id);
ALTER TABLE nodes ADD COLUMN bmc_rotation_command_id TEXT;
