//! Outbox rows of the control plane's changes, built by `bcm_bus::outgoing`
//! and written, stamped, by [`write_in_txn`] in the change's transaction:
//! the one way a service puts an event in the outbox.

use bcm_bus::outgoing::{self, About, Outgoing};
use bcm_bus::Subjects;
use bcm_contracts::events::EventData;
use bcm_db::nodes::Node;
use bcm_db::outbox::NewOutboxMessage;

/// Writes events in the outbox inside `tx`, each stamped with the instant
/// it is written: its CloudEvents `time` is when its change was written,
/// not when the work of a long transaction began (most callers write their
/// events last, just before the commit; a transaction that writes twice,
/// such as a verb whose move writes its own, stamps each write). Every
/// service writes its events through here, never `bcm_db::outbox` itself
/// (clippy's `disallowed-methods` holds it to that).
#[allow(clippy::disallowed_methods)]
pub async fn write_in_txn(
    tx: &mut bcm_db::Tx<'_>,
    mut rows: Vec<NewOutboxMessage>,
) -> Result<(), bcm_db::DbError> {
    let now = chrono::Utc::now();
    for m in &mut rows {
        outgoing::stamp(&mut m.payload, now);
    }
    bcm_db::outbox::outbox_insert_in_txn(tx, &rows).await
}

/// Converts a bus message into an outbox row.
pub fn row(o: Outgoing) -> NewOutboxMessage {
    NewOutboxMessage {
        id: o.id,
        subject: o.subject,
        payload: o.payload,
        headers: o.headers,
        node_id: o.node_id,
    }
}

fn about(node: &Node) -> About<'_> {
    About {
        node: &node.id,
        tenant: &node.tenant_id,
        version: node.version,
        batch: node.batch_id.as_deref(),
    }
}

/// An event of the node's tenant; its payload names its type.
pub fn event<T: EventData>(subjects: &Subjects, node: &Node, data: T) -> NewOutboxMessage {
    let ty = data.event_type();
    row(outgoing::event(subjects, about(node), &ty, data))
}

/// The rows a new node is created with: `node.enrolled`,
/// `node.provision.<state>` (moved by `move_name`) and a reconcile request.
pub fn created(
    subjects: &Subjects,
    node: &Node,
    move_name: &str,
    actor: Option<&str>,
) -> Vec<NewOutboxMessage> {
    let enrolled = event(
        subjects,
        node,
        bcm_contracts::events::NodeEnrolled {
            node_id: node.id,
            tenant_id: node.tenant_id.clone(),
            pool_id: node.pool_id.clone(),
            site_id: node.site_id.clone(),
            bmc_driver: node.bmc_driver,
            bmc_address: node.bmc_address.clone(),
            hardware_profile: node.hardware_profile.clone(),
            version: node.version,
        },
    );
    vec![
        enrolled,
        provision_event(subjects, node, None, move_name, actor),
        reconcile(subjects, node, move_name),
    ]
}

/// `node.provision.<state>` for the node as it is now, made by `actor`'s
/// verb (none for the control plane's own moves).
pub fn provision_event(
    subjects: &Subjects,
    node: &Node,
    previous: Option<bcm_core::ProvisionState>,
    move_name: &str,
    actor: Option<&str>,
) -> NewOutboxMessage {
    event(
        subjects,
        node,
        bcm_contracts::events::NodeProvisionChanged {
            node_id: node.id,
            tenant_id: node.tenant_id.clone(),
            pool_id: node.pool_id.clone(),
            site_id: node.site_id.clone(),
            provision_state: node.provision_state,
            previous_state: previous,
            move_name: move_name.to_owned(),
            failed_from: node.failed_from,
            last_error: node.last_error.clone(),
            maintenance: node.maintenance,
            version: node.version,
            actor: actor.map(str::to_owned),
        },
    )
}

/// A reconcile request for the node.
pub fn reconcile(subjects: &Subjects, node: &Node, reason: &str) -> NewOutboxMessage {
    row(outgoing::reconcile(subjects, about(node), reason))
}

/// A command to the node's site.
pub fn command(
    subjects: &Subjects,
    node: &Node,
    cmd: &bcm_contracts::CommandEnvelope,
) -> NewOutboxMessage {
    row(outgoing::command(subjects, about(node), cmd))
}

/// A command to a site about no node (`site.httpProxy`).
pub fn site_command(subjects: &Subjects, cmd: &bcm_contracts::CommandEnvelope) -> NewOutboxMessage {
    row(outgoing::site_command(subjects, cmd))
}
