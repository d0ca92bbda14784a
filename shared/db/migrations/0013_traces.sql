-- One verb is one trace. A workflow keeps the W3C `traceparent` of the
-- reconciler pass that started it (itself a child of the verb's request), so
-- the engine's step spans continue the verb's trace; a command keeps the
-- `traceparent` of the step span that issued it, so an agent that polls it
-- (over HTTP, not the bus) continues the trace too. Site commands carry it in
-- their NATS headers.
ALTER TABLE workflows ADD COLUMN traceparent TEXT;
ALTER TABLE commands ADD COLUMN traceparent TEXT;
-- The trace of the verb that started what a node does now, kept with its
-- principal: a workflow that a periodic look (no message, so no trace of
-- its own) starts still continues the verb's trace.
ALTER TABLE node_actors ADD COLUMN traceparent TEXT;
