-- Any answer can be lost; these let each exchange with an agent be retried.
-- A join token remembers the certificate it was spent on: the same agent key
-- retrying the same token soon after gets that identity back, not a refusal.
ALTER TABLE join_tokens ADD COLUMN used_by_cert TEXT REFERENCES node_certs (serial);
-- An agent's last sign of life: its latest request, or the end of the long
-- poll it holds open. A step waiting on a silent agent fails early.
ALTER TABLE agent_sessions ADD COLUMN alive_until TIMESTAMPTZ NOT NULL DEFAULT now();
-- A command handed to an agent is leased: offered again when the lease runs
-- out with no result (the poll's answer may never have arrived).
ALTER TABLE commands ADD COLUMN lease_until TIMESTAMPTZ;
-- When the reconciler reported a workflow stalled (a step overdue that the
-- engine has not looked at): reported once, not on every pass.
ALTER TABLE workflows ADD COLUMN stalled_reported_at TIMESTAMPTZ;
