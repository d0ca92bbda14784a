//! One reconcile pass over one node: read, decide, act, repeat, all in one
//! transaction holding the node's row lock, so the moves a pass chains (and
//! the workflow it starts) commit together or not at all.

use bcm_bus::Bus;
use bcm_contracts::agent::{AgentPresence, AgentRole};
use bcm_core::agentless::AgentMode;
use bcm_core::deploy::DeployRole;
use bcm_core::reconcile::{decide, ReconcileAction};
use bcm_core::table::{Move, NodeFacts};
use bcm_core::workflow::{self, Profile};
use bcm_core::{apply, NodeId, ProvisionState, WipeMode};
use bcm_db::nodes::Node;
use bcm_db::{Db, DbError, Tx};

/// At most this many transitions per pass.
pub const MAX_TRANSITIONS: usize = 8;

/// What a pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PassReport {
    pub transitions: usize,
    pub workflows_started: usize,
}

/// What a pass has done so far.
#[derive(Default)]
struct Pass {
    report: PassReport,
    moved_to: Vec<ProvisionState>,
    started: Option<String>,
    /// The node as this pass last wrote it (the row lock holds from the
    /// first read, so nobody else changed it since).
    written: Option<Node>,
}

/// Whether a pass goes on deciding after an action.
enum Then {
    Decide,
    Stop,
}

/// Reconciles one node, recording how long the pass took
/// (`bcm_reconciler_pass_seconds`) and how much of this process's CPU it
/// used (`bcm_reconciler_pass_cpu_seconds`, its polls only: not Postgres's
/// work for it, nor its waits): what one worker's passes cost, whatever
/// else the process runs.
pub async fn node(
    db: &Db,
    bus: &Bus,
    id: &NodeId,
    lock_timeout_ms: u32,
) -> Result<PassReport, DbError> {
    let started = std::time::Instant::now();
    let (report, cpu) =
        bcm_telemetry::cpu::cpu_timed(pass_over(db, bus, id, lock_timeout_ms)).await;
    metrics::histogram!("bcm_reconciler_pass_seconds").record(started.elapsed().as_secs_f64());
    metrics::histogram!("bcm_reconciler_pass_cpu_seconds").record(cpu.as_secs_f64());
    report
}

async fn pass_over(
    db: &Db,
    bus: &Bus,
    id: &NodeId,
    lock_timeout_ms: u32,
) -> Result<PassReport, DbError> {
    let mut pass = Pass::default();
    let mut tx = db.begin_with_lock_timeout(lock_timeout_ms).await?;
    for _ in 0..MAX_TRANSITIONS {
        let node = match pass.written.take() {
            Some(n) => n,
            None => bcm_db::nodes::node_fetch_for_update_in_txn(&mut tx, id).await?,
        };
        let action = decide_for(&mut tx, &node).await?;
        match act(&mut tx, bus, node, action, &mut pass).await? {
            Then::Decide => {}
            Then::Stop => break,
        }
    }
    ask_again_if_capped(&mut tx, bus, &pass).await?;
    if pass.report == PassReport::default() {
        tx.rollback().await?;
    } else {
        tx.commit().await?;
    }
    record_metrics(id, &pass);
    Ok(pass.report)
}

/// Reads what the decision needs (the node's workflow, or an adopting
/// node's agent) and asks `bcm_core` what to do.
async fn decide_for(tx: &mut Tx<'_>, node: &Node) -> Result<ReconcileAction, DbError> {
    if node.provision_state == ProvisionState::Adopting {
        let id = node.id.to_string();
        let certs = bcm_db::agents::certs_live_count_in_txn(tx, &id).await?;
        let stored = bcm_db::agents::node_fact_fetch_in_txn(tx, &id, "agent:node").await?;
        let role_node = match AgentPresence::from_stored(stored) {
            Ok(p) => p.is_some_and(|p| p.role == AgentRole::Node),
            Err(e) => {
                tracing::warn!(node = %id, error = %e, "an agent presence this reconciler cannot read");
                false
            }
        };
        let acceptance =
            bcm_db::tenancy::pool_adopt_acceptance_in_txn(tx, node.pool_id.as_str()).await?;
        let machine = if acceptance.is_empty() {
            None
        } else {
            // What the agent reported at join; one this reconciler cannot
            // read counts as none (the checks then refuse the machine).
            bcm_db::agents::node_fact_fetch_in_txn(tx, &id, "inventory")
                .await?
                .and_then(|v| {
                    serde_json::from_value::<bcm_contracts::outputs::Inventory>(v)
                        .map_err(|e| tracing::warn!(node = %id, error = %e, "an inventory this reconciler cannot read"))
                        .ok()
                })
                .map(|inv| bcm_core::reconcile::MachineSummary {
                    cpus: inv.cpus,
                    memory_mib: inv.memory_mib,
                    disk_bytes: inv.disks.iter().map(|d| d.size_bytes).collect(),
                })
        };
        return Ok(bcm_core::reconcile::decide_adoption(
            certs,
            role_node,
            &acceptance,
            machine.as_ref(),
        ));
    }
    let agentless = if node.provision_state == ProvisionState::Releasing {
        bcm_db::tenancy::pool_agent_policy_in_txn(tx, node.pool_id.as_str())
            .await?
            .agentless_release()
    } else {
        None
    };
    let summary = match node.workflow_id {
        Some(w) => Some(
            bcm_db::workflows::workflow_fetch_in_txn(tx, &w.to_string())
                .await?
                .summary(),
        ),
        None => None,
    };
    let action = decide(facts(node), summary.as_ref(), agentless);
    if action != ReconcileAction::StartWorkflow {
        return Ok(action);
    }
    // A verb that moved the node out of a workflow's state cancelled that
    // workflow; its cleanup may still drive the machine.
    let superseded =
        bcm_db::workflows::workflow_unfinished_of_node_in_txn(tx, &node.id.to_string()).await?;
    if let Some(wf) = &superseded {
        tracing::info!(node = %node.id, workflow = %wf, state = %node.provision_state, "the state's workflow waits for the cancelled one's cleanup");
    }
    Ok(bcm_core::reconcile::after_superseded(
        action,
        superseded.is_some(),
    ))
}

fn facts(node: &Node) -> NodeFacts {
    NodeFacts {
        state: node.provision_state,
        failed_from: node.failed_from,
        unrescue_pending: node.unrescue_pending,
        rescue_booting: false,
        rotation_pending: node.bmc_pending_secret_id.is_some(),
    }
}

/// Carries out one decision.
async fn act(
    tx: &mut Tx<'_>,
    bus: &Bus,
    node: Node,
    action: ReconcileAction,
    pass: &mut Pass,
) -> Result<Then, DbError> {
    match action {
        ReconcileAction::Idle | ReconcileAction::Wait => Ok(Then::Stop),
        ReconcileAction::StartWorkflow => {
            start_workflow(tx, bus, &node, pass).await?;
            Ok(Then::Stop)
        }
        ReconcileAction::ReleaseUnattested {
            mv,
            reason,
            last_error,
        } => {
            let workflow_id = node.workflow_id.map(|w| w.to_string()).unwrap_or_default();
            match apply_move(tx, bus, &node, mv, last_error).await? {
                Some((next, to)) => {
                    tracing::warn!(node = %node.id, %reason, outcome = %to, "agentless release without an attested erase");
                    bcm_metal::outbox::write_in_txn(
                        tx,
                        vec![bcm_metal::outbox::event(
                            bus.subjects(),
                            &next,
                            bcm_contracts::events::NodeReleaseUnverified {
                                node_id: next.id,
                                tenant_id: next.tenant_id.clone(),
                                pool_id: next.pool_id.clone(),
                                workflow_id,
                                reason,
                                outcome: to,
                                version: next.version,
                            },
                        )],
                    )
                    .await?;
                    metrics::counter!("bcm_reconciler_unattested_releases_total", "outcome" => to.as_str()).increment(1);
                    pass.written = Some(next);
                    pass.report.transitions += 1;
                    pass.moved_to.push(to);
                    Ok(Then::Decide)
                }
                None => Ok(Then::Stop),
            }
        }
        ReconcileAction::Apply { mv, last_error } => {
            match apply_move(tx, bus, &node, mv, last_error).await? {
                Some((next, to)) => {
                    pass.written = Some(next);
                    pass.report.transitions += 1;
                    pass.moved_to.push(to);
                    Ok(Then::Decide)
                }
                None => Ok(Then::Stop),
            }
        }
    }
}

/// The profile a workflow-driven state runs: the node's deploy profile
/// snapshot for `deploying`, else the metal profile of the state (with its
/// pool's commissioning wipe, or the release's wipe).
fn profile_for(node: &Node, commission_wipe: WipeMode, agent: AgentMode) -> Option<Profile> {
    match node.provision_state {
        ProvisionState::Deploying => {
            let (id, version) = node
                .deploy_profile
                .as_ref()
                .map_or(("deploy", 1), |p| (p.id.as_str(), p.version));
            Some(workflow::tenant_deploy_for(id, version, agent))
        }
        ProvisionState::Commissioning => workflow::metal_profile_for(
            ProvisionState::Commissioning,
            false,
            commission_wipe,
            agent,
        ),
        // An adopted machine has no BMC: its own OS erases and powers off.
        ProvisionState::Retiring if node.is_adopted() => Some(workflow::metal_retire_adopted()),
        // A node its tenant had root on is torn down as such.
        ProvisionState::Releasing if bcm_metal::tenant_root::is_dedicated(node) => {
            let wipe = node.release_wipe.unwrap_or(WipeMode::SecureErase);
            Some(match agent {
                AgentMode::Bcd => workflow::metal_release_dedicated(wipe),
                AgentMode::None => workflow::metal_release_oob_dedicated(wipe),
            })
        }
        s => workflow::metal_profile_for(
            s,
            node.unrescue_pending,
            node.release_wipe.unwrap_or(WipeMode::Quick),
            agent,
        ),
    }
}

/// Starts the state's workflow. Another worker that got there first (the
/// unique index on node, state and version) rolls the whole pass back for
/// the caller to look again.
async fn start_workflow(
    tx: &mut Tx<'_>,
    bus: &Bus,
    node: &Node,
    pass: &mut Pass,
) -> Result<(), DbError> {
    let commission_wipe = if node.provision_state == ProvisionState::Commissioning {
        let w = bcm_db::tenancy::pool_commission_wipe_in_txn(tx, node.pool_id.as_str()).await?;
        WipeMode::parse(&w).unwrap_or(WipeMode::Quick)
    } else {
        WipeMode::Quick
    };
    let agent = bcm_db::tenancy::pool_agent_policy_in_txn(tx, node.pool_id.as_str())
        .await?
        .agent;
    let Some(profile) = profile_for(node, commission_wipe, agent) else {
        return Ok(());
    };
    match bcm_metal::workflows::start_in_txn(tx, bus.subjects(), node, &profile).await {
        Ok(_) => {
            pass.report.workflows_started += 1;
            pass.started = Some(profile.id);
            Ok(())
        }
        Err(DbError::Duplicate { .. }) => Err(DbError::Stale),
        Err(e) => Err(e),
    }
}

/// Applies a move the table allows; the node as written and where it went,
/// or `None` when the table refused it.
async fn apply_move(
    tx: &mut Tx<'_>,
    bus: &Bus,
    node: &Node,
    mv: Move,
    last_error: Option<String>,
) -> Result<Option<(Node, ProvisionState)>, DbError> {
    let t = match apply(facts(node), mv) {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(node = %node.id, error = %e, "the table refused the reconciler's move");
            return Ok(None);
        }
    };
    let mut next = bcm_metal::moves::next_node(node, &t);
    if let Some(e) = last_error {
        next.last_error = Some(e);
    }
    if t.from == ProvisionState::Deploying && t.to == ProvisionState::Deployed {
        // The profile's role: host unless it says dedicated.
        let role = node
            .deploy_profile
            .as_ref()
            .map_or(DeployRole::Host, |p| p.role);
        next.role = Some(role.as_str().to_owned());
    }
    let name = mv.name().to_string();
    let written = bcm_metal::moves::commit_in_txn(
        tx,
        bus.subjects(),
        next,
        &t,
        &name,
        bcm_metal::moves::FollowUp::InPass,
        None,
    )
    .await?;
    Ok(Some((written, t.to)))
}

/// The pass made its moves without asking for a look again after each
/// (`FollowUp::InPass`). Every turn that does not move ends the pass, so
/// MAX_TRANSITIONS moves mean it stopped at the cap: it asks once now.
async fn ask_again_if_capped(tx: &mut Tx<'_>, bus: &Bus, pass: &Pass) -> Result<(), DbError> {
    if pass.report.transitions < MAX_TRANSITIONS {
        return Ok(());
    }
    let Some(node) = &pass.written else {
        return Ok(());
    };
    bcm_metal::outbox::write_in_txn(
        tx,
        vec![bcm_metal::outbox::reconcile(
            bus.subjects(),
            node,
            "more moves after a full pass",
        )],
    )
    .await
}

fn record_metrics(id: &NodeId, pass: &Pass) {
    for to in &pass.moved_to {
        metrics::counter!("bcm_reconciler_transitions_total", "to" => to.as_str()).increment(1);
    }
    if let Some(profile) = &pass.started {
        metrics::counter!("bcm_reconciler_workflows_started_total", "profile" => profile.clone())
            .increment(1);
        tracing::info!(node = %id, %profile, "workflow started");
    }
}
