//! Generated contracts: JSON Schemas of every message and the AsyncAPI
//! document naming the subjects. `proto/` holds the checked-in copies.

use schemars::schema_for;
use serde_json::{json, Value};

use crate::messages::*;
use crate::subjects::{StreamKind, Subjects};

/// `(file name, schema)` of every message, each in its envelope.
pub fn json_schemas() -> Vec<(&'static str, Value)> {
    let s = |v: schemars::schema::RootSchema| serde_json::to_value(v).unwrap_or(Value::Null);
    vec![
        (
            "node.enrolled.json",
            s(schema_for!(CloudEvent<NodeEnrolled>)),
        ),
        (
            "node.provision.state.json",
            s(schema_for!(CloudEvent<NodeProvisionChanged>)),
        ),
        (
            "node.provision.unrescuing.json",
            s(schema_for!(CloudEvent<NodeUnrescuing>)),
        ),
        (
            "node.power.requested.json",
            s(schema_for!(CloudEvent<NodePowerRequested>)),
        ),
        (
            "node.power.changed.json",
            s(schema_for!(CloudEvent<NodePowerChanged>)),
        ),
        (
            "node.credentials.rotation.json",
            s(schema_for!(CloudEvent<NodeCredentialsRotation>)),
        ),
        (
            "work.reconcile.json",
            s(schema_for!(CloudEvent<ReconcileRequest>)),
        ),
        (
            "cmd.command.json",
            s(schema_for!(CloudEvent<CommandEnvelope>)),
        ),
        ("attest.join.request.json", s(schema_for!(AttestJoin))),
        (
            "attest.join.reply.json",
            s(schema_for!(AttestReply<JoinResponse>)),
        ),
        ("attest.result.request.json", s(schema_for!(AttestResult))),
        (
            "attest.result.reply.json",
            s(schema_for!(AttestReply<ResultRecorded>)),
        ),
    ]
}

/// The AsyncAPI 3 document of the subjects.
pub fn asyncapi() -> Value {
    let subjects = Subjects::new(None, 16);
    let stream = |k| subjects.stream(k);
    let channel = |address: &str, description: &str, schema: &str, stream_name: String| {
        json!({
            "address": address,
            "description": description,
            "x-jetstream-stream": stream_name,
            "messages": { "message": { "payload": { "$ref": format!("./schemas/{schema}") } } }
        })
    };
    json!({
        "asyncapi": "3.0.0",
        "info": {
            "title": "Better Compute Metal bus",
            "version": "0.1.0",
            "description": "Subjects on NATS JetStream. Every message is a CloudEvents 1.0 JSON envelope; publishers set Nats-Msg-Id to the event id and traceparent (W3C) in the headers. A deployment may prefix every subject with a namespace token."
        },
        "defaultContentType": "application/cloudevents+json",
        "channels": {
            "nodeEnrolled": channel("events.{tenantId}.node.enrolled", "A node was enrolled.", "node.enrolled.json", stream(StreamKind::Events)),
            "nodeProvision": channel("events.{tenantId}.node.provision.{state}", "A node moved to a provision state; nodeversion orders them per node.", "node.provision.state.json", stream(StreamKind::Events)),
            "nodeUnrescuing": channel("events.{tenantId}.node.provision.unrescuing", "metal.unrescue started its workflow.", "node.provision.unrescuing.json", stream(StreamKind::Events)),
            "nodePowerRequested": channel("events.{tenantId}.node.power.requested", "metal.power queued a BMC command.", "node.power.requested.json", stream(StreamKind::Events)),
            "nodePowerChanged": channel("events.{tenantId}.node.power.changed", "A BMC reported a power state that differs from the node's record.", "node.power.changed.json", stream(StreamKind::Events)),
            "nodeCredentialsRotation": channel("events.{tenantId}.node.credentials.rotation", "A two-phase BMC password rotation started, committed, rolled back or was left unresolved; never carries a password.", "node.credentials.rotation.json", stream(StreamKind::Events)),
            "reconcile": channel("work.reconcile.{shard}.{nodeId}", "Reconcile requests, sharded by FNV-1a(nodeId) mod shards; work-queue retention.", "work.reconcile.json", stream(StreamKind::Work)),
            "command": channel("cmd.{siteId}.{kind}", "Commands to a site's services (bmc.*, site.*); executors dedupe by commandId.", "cmd.command.json", stream(StreamKind::Commands)),
            "commandResult": channel("result.{siteId}.{commandId}", "Results of site commands; Nats-Msg-Id is the command id.", "result.command.json", stream(StreamKind::Results)),
            "nodeWorkflow": channel("events.{tenantId}.node.provision.workflow", "A state's workflow started.", "node.provision.workflow.json", stream(StreamKind::Events)),
            "attestJoin": {
                "address": "attest.join",
                "description": "Request/reply (core NATS, queue group attestation): an agent's join forwarded by the API; the reply carries the node certificate or an error code.",
                "messages": {
                    "request": { "payload": { "$ref": "./schemas/attest.join.request.json" } },
                    "reply": { "payload": { "$ref": "./schemas/attest.join.reply.json" } }
                }
            },
            "attestResult": {
                "address": "attest.result",
                "description": "Request/reply (core NATS, queue group attestation): an agent's result forwarded by the API; recorded only if its signature verifies against the stored command row.",
                "messages": {
                    "request": { "payload": { "$ref": "./schemas/attest.result.request.json" } },
                    "reply": { "payload": { "$ref": "./schemas/attest.result.reply.json" } }
                }
            },
            "workflow": channel("events.{tenantId}.workflow.{status}", "A workflow ended (succeeded, failed, cancelled); workflow.step.{status} for each step.", "workflow.json", stream(StreamKind::Events))
        }
    })
}
