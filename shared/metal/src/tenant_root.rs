//! Dedicated-root leases in the caller's transaction: every committed
//! provision move of a node whose deploy profile is `dedicated` moves its
//! lease as `bcm_core::dedicated::on_move` says (opened at the deploy,
//! bound when the deploy finished, ending when the teardown starts, ended
//! when the node is back), with its `node.tenant-root.<state>` event in
//! the same transaction; and a refused request is recorded with its
//! reason. It decides nothing and owns no SQL.

use bcm_bus::Subjects;
use bcm_core::dedicated::{LeaseChange, LeaseState};
use bcm_core::deploy::DeployRole;
use bcm_core::Transition;
use bcm_db::nodes::Node;
use bcm_db::outbox::NewOutboxMessage;
use bcm_db::tenant_leases::{self, NewLease};
use bcm_db::{DbError, Tx};

use crate::outbox;

/// Whether the node's deploy profile snapshot is a dedicated one.
pub fn is_dedicated(node: &Node) -> bool {
    node.deploy_profile
        .as_ref()
        .is_some_and(|p| p.role == DeployRole::Dedicated)
}

fn profile_name(node: &Node) -> String {
    node.deploy_profile
        .as_ref()
        .map(|p| format!("{}@{}", p.id, p.version))
        .unwrap_or_default()
}

fn new_lease_id() -> String {
    format!("lease_{}", ulid::Ulid::new().to_string().to_lowercase())
}

/// Records a new lease of `node` in `state`.
async fn insert(
    tx: &mut Tx<'_>,
    node: &Node,
    profile: &str,
    state: LeaseState,
    reason: Option<&str>,
    actor: Option<&str>,
) -> Result<String, DbError> {
    let lease_id = new_lease_id();
    tenant_leases::lease_insert_in_txn(
        tx,
        &NewLease {
            id: &lease_id,
            tenant_id: node.tenant_id.as_str(),
            pool_id: node.pool_id.as_str(),
            node_id: &node.id.to_string(),
            deploy_profile: profile,
            state,
            reason,
            requested_by: actor,
        },
    )
    .await?;
    Ok(lease_id)
}

fn event(
    subjects: &Subjects,
    node: &Node,
    lease_id: &str,
    deploy_profile: String,
    state: LeaseState,
    reason: Option<String>,
) -> NewOutboxMessage {
    outbox::event(
        subjects,
        node,
        bcm_contracts::events::NodeTenantRootLease {
            lease_id: lease_id.to_owned(),
            node_id: node.id,
            tenant_id: node.tenant_id.clone(),
            pool_id: node.pool_id.clone(),
            state,
            deploy_profile,
            reason,
            version: node.version,
        },
    )
}

/// The lease change of a committed move of `node` (as written), and its
/// event rows.
pub async fn on_move_in_txn(
    tx: &mut Tx<'_>,
    subjects: &Subjects,
    node: &Node,
    t: &Transition,
    actor: Option<&str>,
) -> Result<Vec<NewOutboxMessage>, DbError> {
    if !is_dedicated(node) || t.from == t.to {
        return Ok(vec![]);
    }
    let id = node.id.to_string();
    let open = tenant_leases::lease_open_for_node_in_txn(tx, &id).await?;
    let Some(change) =
        bcm_core::dedicated::on_move(t.from, t.to, true, open.as_ref().map(|l| l.state))
    else {
        return Ok(vec![]);
    };
    let (lease_id, profile, state) = match (change, open) {
        (LeaseChange::Open, _) => {
            let profile = profile_name(node);
            let lease_id = insert(tx, node, &profile, LeaseState::Leased, None, actor).await?;
            (lease_id, profile, LeaseState::Leased)
        }
        (LeaseChange::To(state), Some(lease)) => {
            tenant_leases::lease_set_state_in_txn(tx, &lease.id, state).await?;
            (lease.id, lease.deploy_profile, state)
        }
        (LeaseChange::To(_), None) => return Ok(vec![]),
    };
    tracing::info!(node = %node.id, lease = %lease_id, %state, "dedicated-root lease");
    Ok(match state.event_type() {
        Some(_) => vec![event(subjects, node, &lease_id, profile, state, None)],
        None => vec![],
    })
}

/// Records a refused lease request for `node` (unchanged) and its
/// `node.tenant-root.refused` event, in the caller's transaction. `profile`
/// is the deploy profile asked for, `id@version`.
pub async fn refuse_in_txn(
    tx: &mut Tx<'_>,
    subjects: &Subjects,
    node: &Node,
    profile: &str,
    reason: &str,
    actor: Option<&str>,
) -> Result<(), DbError> {
    let lease_id = insert(tx, node, profile, LeaseState::Refused, Some(reason), actor).await?;
    crate::outbox::write_in_txn(
        tx,
        vec![event(
            subjects,
            node,
            &lease_id,
            profile.to_owned(),
            LeaseState::Refused,
            Some(reason.to_owned()),
        )],
    )
    .await
}
