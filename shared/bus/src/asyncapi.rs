//! The AsyncAPI 3 document of the subjects (`proto/asyncapi.json`). Every
//! channel's payload is one of `bcm_contracts::schemas::json_schemas`'s
//! files, so the document and the types cannot name different messages (a
//! test resolves every `$ref`).

use serde_json::{json, Value};

use crate::subjects::{StreamKind, Subjects};

/// One channel: its address, what it carries, its stream and its schema.
struct Channel {
    name: &'static str,
    address: &'static str,
    description: &'static str,
    stream: Option<StreamKind>,
    schema: &'static str,
}

const CHANNELS: &[Channel] = &[
    Channel { name: "nodeEnrolled", address: "events.{tenantId}.node.enrolled", description: "A node was enrolled.", stream: Some(StreamKind::Events), schema: "node.enrolled.json" },
    Channel { name: "nodeProvision", address: "events.{tenantId}.node.provision.{state}", description: "A node moved to a provision state; nodeversion orders them per node.", stream: Some(StreamKind::Events), schema: "node.provision.state.json" },
    Channel { name: "nodeWorkflow", address: "events.{tenantId}.node.provision.workflow", description: "A state's workflow started.", stream: Some(StreamKind::Events), schema: "node.provision.workflow.json" },
    Channel { name: "nodeUnrescuing", address: "events.{tenantId}.node.provision.unrescuing", description: "metal.unrescue started its workflow.", stream: Some(StreamKind::Events), schema: "node.provision.unrescuing.json" },
    Channel { name: "nodePowerRequested", address: "events.{tenantId}.node.power.requested", description: "metal.power queued a BMC command.", stream: Some(StreamKind::Events), schema: "node.power.requested.json" },
    Channel { name: "nodePowerChanged", address: "events.{tenantId}.node.power.changed", description: "A BMC reported a power state that differs from the node's record.", stream: Some(StreamKind::Events), schema: "node.power.changed.json" },
    Channel { name: "nodeCredentialsRotation", address: "events.{tenantId}.node.credentials.rotation", description: "A two-phase BMC password rotation started, committed, rolled back or was left unresolved; never carries a password.", stream: Some(StreamKind::Events), schema: "node.credentials.rotation.json" },
    Channel { name: "nodeReleaseUnverified", address: "events.{tenantId}.node.release.unverified", description: "An agentless pool's release ended without an attested erase; the pool's policy sent the node to ready or failed.", stream: Some(StreamKind::Events), schema: "node.release.unverified.json" },
    Channel { name: "nodeTenantRootLease", address: "events.{tenantId}.node.tenant-root.{state}", description: "A dedicated-root lease was leased (a dedicated deploy admitted), bound (the tenant's OS runs), ending (its teardown started) or refused (with the reason); only on its tenant's subject.", stream: Some(StreamKind::Events), schema: "node.tenant-root.lease.json" },
    Channel { name: "nodeWorkflowStalled", address: "events.{tenantId}.node.workflow.stalled", description: "A node's workflow has a step the engine should have looked at long ago and has not: the node is stranded until someone acts (reported once per workflow by the reconciler).", stream: Some(StreamKind::Events), schema: "node.workflow.stalled.json" },
    Channel { name: "bulkCreated", address: "events.{tenantId}.bulk.created", description: "metal.bulk admitted a request: the batch digest approvers sign, and how many nodes were admitted and refused.", stream: Some(StreamKind::Events), schema: "bulk.created.json" },
    Channel { name: "bulkApproved", address: "events.{tenantId}.bulk.approved", description: "A bulk's batch has its quorum of approvers; its nodes start in waves.", stream: Some(StreamKind::Events), schema: "bulk.approved.json" },
    Channel { name: "bulkProgress", address: "events.{tenantId}.bulk.progress", description: "A bulk's counts per node state, after a wave started or nodes finished.", stream: Some(StreamKind::Events), schema: "bulk.progress.json" },
    Channel { name: "bulkFinished", address: "events.{tenantId}.bulk.finished", description: "A bulk ended: every node done with, or the batch cancelled, rejected or expired.", stream: Some(StreamKind::Events), schema: "bulk.finished.json" },
    Channel { name: "workflow", address: "events.{tenantId}.workflow.{status}", description: "A workflow ended (succeeded, failed, cancelled).", stream: Some(StreamKind::Events), schema: "workflow.json" },
    Channel { name: "workflowStep", address: "events.{tenantId}.workflow.step.{status}", description: "A workflow step ended (succeeded, failed, or skipped: an optional step that failed for good, or one skipped with it).", stream: Some(StreamKind::Events), schema: "workflow.step.json" },
    Channel { name: "reconcile", address: "work.reconcile.{shard}.{nodeId}", description: "Reconcile requests, sharded by FNV-1a(nodeId) mod shards; work-queue retention.", stream: Some(StreamKind::Work), schema: "work.reconcile.json" },
    Channel { name: "command", address: "cmd.{siteId}.{kind}", description: "Commands to a site's services (bmc.*, site.*); executors dedupe by commandId.", stream: Some(StreamKind::Commands), schema: "cmd.command.json" },
    Channel { name: "commandResult", address: "result.{siteId}.{commandId}", description: "Results of site commands; Nats-Msg-Id is result-{commandId}.", stream: Some(StreamKind::Results), schema: "result.command.json" },
];

/// The AsyncAPI 3 document of the subjects.
pub fn asyncapi() -> Value {
    let subjects = Subjects::new(None, 16);
    let mut channels = serde_json::Map::new();
    for c in CHANNELS {
        let mut ch = json!({
            "address": c.address,
            "description": c.description,
            "messages": { "message": { "payload": { "$ref": format!("./schemas/{}", c.schema) } } }
        });
        if let Some(k) = c.stream {
            ch["x-jetstream-stream"] = json!(subjects.stream(k));
        }
        channels.insert(c.name.to_owned(), ch);
    }
    channels.insert(
        "deadLetter".to_owned(),
        json!({
            "address": "dlq.{consumer}",
            "description": "Messages a durable consumer could not decode, or could not handle by its last delivery, byte for byte as they arrived; the headers say why.",
            "x-jetstream-stream": subjects.stream(StreamKind::DeadLetter),
            "messages": { "message": {
                "payload": { "description": "The original payload, unchanged (it may not be JSON)." },
                "headers": {
                    "type": "object",
                    "required": [crate::consumer::DLQ_CONSUMER, crate::consumer::DLQ_SUBJECT, crate::consumer::DLQ_SEQUENCE, crate::consumer::DLQ_DELIVERIES, crate::consumer::DLQ_REASON],
                    "properties": {
                        crate::consumer::DLQ_CONSUMER: { "type": "string", "description": "The durable consumer that gave up on it." },
                        crate::consumer::DLQ_SUBJECT: { "type": "string", "description": "The subject it was published on." },
                        crate::consumer::DLQ_SEQUENCE: { "type": "string", "description": "Its sequence in the original stream." },
                        crate::consumer::DLQ_DELIVERIES: { "type": "string", "description": "How often it was delivered." },
                        crate::consumer::DLQ_REASON: { "type": "string", "description": "Why: the decode error, or the handler's last error." }
                    }
                }
            } }
        }),
    );
    for (name, address, description, request, reply) in [
        ("attestJoin", "attest.join", "Request/reply (core NATS, queue group attestation): an agent's join forwarded by the API; the reply carries the node certificate or an error code.", "attest.join.request.json", "attest.join.reply.json"),
        ("attestRejoin", "attest.rejoin", "Request/reply (core NATS, queue group attestation): an installed OS's agent rejoining with the identity it kept (a signature of a certificate in force, no token), forwarded by the API; with a CSR it renews the certificate; the reply carries the certificate or an error code.", "attest.rejoin.request.json", "attest.rejoin.reply.json"),
        ("attestResult", "attest.result", "Request/reply (core NATS, queue group attestation): an agent's result forwarded by the API; recorded only if its signature verifies against the stored command row.", "attest.result.request.json", "attest.result.reply.json"),
    ] {
        channels.insert(
            name.to_owned(),
            json!({
                "address": address,
                "description": description,
                "messages": {
                    "request": { "payload": { "$ref": format!("./schemas/{request}") } },
                    "reply": { "payload": { "$ref": format!("./schemas/{reply}") } }
                }
            }),
        );
    }
    json!({
        "asyncapi": "3.0.0",
        "info": {
            "title": "Better Compute Metal bus",
            "version": "0.2.0",
            "description": "Subjects on NATS JetStream. Every message is a CloudEvents 1.0 JSON envelope; publishers set Nats-Msg-Id to the event id and traceparent (W3C) in the headers. A deployment may prefix every subject with a namespace token. Delivery to durable consumers is at-least-once: dedupe by the event id."
        },
        "defaultContentType": "application/cloudevents+json",
        "channels": Value::Object(channels)
    })
}

/// Every schema file the document refers to.
pub fn referenced_schemas() -> Vec<String> {
    fn walk(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                for (k, v) in m {
                    match (k.as_str(), v) {
                        ("$ref", Value::String(r)) => {
                            out.push(r.trim_start_matches("./schemas/").to_owned())
                        }
                        _ => walk(v, out),
                    }
                }
            }
            Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = vec![];
    walk(&asyncapi(), &mut out);
    out.sort();
    out.dedup();
    out
}
