//! The adopt path's first half: a machine with its own OS joins with a
//! pool's `node` token and becomes a node in `adopting` (no BMC on record),
//! created in the join's transaction with its `node.enrolled` and
//! `node.provision.adopting` events and a reconcile request; the reconciler
//! runs the pool's acceptance checks and moves it to `adopted`.

use bcm_bus::Subjects;
use bcm_core::{BmcDriver, NodeId, ProvisionState};
use bcm_db::nodes::Node;
use bcm_db::{Db, Tx};

use crate::AttestError;

/// Creates the node an adopt join is for; its id.
pub async fn create_node_in_txn(
    db: &Db,
    tx: &mut Tx<'_>,
    subjects: &Subjects,
    pool_id: &str,
) -> Result<String, AttestError> {
    let pool = bcm_db::tenancy::pool_fetch(
        db,
        &pool_id
            .parse()
            .map_err(|_| AttestError::Invalid(format!("pool {pool_id} is malformed")))?,
    )
    .await?;
    // No BMC on record: the machine joined with its own OS.
    let node = Node::first(
        NodeId::generate(),
        pool.tenant_id.clone(),
        pool.id.clone(),
        pool.site_id.clone(),
        ProvisionState::Adopting,
        BmcDriver::None,
        String::new(),
        pool.hardware_profile.clone(),
    );
    let rows = bcm_metal::outbox::created(subjects, &node, "adopt", None);
    bcm_db::nodes::node_insert_in_txn(tx, &node).await?;
    bcm_metal::outbox::write_in_txn(tx, rows).await?;
    tracing::info!(node = %node.id, pool = %node.pool_id, "adopting a machine that joined with a pool token");
    Ok(node.id.to_string())
}
