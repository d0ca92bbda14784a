//! The bus: NATS JetStream for events, work and commands.
//!
//! This crate owns every subject string ([`subjects`]), every stream
//! configuration ([`streams`]), the AsyncAPI document of the subjects
//! ([`asyncapi`]), and W3C trace-context propagation through NATS headers.
//! No other crate spells a subject. The messages themselves are
//! `bcm-contracts`' types.

pub mod asyncapi;
pub mod auth;
pub mod consumer;
pub mod kv;
pub mod outgoing;
pub mod streams;
pub mod subjects;

use async_nats::jetstream;
use async_nats::HeaderMap;
use bcm_contracts::{CloudEvent, CommandEnvelope, CommandResult};
use bytes::Bytes;

pub use async_nats::connection::State as ConnectionState;
pub use bcm_core::TenantId;
pub use subjects::Subjects;

/// The header JetStream dedupes publishes by.
pub const MSG_ID_HEADER: &str = "Nats-Msg-Id";

/// Errors of the bus.
#[derive(Debug, thiserror::Error)]
pub enum BusError {
    #[error("cannot connect to NATS at {url}: {why}")]
    Connect { url: String, why: String },
    #[error("stream {stream}: {why}")]
    Stream { stream: String, why: String },
    #[error(
        "stream {stream} exists with an incompatible configuration ({why}); it was left as it is"
    )]
    IncompatibleStream { stream: String, why: String },
    #[error("publish to {subject}: {why}")]
    Publish { subject: String, why: String },
    #[error("consumer: {0}")]
    Consumer(String),
}

/// How to reach NATS.
#[derive(Debug, Clone, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct BusConfig {
    /// e.g. `nats://127.0.0.1:4222`.
    pub url: String,
    /// Prefix of every subject and stream, so several control planes (or
    /// test runs) share one NATS server. Empty by default.
    #[serde(default)]
    pub namespace: Option<String>,
    /// Number of reconcile shards (`work.reconcile.<shard>.<nodeId>`).
    #[serde(default = "default_shards")]
    pub shards: u32,
    /// The file of this service's nkey user seed (`bcm nats-auth` writes
    /// one per identity). Without it the URL's `user:password@` is used.
    #[serde(default)]
    pub nkey_file: Option<std::path::PathBuf>,
}

fn default_shards() -> u32 {
    16
}

impl BusConfig {
    /// A config for `url` with no namespace and the default shard count.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            namespace: None,
            shards: default_shards(),
            nkey_file: None,
        }
    }
}

/// A connection to NATS with its JetStream context and subjects.
#[derive(Clone, Debug)]
pub struct Bus {
    client: async_nats::Client,
    js: jetstream::Context,
    subjects: Subjects,
}

impl Bus {
    /// Connects as the control plane and ensures every stream exists with
    /// a compatible configuration.
    pub async fn connect(cfg: &BusConfig) -> Result<Self, BusError> {
        let bus = Self::attach(cfg).await?;
        streams::ensure_all(&bus).await?;
        Ok(bus)
    }

    /// Connects without touching the streams: a site service's identity
    /// may not create or change them (the control plane does).
    pub async fn attach(cfg: &BusConfig) -> Result<Self, BusError> {
        let (url, user) = split_credentials(&cfg.url);
        let connect_err = |why: String| BusError::Connect {
            url: url.clone(),
            why,
        };
        let mut opts = async_nats::ConnectOptions::new()
            .name("bcm")
            .retry_on_initial_connect()
            .connection_timeout(std::time::Duration::from_secs(5))
            // What the server refuses (a permissions violation: the request
            // is never answered, so the caller sees only a time-out) is
            // said here, with the subject, at WARN.
            .event_callback(|event| async move {
                if let async_nats::Event::ServerError(e) = event {
                    tracing::warn!(error = %e, "the NATS server refused a request of this connection");
                }
            });
        if let Some(path) = &cfg.nkey_file {
            let key = auth::load_seed(path).map_err(|e| connect_err(e.to_string()))?;
            let seed = key.seed().map_err(|e| connect_err(e.to_string()))?;
            opts = opts
                .nkey(seed)
                .custom_inbox_prefix(auth::inbox_prefix(&key.public_key()));
        } else if let Some((name, password)) = user {
            opts = opts.user_and_password(name, password);
        }
        let client = opts
            .connect(url.as_str())
            .await
            .map_err(|e| connect_err(e.to_string()))?;
        let js = jetstream::new(client.clone());
        let subjects = Subjects::new(cfg.namespace.clone(), cfg.shards);
        Ok(Self {
            client,
            js,
            subjects,
        })
    }

    /// The subjects of this bus (namespace applied).
    pub fn subjects(&self) -> &Subjects {
        &self.subjects
    }

    /// The JetStream context.
    pub fn jetstream(&self) -> &jetstream::Context {
        &self.js
    }

    /// The core NATS client.
    pub fn client(&self) -> &async_nats::Client {
        &self.client
    }

    /// Publishes a site command's result on `result.<site>.<commandId>`
    /// (message id `result-<commandId>`, trace headers) and returns once
    /// JetStream stored it: only then may the executor ack the command.
    pub async fn publish_result(
        &self,
        cmd: &CommandEnvelope,
        result: CommandResult,
    ) -> Result<(), BusError> {
        let subject = self.subjects().result(&cmd.site_id, &cmd.command_id);
        let id = format!("result-{}", cmd.command_id);
        let event = CloudEvent::new(
            id.clone(),
            bcm_contracts::events::types::COMMAND_RESULT.to_owned(),
            cmd.node_id.map(|n| n.to_string()),
            None,
            result,
        );
        let payload = serde_json::to_vec(&event).map_err(|e| BusError::Publish {
            subject: subject.clone(),
            why: e.to_string(),
        })?;
        self.publish_durable(&subject, &id, &trace_headers(), payload.into())
            .await
    }

    /// Publishes `payload` to a stream subject with `Nats-Msg-Id = msg_id`
    /// and the given headers, and returns once JetStream has stored it (or
    /// recognised it as a duplicate).
    pub async fn publish_durable(
        &self,
        subject: &str,
        msg_id: &str,
        headers: &[(String, String)],
        payload: Bytes,
    ) -> Result<(), BusError> {
        let ack = self
            .publish_pipelined(subject, msg_id, headers, payload)
            .await?;
        ack.await
    }

    /// Sends a publish and returns a future of its acknowledgement, so a
    /// caller can keep several in flight and await them in order.
    pub async fn publish_pipelined(
        &self,
        subject: &str,
        msg_id: &str,
        headers: &[(String, String)],
        payload: Bytes,
    ) -> Result<impl std::future::Future<Output = Result<(), BusError>>, BusError> {
        let mut map = HeaderMap::new();
        map.insert(MSG_ID_HEADER, msg_id);
        for (k, v) in headers {
            map.insert(k.as_str(), v.as_str());
        }
        let err = |e: String| BusError::Publish {
            subject: subject.to_owned(),
            why: e,
        };
        let ack = self
            .js
            .publish_with_headers(subject.to_owned(), map, payload)
            .await
            .map_err(|e| err(e.to_string()))?;
        let subject = subject.to_owned();
        Ok(async move {
            ack.await.map(|_| ()).map_err(|e| BusError::Publish {
                subject,
                why: e.to_string(),
            })
        })
    }
}

/// A NATS URL without its `user:password@`, and those credentials: the
/// client does not read them from the URL, and the URL is printed in
/// errors, where a password must not be.
pub fn split_credentials(url: &str) -> (String, Option<(String, String)>) {
    let Some((scheme, rest)) = url.split_once("://") else {
        return (url.to_owned(), None);
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let Some((userinfo, host)) = authority.rsplit_once('@') else {
        return (url.to_owned(), None);
    };
    let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
    (
        format!("{scheme}://{host}{path}"),
        Some((user.to_owned(), password.to_owned())),
    )
}

/// The `traceparent` header of a message, if any.
pub fn traceparent_of(headers: Option<&HeaderMap>) -> Option<String> {
    headers
        .and_then(|h| h.get(bcm_telemetry::TRACEPARENT))
        .map(|v| v.as_str().to_owned())
}

/// The current span's W3C trace context, to store with work that another
/// process picks up from Postgres (a workflow, an agent's command).
pub fn current_traceparent() -> Option<String> {
    bcm_telemetry::current_traceparent()
}

/// The span of a site service (`bmc`, `boot`, the simulated site) running a
/// command: a child of the workflow step that issued it, so the result it
/// publishes inside the span goes on with the verb's trace.
pub fn command_span(
    service: &'static str,
    m: &consumer::Incoming<CloudEvent<CommandEnvelope>>,
) -> tracing::Span {
    let cmd = &m.message.data;
    let span = tracing::info_span!("site.command", service, command_id = %cmd.command_id,
        command_kind = %cmd.kind().as_str(), site_id = %cmd.site_id, node_id = tracing::field::Empty);
    if let Some(node) = cmd.node_id {
        span.record("node_id", tracing::field::display(node));
    }
    bcm_telemetry::set_remote_parent(&span, m.traceparent().as_deref());
    span
}

/// The current span's trace context as a NATS header map (for a request).
pub fn trace_header_map() -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in trace_headers() {
        h.insert(k.as_str(), v.as_str());
    }
    h
}

/// Counts a command a site service (`bmc`, `boot`, the simulated site)
/// handled, by kind and outcome, with how long it took.
pub fn command_handled(
    service: &'static str,
    m: &consumer::Incoming<CloudEvent<CommandEnvelope>>,
    took: std::time::Duration,
    d: &consumer::Disposition,
) {
    let kind = m.message.data.kind().as_str();
    let outcome = match d {
        consumer::Disposition::Done => "done",
        consumer::Disposition::Retry(_) => "retry",
        consumer::Disposition::Reject(_) => "rejected",
        consumer::Disposition::InFlight => "in-flight",
    };
    metrics::counter!("bcm_site_commands_total", "service" => service, "kind" => kind, "outcome" => outcome)
        .increment(1);
    metrics::histogram!("bcm_site_command_seconds", "service" => service, "kind" => kind)
        .record(took.as_secs_f64());
}

/// The current span's trace context as NATS headers, for publishing.
pub fn trace_headers() -> Vec<(String, String)> {
    bcm_telemetry::current_traceparent()
        .map(|tp| vec![(bcm_telemetry::TRACEPARENT.to_owned(), tp)])
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::split_credentials;

    #[test]
    fn credentials_leave_the_url() {
        assert_eq!(
            split_credentials("nats://admin:s3cr%t@127.0.0.1:4222"),
            (
                "nats://127.0.0.1:4222".to_owned(),
                Some(("admin".to_owned(), "s3cr%t".to_owned()))
            )
        );
        assert_eq!(
            split_credentials("nats://127.0.0.1:4222"),
            ("nats://127.0.0.1:4222".to_owned(), None)
        );
        assert_eq!(split_credentials("127.0.0.1:4222").1, None);
    }
}
