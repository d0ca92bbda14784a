//! The closed set of messages on the bus, each with a type name, wrapped in
//! a CloudEvents 1.0 envelope. `proto/schemas/` is generated from these
//! types and CI fails when it drifts.

use bcm_core::{BmcDriver, NodeId, PoolId, ProvisionState, SiteId, TenantId};
use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The CloudEvents `source` of the control plane.
pub const SOURCE: &str = "/better-compute/metal";

/// A CloudEvents 1.0 envelope (structured JSON mode).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CloudEvent<T> {
    /// Always `1.0`.
    pub specversion: String,
    /// Unique per event; also the `Nats-Msg-Id` and the outbox row id.
    pub id: String,
    pub source: String,
    /// e.g. `node.provision.ready`.
    #[serde(rename = "type")]
    pub ty: String,
    /// The node id for node events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    pub time: DateTime<Utc>,
    pub datacontenttype: String,
    /// Extension: the node's version after the change, for ordering and
    /// dedupe by subscribers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodeversion: Option<i64>,
    pub data: T,
}

impl<T> CloudEvent<T> {
    /// Wraps `data` as an event of type `ty` about `subject`.
    pub fn new(
        id: String,
        ty: String,
        subject: Option<String>,
        nodeversion: Option<i64>,
        data: T,
    ) -> Self {
        Self {
            specversion: "1.0".to_owned(),
            id,
            source: SOURCE.to_owned(),
            ty,
            subject,
            time: Utc::now(),
            datacontenttype: "application/json".to_owned(),
            nodeversion,
            data,
        }
    }
}

/// `node.enrolled`: a node was created by `metal.enroll`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeEnrolled {
    pub node_id: NodeId,
    pub tenant_id: TenantId,
    pub pool_id: PoolId,
    pub site_id: SiteId,
    pub bmc_driver: BmcDriver,
    pub bmc_address: String,
    pub hardware_profile: String,
    pub version: i64,
}

/// `node.provision.<state>`: the node moved to `provisionState`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeProvisionChanged {
    pub node_id: NodeId,
    pub tenant_id: TenantId,
    pub pool_id: PoolId,
    pub site_id: SiteId,
    pub provision_state: ProvisionState,
    /// The state before the move; absent for the first state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_state: Option<ProvisionState>,
    /// The verb or internal move (`complete`, `fail`) that made it.
    #[serde(rename = "move")]
    pub move_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_from: Option<ProvisionState>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    pub maintenance: bool,
    pub version: i64,
}

/// `node.provision.unrescuing`: `metal.unrescue` started its workflow.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeUnrescuing {
    pub node_id: NodeId,
    pub tenant_id: TenantId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow_id: Option<String>,
    pub version: i64,
}

/// `node.power.requested`: `metal.power` queued a BMC power command.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodePowerRequested {
    pub node_id: NodeId,
    pub tenant_id: TenantId,
    pub action: bcm_core::PowerAction,
    pub command_id: String,
    pub version: i64,
}

/// `node.power.changed`: the power state a BMC reported differs from the
/// node's record (after `metal.power`, a workflow's power step, or drift
/// found by a power read).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodePowerChanged {
    pub node_id: NodeId,
    pub tenant_id: TenantId,
    pub power: bcm_core::PowerState,
    pub previous: bcm_core::PowerState,
    /// The command whose result reported it.
    pub command_id: String,
    pub version: i64,
}

/// How a BMC password rotation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum RotationOutcome {
    /// `metal.rotateCredentials` recorded the new password as pending and
    /// queued the command.
    Started,
    /// The BMC took the new password and it logs in: it is now the only one
    /// on record.
    Committed,
    /// The new password was not taken (or did not log in) and the current
    /// one still does: the pending one is forgotten.
    RolledBack,
    /// Neither password could be confirmed (the BMC did not answer): the
    /// record keeps both; the next rotation resumes with the same pending one.
    Unresolved,
}

/// `node.credentials.rotation`: a two-phase BMC password rotation moved on.
/// It never carries a password, sealed or not.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeCredentialsRotation {
    pub node_id: NodeId,
    pub tenant_id: TenantId,
    pub outcome: RotationOutcome,
    pub command_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub version: i64,
}

/// A reconcile request for the metal reconciler (`work.reconcile.<shard>.<nodeId>`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReconcileRequest {
    pub node_id: NodeId,
    /// The node version that asked; the reconciler re-reads the row anyway.
    pub version: i64,
    /// Why: the verb or event that asked.
    pub reason: String,
}

/// A command to a site service (`cmd.<siteId>.<kind>`), e.g. `bmc.power`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CommandEnvelope {
    /// The executors' dedupe key.
    pub command_id: String,
    pub kind: String,
    pub site_id: SiteId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_id: Option<NodeId>,
    pub params: serde_json::Value,
    pub issued_at: DateTime<Utc>,
}

/// The result of a command, from a site service (`result.<siteId>.<commandId>`)
/// or, signed, from an agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CommandResult {
    pub command_id: String,
    pub ok: bool,
    /// A failure the engine may retry (a timeout, a 503 from a BMC).
    #[serde(default)]
    pub retryable: bool,
    #[serde(default)]
    pub output: serde_json::Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `node.provision.workflow`: a state's workflow started.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeWorkflowStarted {
    pub node_id: NodeId,
    pub tenant_id: TenantId,
    pub workflow_id: String,
    pub profile_id: String,
    pub profile_version: u32,
    pub provision_state: ProvisionState,
    pub version: i64,
}

/// `workflow.<status>` and `workflow.step.<status>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkflowEvent {
    pub workflow_id: String,
    pub node_id: NodeId,
    pub tenant_id: TenantId,
    pub profile_id: String,
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Event type names.
pub mod types {
    use bcm_core::ProvisionState;

    /// `node.enrolled`.
    pub const NODE_ENROLLED: &str = "node.enrolled";
    /// `node.provision.unrescuing`.
    pub const NODE_UNRESCUING: &str = "node.provision.unrescuing";
    /// `node.power.requested`.
    pub const NODE_POWER_REQUESTED: &str = "node.power.requested";
    /// `node.power.changed`.
    pub const NODE_POWER_CHANGED: &str = "node.power.changed";
    /// `node.credentials.rotation`.
    pub const NODE_CREDENTIALS_ROTATION: &str = "node.credentials.rotation";

    /// The type of a reconcile request.
    pub const WORK_RECONCILE: &str = "work.reconcile";

    /// The type of a command of `kind`, e.g. `cmd.bmc.power`.
    pub fn command(kind: &str) -> String {
        format!("cmd.{kind}")
    }

    /// `node.provision.workflow`.
    pub const NODE_PROVISION_WORKFLOW: &str = "node.provision.workflow";

    /// `workflow.<status>`.
    pub fn workflow(status: &str) -> String {
        format!("workflow.{status}")
    }

    /// `workflow.step.<status>`.
    pub fn workflow_step(status: &str) -> String {
        format!("workflow.step.{status}")
    }

    /// The type of a command result.
    pub const COMMAND_RESULT: &str = "command.result";

    /// `node.provision.<state>`.
    pub fn node_provision(state: ProvisionState) -> String {
        format!("node.provision.{state}")
    }
}

/// An agent's join request (`POST /api/agent/join`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JoinRequest {
    /// The one-time join token from the kernel command line or user data.
    pub token: String,
    /// A PKCS#10 certificate signing request (PEM) for the agent's ed25519
    /// key, which never leaves the agent's memory.
    pub csr: String,
    /// The agent's role (`ramdisk` or `node`).
    pub role: String,
    /// For an adopt (`node` token of a pool): what the machine calls itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
}

/// The answer to a join.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JoinResponse {
    pub node_id: String,
    /// Bearer token of the agent's session.
    pub session_token: String,
    pub cert_serial: String,
    /// The node certificate (PEM) issued for the CSR's key.
    pub certificate: String,
    /// The CA certificate (PEM) that issued it.
    pub ca_certificate: String,
    /// ed25519 public keys (base64) whose signature on an image manifest
    /// the agent trusts.
    #[serde(default)]
    pub image_keys: Vec<String>,
}

/// A command handed to an agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentCommand {
    pub command_id: String,
    pub kind: String,
    pub params: serde_json::Value,
    /// When the control plane issued it; part of the signing input.
    pub issued_at: DateTime<Utc>,
}

/// A result an agent posts (`POST /api/agent/results`), signed over
/// `bcm_pki::signing_input` with its key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentResult {
    pub command_id: String,
    pub ok: bool,
    #[serde(default)]
    pub retryable: bool,
    #[serde(default)]
    pub output: serde_json::Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// When the agent finished; part of the signing input.
    pub finished_at: DateTime<Utc>,
    /// ed25519 signature, base64; absent when the agent cannot sign.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
}

/// `attest.join` (request/reply to the attestation service): an agent's
/// join, forwarded by the API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AttestJoin {
    pub join: JoinRequest,
}

/// `attest.result` (request/reply): a result from an authenticated agent
/// session, forwarded by the API; the attestation service records it and
/// verifies its signature against the stored command row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AttestResult {
    pub node_id: String,
    /// The serial of the session's certificate.
    pub cert_serial: String,
    pub result: AgentResult,
}

/// What the attestation service did with a result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ResultRecorded {
    /// False when the command already had a result (a repeat post).
    pub recorded: bool,
    /// The serial of the certificate the signature verified against;
    /// absent for an unsigned result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attested_by: Option<String>,
}

/// The reply of an attestation request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum AttestReply<T> {
    Ok(T),
    Err {
        code: bcm_core::ErrorCode,
        message: String,
    },
}

/// A heartbeat (`POST /api/agent/heartbeat`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Heartbeat {
    pub role: String,
}
