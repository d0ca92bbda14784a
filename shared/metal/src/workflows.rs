//! Starting a state's workflow: the workflow and its steps, the node's
//! `workflowId` (a version bump) and `node.provision.workflow`, in the
//! caller's transaction. The unique index on (node, state, version) means a
//! node state entry never gets two workflows, whoever races.

use bcm_bus::Subjects;
use bcm_contracts::events::NodeWorkflowStarted;
use bcm_core::workflow::Profile;
use bcm_core::WorkflowId;
use bcm_db::nodes::{self, Node};
use bcm_db::workflows::{NewStep, NewWorkflow};
use bcm_db::{DbError, Tx};

use crate::outbox;

/// Starts `profile` for `node` (locked by the caller) and returns the node
/// as stored.
pub async fn start_in_txn(
    tx: &mut Tx<'_>,
    subjects: &Subjects,
    node: &Node,
    profile: &Profile,
) -> Result<Node, DbError> {
    let id = WorkflowId::generate();
    let step = |s: &bcm_core::workflow::StepDef, cleanup: bool| NewStep {
        name: s.name.clone(),
        target: s.kind.target().as_str().to_owned(),
        cleanup,
        definition: serde_json::to_value(s).unwrap_or_default(),
    };
    let steps = profile
        .steps
        .iter()
        .map(|s| step(s, false))
        .chain(profile.cleanup.iter().map(|s| step(s, true)))
        .collect();
    let started_by = bcm_db::nodes::node_actor_in_txn(tx, &node.id.to_string()).await?;
    bcm_db::workflows::workflow_insert_in_txn(
        tx,
        &NewWorkflow {
            id: id.to_string(),
            node_id: node.id.to_string(),
            owner: "metal".to_owned(),
            profile_id: profile.id.clone(),
            profile_version: profile.version as i32,
            for_state: node.provision_state.as_str().to_owned(),
            for_version: node.version,
            definition: serde_json::to_value(profile).unwrap_or_default(),
            steps,
            actor: started_by.actor,
            // The verb's trace: through the reconciler's pass that starts it
            // (a child of the verb's request), else (a periodic look, which
            // no message started) the verb's request itself.
            traceparent: bcm_bus::current_traceparent().or(started_by.traceparent),
        },
    )
    .await?;
    let next = Node {
        workflow_id: Some(id),
        ..node.clone()
    };
    let version = nodes::node_update_guarded_in_txn(tx, &next).await?;
    let next = Node { version, ..next };
    let started = outbox::event(
        subjects,
        &next,
        NodeWorkflowStarted {
            node_id: next.id,
            tenant_id: next.tenant_id.clone(),
            workflow_id: id.to_string(),
            profile_id: profile.id.clone(),
            profile_version: profile.version,
            provision_state: next.provision_state,
            version,
        },
    );
    crate::outbox::write_in_txn(tx, vec![started]).await?;
    Ok(next)
}
