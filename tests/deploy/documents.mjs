// The published documents, checked by the formats' own tooling:
//  - proto/asyncapi.json by @asyncapi/parser (AsyncAPI's reference parser:
//    the document validates against the AsyncAPI schema and every $ref to
//    proto/schemas resolves);
//  - every example event of proto/examples/events.json by the CloudEvents
//    SDK (its compiled CloudEvents 1.0 JSON Schema and attribute rules).
// Usage: node documents.mjs <repo>
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Parser, fromFile } from '@asyncapi/parser';
import { CloudEvent } from 'cloudevents';

const repo = process.argv[2] ?? '.';
let failed = 0;

const parser = new Parser();
const { document, diagnostics } = await fromFile(parser, join(repo, 'proto/asyncapi.json')).parse();
for (const d of diagnostics.filter((d) => d.severity === 0)) {
  console.log(`asyncapi: ${d.code} at ${d.path.join('.')}: ${d.message}`);
  failed++;
}
if (!document) {
  console.log('asyncapi: the document did not parse');
  failed++;
} else {
  console.log(`asyncapi: valid ${document.version()}, ${document.channels().length} channels, ${document.allMessages().length} messages, every $ref resolved (the parser reports one that does not)`);
}

const events = JSON.parse(readFileSync(join(repo, 'proto/examples/events.json'), 'utf8'));
for (const e of events) {
  try {
    new CloudEvent(e, true);
  } catch (err) {
    console.log(`cloudevents: ${e.type} ${e.id}: ${err.message} ${JSON.stringify(err.errors ?? '')}`);
    failed++;
  }
}
console.log(`cloudevents: ${events.length} example events checked`);
process.exit(failed ? 1 : 0);
