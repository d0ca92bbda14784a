//! Committing a transition decided by `bcm_core::table::apply`.

use bcm_bus::Subjects;
use bcm_core::table::{MoveEvent, Transition};
use bcm_core::ProvisionState;
use bcm_db::nodes::{self, Node};
use bcm_db::{DbError, Tx};

use crate::outbox;

/// The node after `t`, before any caller-specific changes: the new state,
/// `failedFrom`, maintenance, the unrescue flag, and no workflow when the
/// state changed (the reconciler starts the new state's one).
pub fn next_node(node: &Node, t: &Transition) -> Node {
    let mut next = Node {
        provision_state: t.to,
        failed_from: t.failed_from,
        maintenance: t.maintenance.unwrap_or(node.maintenance),
        unrescue_pending: t.unrescue_pending,
        ..node.clone()
    };
    if t.to != t.from {
        next.workflow_id = None;
    }
    next
}

/// Whether a committed move asks the reconciler to look at the node again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FollowUp {
    /// A verb's move: a reconcile request goes into the outbox with it, and
    /// the reconciler takes the node from there.
    Reconcile,
    /// The reconciler's own move, inside a pass that goes on deciding for
    /// the node under the same lock: a request would only wake a pass that
    /// finds nothing to do.
    InPass,
}

/// Writes `next` with the version guard, then the event of `t` (naming
/// `actor`, the principal whose verb it is) and, for `FollowUp::Reconcile`,
/// a reconcile request into the outbox. Returns the node as stored.
pub async fn commit_in_txn(
    tx: &mut Tx<'_>,
    subjects: &Subjects,
    next: Node,
    t: &Transition,
    move_name: &str,
    follow_up: FollowUp,
    actor: Option<&str>,
) -> Result<Node, DbError> {
    let version = nodes::node_update_guarded_in_txn(tx, &next).await?;
    let next = Node { version, ..next };
    if let Some(actor) = actor {
        // What follows this verb — the state's workflow, the moves chained
        // after it, their commands — is done in this principal's name, and
        // goes on in the verb's trace.
        nodes::node_actor_set_in_txn(
            tx,
            &next.id.to_string(),
            actor,
            bcm_bus::current_traceparent().as_deref(),
        )
        .await?;
    }
    let ended = bcm_core::state::identities_ended(t.from, t.to, next.is_adopted());
    let revoked = crate::identity::end_in_txn(tx, &next.id.to_string(), ended).await?;
    if revoked > 0 {
        tracing::info!(node = %next.id, from = %t.from, to = %t.to, ?ended, revoked, "identities ended");
    }
    // The rescue's SSH access ends with the rescue (unrescued, released).
    if t.from == ProvisionState::Rescue
        && t.to != ProvisionState::Rescue
        && crate::rescue::forget_access_in_txn(tx, &next.id.to_string()).await?
    {
        tracing::info!(node = %next.id, to = %t.to, "the rescue's SSH access is forgotten");
    }
    let mut rows = vec![];
    match t.event {
        Some(MoveEvent::Provision(_)) => rows.push(outbox::provision_event(
            subjects,
            &next,
            Some(t.from),
            move_name,
            actor,
        )),
        Some(MoveEvent::Unrescuing) => rows.push(outbox::event(
            subjects,
            &next,
            bcm_contracts::events::NodeUnrescuing {
                node_id: next.id,
                tenant_id: next.tenant_id.clone(),
                workflow_id: None,
                version,
            },
        )),
        None => {}
    }
    rows.extend(crate::tenant_root::on_move_in_txn(tx, subjects, &next, t, actor).await?);
    if follow_up == FollowUp::Reconcile {
        rows.push(outbox::reconcile(subjects, &next, move_name));
    }
    if !rows.is_empty() {
        crate::outbox::write_in_txn(tx, rows).await?;
    }
    Ok(next)
}

/// What the state table needs to know of a locked node to decide a verb:
/// its state, `failedFrom`, the unrescue flag, whether the rescue ramdisk
/// is still booting (up once `metal-rescue` succeeded) and whether a BMC
/// password rotation is pending.
pub async fn facts_in_txn(tx: &mut Tx<'_>, node: &Node) -> Result<bcm_core::NodeFacts, DbError> {
    use bcm_core::workflow::WorkflowPhase;
    use bcm_core::ProvisionState;
    let rescue_booting = match (node.provision_state, node.workflow_id) {
        (ProvisionState::Rescue, _) if node.unrescue_pending => false,
        (ProvisionState::Rescue, Some(wf)) => {
            bcm_db::workflows::workflow_status_in_txn(tx, &wf.to_string()).await?
                != Some(WorkflowPhase::Succeeded)
        }
        (ProvisionState::Rescue, None) => true,
        _ => false,
    };
    Ok(bcm_core::NodeFacts {
        state: node.provision_state,
        failed_from: node.failed_from,
        unrescue_pending: node.unrescue_pending,
        rescue_booting,
        rotation_pending: node.bmc_pending_secret_id.is_some(),
    })
}
