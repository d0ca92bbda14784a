//! Messages on their way to the outbox: a CloudEvent, a reconcile request
//! or a command, with its subject, id and the current trace context. The
//! caller stores it with the change that caused it; the relay publishes it.

use serde::Serialize;

use crate::Subjects;
use bcm_contracts::events::types;
use bcm_contracts::work::ReconcileRequest;
use bcm_contracts::{CloudEvent, CommandEnvelope};
use bcm_core::{NodeId, ProvisionState, TenantId};

/// A message to commit with a change.
#[derive(Debug, Clone, PartialEq)]
pub struct Outgoing {
    /// CloudEvents id and `Nats-Msg-Id`.
    pub id: String,
    pub subject: String,
    pub payload: serde_json::Value,
    pub headers: serde_json::Map<String, serde_json::Value>,
    pub node_id: Option<String>,
}

/// The node an outgoing message is about.
#[derive(Debug, Clone, Copy)]
pub struct About<'a> {
    pub node: &'a NodeId,
    pub tenant: &'a TenantId,
    pub version: i64,
    /// The batch the node's current verb runs under (the events'
    /// `batchid`).
    pub batch: Option<&'a str>,
}

fn headers() -> serde_json::Map<String, serde_json::Value> {
    crate::trace_headers()
        .into_iter()
        .map(|(k, v)| (k, serde_json::Value::String(v)))
        .collect()
}

fn build<T: Serialize>(subject: String, about: About<'_>, ty: &str, data: T) -> Outgoing {
    let id = ulid::Ulid::new().to_string().to_lowercase();
    let event = CloudEvent::new(
        id.clone(),
        ty.to_owned(),
        Some(about.node.to_string()),
        Some(about.version),
        data,
    )
    .with_batch(about.batch.map(str::to_owned));
    Outgoing {
        id,
        subject,
        payload: serde_json::to_value(event).unwrap_or(serde_json::Value::Null),
        headers: headers(),
        node_id: Some(about.node.to_string()),
    }
}

/// An event of the node's tenant, of type `ty`.
pub fn event<T: Serialize>(subjects: &Subjects, about: About<'_>, ty: &str, data: T) -> Outgoing {
    build(subjects.event(about.tenant, ty), about, ty, data)
}

/// A reconcile request for the node.
pub fn reconcile(subjects: &Subjects, about: About<'_>, reason: &str) -> Outgoing {
    build(
        subjects.reconcile(about.node),
        about,
        types::WORK_RECONCILE,
        ReconcileRequest {
            node_id: *about.node,
            version: about.version,
            reason: reason.to_owned(),
        },
    )
}

/// A command to the node's site.
pub fn command(subjects: &Subjects, about: About<'_>, cmd: &CommandEnvelope) -> Outgoing {
    build(
        subjects.command(&cmd.site_id, cmd.kind().as_str()),
        about,
        &types::command(cmd.kind()),
        cmd.clone(),
    )
}

/// A command to a site about no node (`site.httpProxy`): the CloudEvent's
/// subject is the command.
pub fn site_command(subjects: &Subjects, cmd: &CommandEnvelope) -> Outgoing {
    let id = ulid::Ulid::new().to_string().to_lowercase();
    let event = CloudEvent::new(
        id.clone(),
        types::command(cmd.kind()),
        Some(cmd.command_id.clone()),
        None,
        cmd.clone(),
    );
    Outgoing {
        id,
        subject: subjects.command(&cmd.site_id, cmd.kind().as_str()),
        payload: serde_json::to_value(event).unwrap_or(serde_json::Value::Null),
        headers: headers(),
        node_id: None,
    }
}

/// A `bulk.*` event of a tenant about a batch (its CloudEvents subject).
pub fn batch_event<T: Serialize>(
    subjects: &Subjects,
    tenant: &TenantId,
    batch: &str,
    ty: &str,
    data: T,
) -> Outgoing {
    let id = ulid::Ulid::new().to_string().to_lowercase();
    let event = CloudEvent::new(
        id.clone(),
        ty.to_owned(),
        Some(batch.to_owned()),
        None,
        data,
    )
    .with_batch(Some(batch.to_owned()));
    Outgoing {
        id,
        subject: subjects.event(tenant, ty),
        payload: serde_json::to_value(event).unwrap_or(serde_json::Value::Null),
        headers: headers(),
        node_id: None,
    }
}

/// Sets the CloudEvent `time` of a message built earlier in its
/// transaction to `time`. A transaction that advances many workflows builds
/// its first events long before it commits; stamped again just before the
/// commit, each says when its change was written, not when the work behind
/// it began. A payload that is not a CloudEvent is left as it is.
pub fn stamp(payload: &mut serde_json::Value, time: chrono::DateTime<chrono::Utc>) {
    if let Some(t) = payload.get_mut("time") {
        if let Ok(v) = serde_json::to_value(time) {
            *t = v;
        }
    }
}

/// The `node.provision.<state>` type for a state.
pub fn provision_type(state: ProvisionState) -> String {
    types::node_provision(state)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stamp_moves_the_time_and_nothing_else() {
        let subjects = Subjects::new(None, 1);
        let node = NodeId::generate();
        let tenant: TenantId = "acme".parse().expect("a tenant id");
        let about = About {
            node: &node,
            tenant: &tenant,
            version: 3,
            batch: None,
        };
        let mut o = event(&subjects, about, "node.test", serde_json::json!({"a": 1}));
        let before = o.payload.clone();
        let later = chrono::Utc::now() + chrono::Duration::seconds(5);
        stamp(&mut o.payload, later);

        let ev: CloudEvent<serde_json::Value> =
            serde_json::from_value(o.payload.clone()).expect("still a CloudEvent");
        assert_eq!(ev.time, later);
        let (mut a, mut b) = (before, o.payload);
        for v in [&mut a, &mut b] {
            v.as_object_mut().expect("an object").remove("time");
        }
        assert_eq!(a, b, "only the time changed");

        let mut not_an_event = serde_json::json!([1, 2]);
        stamp(&mut not_an_event, later);
        assert_eq!(not_an_event, serde_json::json!([1, 2]));
    }
}
