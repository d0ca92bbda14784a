-- A result wakes the step waiting on its command: find that step by index,
-- not by scanning every step ever run.
CREATE INDEX workflow_steps_command ON workflow_steps (command_id) WHERE command_id IS NOT NULL;
