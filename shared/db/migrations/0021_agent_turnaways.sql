-- When the API last turned an agent's request away unheard (its agent
-- pool exhausted: a 503 before the session could be touched). One row.
-- The engine counts an agent as heard until then, so the control plane's
-- own overload never makes a live agent look silent.
CREATE TABLE agent_turnaways (
    id  SMALLINT PRIMARY KEY CHECK (id = 1),
    at  TIMESTAMPTZ NOT NULL
);
