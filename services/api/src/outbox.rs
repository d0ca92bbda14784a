//! Building the outbox rows a change commits with: CloudEvents for
//! subscribers, reconcile requests for the reconciler and commands for site
//! services. Each carries the trace context of the request that caused it.

use bcm_bus::messages::{self, CloudEvent, ReconcileRequest};
use bcm_bus::Subjects;
use bcm_db::nodes::Node;
use bcm_db::outbox::NewOutboxMessage;
use serde::Serialize;

fn headers() -> serde_json::Map<String, serde_json::Value> {
    bcm_bus::trace_headers()
        .into_iter()
        .map(|(k, v)| (k, serde_json::Value::String(v)))
        .collect()
}

fn row<T: Serialize>(subject: String, node: &Node, ty: &str, data: T) -> NewOutboxMessage {
    let id = ulid::Ulid::new().to_string().to_lowercase();
    let event = CloudEvent::new(
        id.clone(),
        ty.to_owned(),
        Some(node.id.to_string()),
        Some(node.version),
        data,
    );
    NewOutboxMessage {
        id,
        subject,
        payload: serde_json::to_value(event).unwrap_or(serde_json::Value::Null),
        headers: headers(),
        node_id: Some(node.id.to_string()),
    }
}

/// An event of the node's tenant, of type `ty`.
pub fn event<T: Serialize>(
    subjects: &Subjects,
    node: &Node,
    ty: &str,
    data: T,
) -> NewOutboxMessage {
    row(subjects.event(&node.tenant_id, ty), node, ty, data)
}

/// `node.provision.<state>` for the node as it is now.
pub fn provision_event(
    subjects: &Subjects,
    node: &Node,
    previous: Option<bcm_core::ProvisionState>,
    move_name: &str,
) -> NewOutboxMessage {
    event(
        subjects,
        node,
        &messages::types::node_provision(node.provision_state),
        messages::NodeProvisionChanged {
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
        },
    )
}

/// A reconcile request for the node.
pub fn reconcile(subjects: &Subjects, node: &Node, reason: &str) -> NewOutboxMessage {
    row(
        subjects.reconcile(&node.id),
        node,
        messages::types::WORK_RECONCILE,
        ReconcileRequest {
            node_id: node.id,
            version: node.version,
            reason: reason.to_owned(),
        },
    )
}

/// A command to the node's site.
pub fn command(
    subjects: &Subjects,
    node: &Node,
    cmd: &messages::CommandEnvelope,
) -> NewOutboxMessage {
    row(
        subjects.command(&node.site_id, &cmd.kind),
        node,
        &messages::types::command(&cmd.kind),
        cmd.clone(),
    )
}
