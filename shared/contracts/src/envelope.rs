//! The CloudEvents 1.0 envelope (structured JSON mode) every message on the
//! bus travels in: events, reconcile requests, commands and results.

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The CloudEvents `source` of the control plane.
pub const SOURCE: &str = "/better-compute/metal";

/// The CloudEvents spec version this crate writes and reads.
pub const SPEC_VERSION: &str = "1.0";

/// A CloudEvents 1.0 envelope.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CloudEvent<T> {
    /// Always `1.0`.
    pub specversion: String,
    /// Unique per event; also the `Nats-Msg-Id` and the outbox row id.
    pub id: String,
    pub source: String,
    /// e.g. `node.provision.ready`.
    #[serde(rename = "type")]
    pub ty: String,
    /// The node id for node events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    pub time: DateTime<Utc>,
    pub datacontenttype: String,
    /// Extension: the node's version after the change, for ordering and
    /// dedupe by subscribers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodeversion: Option<i64>,
    /// Extension: the batch (`bat_…`) a node's current verb runs under, or
    /// that a `bulk.*` event is about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batchid: Option<String>,
    pub data: T,
}

impl<T> CloudEvent<T> {
    /// The same event naming `batch`.
    pub fn with_batch(mut self, batch: Option<String>) -> Self {
        self.batchid = batch;
        self
    }

    /// Wraps `data` as an event of type `ty` about `subject`.
    pub fn new(
        id: String,
        ty: String,
        subject: Option<String>,
        nodeversion: Option<i64>,
        data: T,
    ) -> Self {
        Self {
            specversion: SPEC_VERSION.to_owned(),
            id,
            source: SOURCE.to_owned(),
            ty,
            subject,
            time: Utc::now(),
            datacontenttype: "application/json".to_owned(),
            nodeversion,
            batchid: None,
            data,
        }
    }
}
