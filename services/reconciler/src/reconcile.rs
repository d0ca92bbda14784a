//! One reconcile pass over one node: read, decide, act, repeat, all in one
//! transaction holding the node's row lock, so the moves a pass chains (and
//! the workflow it starts) commit together or not at all.

use bcm_bus::Bus;
use bcm_core::deploy::DeployRole;
use bcm_core::reconcile::{decide, ReconcileAction, WorkflowSummary};
use bcm_core::table::NodeFacts;
use bcm_core::workflow::{self, WorkflowPhase};
use bcm_core::{apply, NodeId, ProvisionState, WipeMode};
use bcm_db::{Db, DbError};

/// At most this many transitions per pass.
pub const MAX_TRANSITIONS: usize = 8;

/// What a pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PassReport {
    pub transitions: usize,
    pub workflows_started: usize,
}

/// Reconciles one node.
pub async fn node(
    db: &Db,
    bus: &Bus,
    id: &NodeId,
    lock_timeout_ms: u32,
) -> Result<PassReport, DbError> {
    let mut report = PassReport::default();
    let mut moved_to = vec![];
    let mut started = None;
    let mut tx = db.begin().await?;
    bcm_db::lock_timeout_in_txn(&mut tx, lock_timeout_ms).await?;
    // The node as this pass last wrote it (the row lock holds from the first
    // read, so nobody else changed it since).
    let mut written: Option<bcm_db::nodes::Node> = None;
    for _ in 0..MAX_TRANSITIONS {
        let node = match written.take() {
            Some(n) => n,
            None => bcm_db::nodes::node_fetch_for_update_in_txn(&mut tx, id).await?,
        };
        let wf = match node.workflow_id {
            Some(w) => {
                Some(bcm_db::workflows::workflow_fetch_in_txn(&mut tx, &w.to_string()).await?)
            }
            None => None,
        };
        let summary = wf.as_ref().map(|w| WorkflowSummary {
            profile_id: w.profile_id.clone(),
            phase: WorkflowPhase::parse(&w.status),
            wipe_verified: w.wipe_verified,
            error: w.error.clone(),
        });
        let facts = NodeFacts {
            state: node.provision_state,
            failed_from: node.failed_from,
            unrescue_pending: node.unrescue_pending,
            rescue_booting: false,
            rotation_pending: node.bmc_pending_secret_id.is_some(),
        };
        let action = if node.provision_state == ProvisionState::Adopting {
            let id = node.id.to_string();
            let certs = bcm_db::agents::certs_live_count_in_txn(&mut tx, &id).await?;
            let role_node = bcm_db::agents::node_fact_fetch_in_txn(&mut tx, &id, "agent:node")
                .await?
                .is_some_and(|f| f.get("role").and_then(|r| r.as_str()) == Some("node"));
            bcm_core::reconcile::decide_adoption(certs, role_node)
        } else {
            decide(facts, summary.as_ref())
        };
        match action {
            ReconcileAction::Idle | ReconcileAction::Wait => break,
            ReconcileAction::StartWorkflow => {
                let profile = match node.provision_state {
                    ProvisionState::Deploying => {
                        let p = node.deploy_profile.clone().unwrap_or_default();
                        let pid = p
                            .get("id")
                            .and_then(|v| v.as_str())
                            .unwrap_or("deploy")
                            .to_owned();
                        let ver = p.get("version").and_then(|v| v.as_u64()).unwrap_or(1) as u32;
                        workflow::tenant_deploy(&pid, ver)
                    }
                    s => match workflow::metal_profile_for(
                        s,
                        node.unrescue_pending,
                        node.release_wipe.unwrap_or(WipeMode::Quick),
                    ) {
                        Some(p) => p,
                        None => break,
                    },
                };
                match bcm_metal::workflows::start_in_txn(&mut tx, bus.subjects(), &node, &profile)
                    .await
                {
                    Ok(_) => {
                        report.workflows_started += 1;
                        started = Some(profile.id.clone());
                    }
                    // Another worker got there first (the backstops): the
                    // whole pass rolls back and the caller looks again.
                    Err(DbError::Duplicate { .. }) => {
                        tx.rollback().await?;
                        return Err(DbError::Stale);
                    }
                    Err(e) => return Err(e),
                }
                break;
            }
            ReconcileAction::Apply { mv, last_error } => {
                let t = match apply(facts, mv) {
                    Ok(t) => t,
                    Err(e) => {
                        tracing::warn!(node = %id, error = %e, "the table refused the reconciler's move");
                        break;
                    }
                };
                let mut next = bcm_metal::moves::next_node(&node, &t);
                if let Some(e) = last_error {
                    next.last_error = Some(e);
                }
                if t.from == ProvisionState::Deploying && t.to == ProvisionState::Deployed {
                    // The profile's role: host unless it says dedicated.
                    let role = node
                        .deploy_profile
                        .as_ref()
                        .and_then(|p| p.get("role"))
                        .and_then(|r| serde_json::from_value::<DeployRole>(r.clone()).ok())
                        .unwrap_or(DeployRole::Host);
                    next.role = Some(role.as_str().to_owned());
                }
                let name = mv.name().to_string();
                written = Some(
                    bcm_metal::moves::commit_in_txn(
                        &mut tx,
                        bus.subjects(),
                        next,
                        &t,
                        &name,
                        bcm_metal::moves::FollowUp::InPass,
                    )
                    .await?,
                );
                report.transitions += 1;
                moved_to.push(t.to);
            }
        }
    }
    // The pass made its moves without asking for a look again after each
    // (`FollowUp::InPass`). Every turn that does not move ends the pass, so
    // MAX_TRANSITIONS moves mean it stopped at the cap: it asks once now.
    if report.transitions == MAX_TRANSITIONS {
        if let Some(node) = &written {
            bcm_db::outbox::outbox_insert_in_txn(
                &mut tx,
                &[bcm_metal::outbox::reconcile(
                    bus.subjects(),
                    node,
                    "more moves after a full pass",
                )],
            )
            .await?;
        }
    }
    if report == PassReport::default() {
        tx.rollback().await?;
    } else {
        tx.commit().await?;
    }
    for to in moved_to {
        metrics::counter!("bcm_reconciler_transitions_total", "to" => to.as_str()).increment(1);
    }
    if let Some(profile) = started {
        metrics::counter!("bcm_reconciler_workflows_started_total", "profile" => profile.clone())
            .increment(1);
        tracing::info!(node = %id, %profile, "workflow started");
    }
    Ok(report)
}
