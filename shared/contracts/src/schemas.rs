//! The JSON Schema of every message on the bus, each in its envelope, as
//! `proto/schemas/` holds them (a test fails when the checked-in copies
//! differ from these).

use schemars::schema_for;
use serde_json::Value;

use crate::attest::{
    AttestJoin, AttestRejoin, AttestReply, AttestResult, JoinGranted, ResultRecorded,
};
use crate::envelope::CloudEvent;
use crate::events::*;
use crate::work::ReconcileRequest;
use crate::{CommandEnvelope, CommandResult};

/// `(file name, schema)` of every message.
pub fn json_schemas() -> Vec<(&'static str, Value)> {
    fn s(v: schemars::schema::RootSchema) -> Value {
        serde_json::to_value(v).unwrap_or(Value::Null)
    }
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
            "node.provision.workflow.json",
            s(schema_for!(CloudEvent<NodeWorkflowStarted>)),
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
            "node.release.unverified.json",
            s(schema_for!(CloudEvent<NodeReleaseUnverified>)),
        ),
        (
            "node.tenant-root.lease.json",
            s(schema_for!(CloudEvent<NodeTenantRootLease>)),
        ),
        (
            "node.workflow.stalled.json",
            s(schema_for!(CloudEvent<WorkflowStalled>)),
        ),
        ("bulk.created.json", s(schema_for!(CloudEvent<BulkCreated>))),
        (
            "bulk.approved.json",
            s(schema_for!(CloudEvent<BulkApproved>)),
        ),
        (
            "bulk.progress.json",
            s(schema_for!(CloudEvent<BulkProgress>)),
        ),
        (
            "bulk.finished.json",
            s(schema_for!(CloudEvent<BulkFinished>)),
        ),
        (
            "workflow.json",
            s(schema_for!(CloudEvent<WorkflowFinished>)),
        ),
        (
            "workflow.step.json",
            s(schema_for!(CloudEvent<StepFinished>)),
        ),
        (
            "work.reconcile.json",
            s(schema_for!(CloudEvent<ReconcileRequest>)),
        ),
        (
            "cmd.command.json",
            s(schema_for!(CloudEvent<CommandEnvelope>)),
        ),
        (
            "result.command.json",
            s(schema_for!(CloudEvent<CommandResult>)),
        ),
        ("attest.join.request.json", s(schema_for!(AttestJoin))),
        (
            "attest.join.reply.json",
            s(schema_for!(AttestReply<JoinGranted>)),
        ),
        ("attest.rejoin.request.json", s(schema_for!(AttestRejoin))),
        (
            "attest.rejoin.reply.json",
            s(schema_for!(AttestReply<JoinGranted>)),
        ),
        ("attest.result.request.json", s(schema_for!(AttestResult))),
        (
            "attest.result.reply.json",
            s(schema_for!(AttestReply<ResultRecorded>)),
        ),
    ]
}

/// `(file name, schema)` of the BMC driver plugin protocol's messages
/// (`proto/plugin/`): what a driver plugin reads on standard input and
/// writes on standard output; not bus messages.
pub fn plugin_schemas() -> Vec<(&'static str, Value)> {
    fn s(v: schemars::schema::RootSchema) -> Value {
        serde_json::to_value(v).unwrap_or(Value::Null)
    }
    vec![
        ("request.json", s(schema_for!(crate::plugin::PluginRequest))),
        (
            "response.json",
            s(schema_for!(crate::plugin::PluginResponse)),
        ),
    ]
}
