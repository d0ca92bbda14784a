//! The payload of every event the control plane publishes (on
//! `events.<tenantId>.<type>`), each with its type name, and [`Event`], the
//! closed set a subscriber decodes an envelope into.

use bcm_core::workflow::{StepStatus, WorkflowPhase};
use bcm_core::{
    BmcDriver, NodeId, PoolId, PowerAction, PowerState, ProvisionState, SiteId, TenantId,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::envelope::CloudEvent;
use crate::ContractError;

/// Event type names.
pub mod types {
    use bcm_core::workflow::{StepStatus, WorkflowPhase};
    use bcm_core::ProvisionState;

    /// `node.enrolled`.
    pub const NODE_ENROLLED: &str = "node.enrolled";
    /// The prefix of `node.provision.<state>`.
    pub const NODE_PROVISION_PREFIX: &str = "node.provision.";
    /// `node.provision.workflow`.
    pub const NODE_PROVISION_WORKFLOW: &str = "node.provision.workflow";
    /// `node.provision.unrescuing`.
    pub const NODE_UNRESCUING: &str = "node.provision.unrescuing";
    /// `node.power.requested`.
    pub const NODE_POWER_REQUESTED: &str = "node.power.requested";
    /// `node.power.changed`.
    pub const NODE_POWER_CHANGED: &str = "node.power.changed";
    /// `node.credentials.rotation`.
    pub const NODE_CREDENTIALS_ROTATION: &str = "node.credentials.rotation";
    /// `node.release.unverified`.
    pub const NODE_RELEASE_UNVERIFIED: &str = "node.release.unverified";
    /// The prefix of `node.tenant-root.<state>` (`leased`, `bound`,
    /// `ending`, `refused`).
    pub const NODE_TENANT_ROOT_PREFIX: &str = "node.tenant-root.";
    /// `node.workflow.stalled`.
    pub const NODE_WORKFLOW_STALLED: &str = "node.workflow.stalled";
    /// `bulk.created`.
    pub const BULK_CREATED: &str = "bulk.created";
    /// `bulk.approved`.
    pub const BULK_APPROVED: &str = "bulk.approved";
    /// `bulk.progress`.
    pub const BULK_PROGRESS: &str = "bulk.progress";
    /// `bulk.finished`.
    pub const BULK_FINISHED: &str = "bulk.finished";
    /// The prefix of `workflow.<status>`.
    pub const WORKFLOW_PREFIX: &str = "workflow.";
    /// The prefix of `workflow.step.<status>`.
    pub const WORKFLOW_STEP_PREFIX: &str = "workflow.step.";
    /// The type of a reconcile request.
    pub const WORK_RECONCILE: &str = "work.reconcile";
    /// The type of a command result.
    pub const COMMAND_RESULT: &str = "command.result";

    /// `node.provision.<state>`.
    pub fn node_provision(state: ProvisionState) -> String {
        format!("{NODE_PROVISION_PREFIX}{state}")
    }

    /// `workflow.<status>` of a finished workflow.
    pub fn workflow(status: WorkflowPhase) -> String {
        format!("{WORKFLOW_PREFIX}{}", status.as_str())
    }

    /// `workflow.step.<status>` of a finished step.
    pub fn workflow_step(status: StepStatus) -> String {
        format!("{WORKFLOW_STEP_PREFIX}{}", status.as_str())
    }

    /// The type of a command of `kind`, e.g. `cmd.bmc.power`.
    pub fn command(kind: crate::CommandKind) -> String {
        format!("cmd.{kind}")
    }
}

/// An event's payload, which knows its type name: the name is never
/// written apart from the data it names.
pub trait EventData: Serialize {
    /// The CloudEvents `type`, e.g. `node.provision.ready`.
    fn event_type(&self) -> String;
}

macro_rules! event_types {
    ($($t:ty => $name:expr),+ $(,)?) => {$(
        impl EventData for $t {
            fn event_type(&self) -> String {
                let name: &dyn Fn(&$t) -> String = &$name;
                name(self)
            }
        }
    )+};
}

event_types! {
    NodeEnrolled => |_| types::NODE_ENROLLED.to_owned(),
    NodeProvisionChanged => |e| types::node_provision(e.provision_state),
    NodeWorkflowStarted => |_| types::NODE_PROVISION_WORKFLOW.to_owned(),
    NodeUnrescuing => |_| types::NODE_UNRESCUING.to_owned(),
    NodePowerRequested => |_| types::NODE_POWER_REQUESTED.to_owned(),
    NodePowerChanged => |_| types::NODE_POWER_CHANGED.to_owned(),
    NodeCredentialsRotation => |_| types::NODE_CREDENTIALS_ROTATION.to_owned(),
    NodeReleaseUnverified => |_| types::NODE_RELEASE_UNVERIFIED.to_owned(),
    NodeTenantRootLease => |e| format!("{}{}", types::NODE_TENANT_ROOT_PREFIX, e.state),
    WorkflowStalled => |_| types::NODE_WORKFLOW_STALLED.to_owned(),
    WorkflowFinished => |e| types::workflow(e.status),
    StepFinished => |e| types::workflow_step(e.status),
    BulkCreated => |_| types::BULK_CREATED.to_owned(),
    BulkApproved => |_| types::BULK_APPROVED.to_owned(),
    BulkProgress => |_| types::BULK_PROGRESS.to_owned(),
    BulkFinished => |_| types::BULK_FINISHED.to_owned(),
}

/// `node.enrolled`: a node was created by `metal.enroll` (or an adopt join).
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
    /// The principal whose verb made the move (an API token's principal
    /// name, `admin` for the bootstrap admin); absent for the control
    /// plane's own moves (`complete`, `fail`, …) and for an adoption (the
    /// machine's agent joined with a pool's token).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actor: Option<String>,
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
    pub action: PowerAction,
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
    pub power: PowerState,
    pub previous: PowerState,
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

/// `node.release.unverified`: an agentless pool's release ended without an
/// attested erase (the BMC offers none, or its erase did not cover every
/// recorded drive); the pool's policy sent the node to `outcome` (`ready`,
/// or `failed` with `UNVERIFIED_WIPE`). Published in the transaction of
/// that move, exactly once per such release.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeReleaseUnverified {
    pub node_id: NodeId,
    pub tenant_id: TenantId,
    pub pool_id: PoolId,
    pub workflow_id: String,
    /// Why the erase attests nothing, e.g. `the BMC offers no drive erase`.
    pub reason: String,
    pub outcome: ProvisionState,
    pub version: i64,
}

/// `node.tenant-root.<state>`: a dedicated-root lease moved on —
/// `leased` (a dedicated deploy was admitted), `bound` (the tenant's OS
/// runs on the node), `ending` (its teardown started), or `refused` (the
/// pool's policy or capacity said no; `reason` says why, and the node did
/// not change). Published on the tenant's subject only: another tenant
/// never sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeTenantRootLease {
    pub lease_id: String,
    pub node_id: NodeId,
    pub tenant_id: TenantId,
    pub pool_id: PoolId,
    pub state: bcm_core::dedicated::LeaseState,
    /// The deploy profile the lease is for, `id@version`.
    pub deploy_profile: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub version: i64,
}

/// `workflow.<status>`: a workflow ended (`succeeded`, `failed` or
/// `cancelled`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkflowFinished {
    pub workflow_id: String,
    pub node_id: NodeId,
    pub tenant_id: TenantId,
    pub profile_id: String,
    pub status: WorkflowPhase,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `workflow.step.<status>`: a step ended (`succeeded` or `failed`; or
/// `skipped`: an optional step that failed for good, `error` saying why,
/// or one skipped with it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StepFinished {
    pub workflow_id: String,
    pub node_id: NodeId,
    pub tenant_id: TenantId,
    pub profile_id: String,
    pub step: String,
    pub attempt: i32,
    pub status: StepStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `node.workflow.stalled`: a node's workflow has a step the engine should
/// have looked at more than the reconciler's `stall_grace_secs` ago and has
/// not (no engine running, or one stuck): the node is stranded until
/// someone acts. Reported once per workflow.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkflowStalled {
    pub workflow_id: String,
    pub node_id: NodeId,
    pub tenant_id: TenantId,
    pub profile_id: String,
    /// The overdue step.
    pub step: String,
    pub step_status: StepStatus,
    /// How long past due the step was when seen.
    pub overdue_secs: i64,
}

/// How many of a bulk's nodes are where.
#[derive(
    Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema,
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BulkCounts {
    pub queued: u64,
    pub refused: u64,
    pub started: u64,
    pub succeeded: u64,
    pub failed: u64,
    pub cancelled: u64,
}

/// `bulk.created`: `metal.bulk` admitted a request; its batch awaits
/// approval (or was approved by policy).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BulkCreated {
    pub batch_id: String,
    pub tenant_id: TenantId,
    pub pool_id: PoolId,
    pub operation: bcm_core::batch::Operation,
    /// The batch digest approvers sign (hex).
    pub digest: String,
    pub reason: String,
    pub requested_by: String,
    /// Nodes admitted (the batch's leaves) and refused at admission.
    pub admitted: u64,
    pub refused: u64,
    pub quorum_required: u32,
    pub expires_at: chrono::DateTime<chrono::Utc>,
}

/// `bulk.approved`: the batch has its quorum; its nodes start in waves.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BulkApproved {
    pub batch_id: String,
    pub tenant_id: TenantId,
    /// The approvers whose signatures made the quorum.
    pub approvers: Vec<String>,
}

/// `bulk.progress`: counts after a wave started or nodes finished.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BulkProgress {
    pub batch_id: String,
    pub tenant_id: TenantId,
    pub counts: BulkCounts,
}

/// `bulk.finished`: every node is done with, or the batch ended
/// (`finished`, `cancelled`, `expired`, `rejected`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BulkFinished {
    pub batch_id: String,
    pub tenant_id: TenantId,
    pub state: bcm_core::batch::BatchState,
    pub counts: BulkCounts,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Every event, decoded by its type.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    NodeEnrolled(NodeEnrolled),
    NodeProvision(NodeProvisionChanged),
    NodeWorkflow(NodeWorkflowStarted),
    NodeUnrescuing(NodeUnrescuing),
    NodePowerRequested(NodePowerRequested),
    NodePowerChanged(NodePowerChanged),
    NodeCredentialsRotation(NodeCredentialsRotation),
    NodeReleaseUnverified(NodeReleaseUnverified),
    NodeTenantRootLease(NodeTenantRootLease),
    WorkflowStalled(WorkflowStalled),
    Workflow(WorkflowFinished),
    Step(StepFinished),
    BulkCreated(BulkCreated),
    BulkApproved(BulkApproved),
    BulkProgress(BulkProgress),
    BulkFinished(BulkFinished),
}

impl Event {
    /// Decodes an envelope's data by its type; an unknown type or a payload
    /// that is not its type's is an error.
    pub fn decode(ev: &CloudEvent<serde_json::Value>) -> Result<Event, ContractError> {
        fn data<T: serde::de::DeserializeOwned>(
            ev: &CloudEvent<serde_json::Value>,
        ) -> Result<T, ContractError> {
            serde_json::from_value(ev.data.clone()).map_err(|e| ContractError::Undecodable {
                what: "event data",
                why: format!("{}: {e}", ev.ty),
            })
        }
        use types::*;
        let ty = ev.ty.as_str();
        Ok(match ty {
            NODE_ENROLLED => Event::NodeEnrolled(data(ev)?),
            NODE_PROVISION_WORKFLOW => Event::NodeWorkflow(data(ev)?),
            NODE_UNRESCUING => Event::NodeUnrescuing(data(ev)?),
            NODE_POWER_REQUESTED => Event::NodePowerRequested(data(ev)?),
            NODE_POWER_CHANGED => Event::NodePowerChanged(data(ev)?),
            NODE_CREDENTIALS_ROTATION => Event::NodeCredentialsRotation(data(ev)?),
            NODE_RELEASE_UNVERIFIED => Event::NodeReleaseUnverified(data(ev)?),
            NODE_WORKFLOW_STALLED => Event::WorkflowStalled(data(ev)?),
            BULK_CREATED => Event::BulkCreated(data(ev)?),
            BULK_APPROVED => Event::BulkApproved(data(ev)?),
            BULK_PROGRESS => Event::BulkProgress(data(ev)?),
            BULK_FINISHED => Event::BulkFinished(data(ev)?),
            _ if ty.starts_with(NODE_TENANT_ROOT_PREFIX) => {
                let lease: NodeTenantRootLease = data(ev)?;
                if ty != format!("{NODE_TENANT_ROOT_PREFIX}{}", lease.state) {
                    return Err(ContractError::Undecodable {
                        what: "event",
                        why: format!("{ty} carries lease state {}", lease.state),
                    });
                }
                Event::NodeTenantRootLease(lease)
            }
            _ if ty.starts_with(WORKFLOW_STEP_PREFIX) => Event::Step(data(ev)?),
            _ if ty.starts_with(WORKFLOW_PREFIX) => Event::Workflow(data(ev)?),
            _ if ty.starts_with(NODE_PROVISION_PREFIX) => {
                let changed: NodeProvisionChanged = data(ev)?;
                if ty != types::node_provision(changed.provision_state) {
                    return Err(ContractError::Undecodable {
                        what: "event",
                        why: format!("{ty} carries state {}", changed.provision_state),
                    });
                }
                Event::NodeProvision(changed)
            }
            other => {
                return Err(ContractError::Undecodable {
                    what: "event",
                    why: format!("unknown event type {other:?}"),
                })
            }
        })
    }

    /// The node the event is about (none for a `bulk.*` event).
    pub fn node_id(&self) -> Option<NodeId> {
        Some(match self {
            Event::NodeEnrolled(e) => e.node_id,
            Event::NodeProvision(e) => e.node_id,
            Event::NodeWorkflow(e) => e.node_id,
            Event::NodeUnrescuing(e) => e.node_id,
            Event::NodePowerRequested(e) => e.node_id,
            Event::NodePowerChanged(e) => e.node_id,
            Event::NodeCredentialsRotation(e) => e.node_id,
            Event::NodeReleaseUnverified(e) => e.node_id,
            Event::NodeTenantRootLease(e) => e.node_id,
            Event::WorkflowStalled(e) => e.node_id,
            Event::Workflow(e) => e.node_id,
            Event::Step(e) => e.node_id,
            Event::BulkCreated(_)
            | Event::BulkApproved(_)
            | Event::BulkProgress(_)
            | Event::BulkFinished(_) => return None,
        })
    }
}
