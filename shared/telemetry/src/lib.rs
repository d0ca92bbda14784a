//! Telemetry for every service: a `tracing` subscriber (JSON or pretty
//! logs), spans exported over OTLP when an endpoint is configured, W3C trace
//! context in and out of carriers (HTTP and NATS headers), and the
//! Prometheus recorder each service renders on `/metrics`; the signals
//! that stop a service (`signals`); and a once-a-second gate for log lines
//! a fleet would repeat (`once_per_second`).
//!
//! A tracer provider is always installed, with or without an exporter, so
//! trace ids exist and propagate through NATS even when nothing collects
//! them.

pub mod cpu;
pub mod once_per_second;
pub mod open_files;
pub mod signals;
pub use once_per_second::OncePerSecond;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use serde::Deserialize;
use std::collections::HashMap;
use std::sync::OnceLock;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::EnvFilter;

/// The buckets of every histogram (all are in seconds): from a database
/// round trip to a long workflow.
pub const SECONDS_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0, 600.0, 1800.0,
];

/// The W3C header name.
pub const TRACEPARENT: &str = "traceparent";

/// How a service logs and exports traces.
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub struct TelemetryConfig {
    /// `pretty` (the default) for people, `json` for log pipelines.
    #[serde(default)]
    pub log_format: LogFormat,
    /// An `EnvFilter` directive such as `info,bcm_api=debug`; `RUST_LOG`
    /// wins when set.
    #[serde(default)]
    pub log_filter: Option<String>,
    /// OTLP/HTTP traces endpoint, e.g. `http://127.0.0.1:4318/v1/traces`.
    /// Export is off when unset.
    #[serde(default)]
    pub otlp_endpoint: Option<String>,
    /// Append log lines to this file instead of writing them to stderr
    /// (`bcm --log-file`; `local.sh` keeps the terminal for people).
    #[serde(default)]
    pub log_file: Option<std::path::PathBuf>,
    /// Serve `/metrics` (and `/healthz`) here, e.g. `0.0.0.0:9464`, for a
    /// service without an HTTP server of its own (workflow, reconciler,
    /// attestation, bmc, boot). Off when unset.
    #[serde(default)]
    pub metrics_listen: Option<std::net::SocketAddr>,
}

/// Log line format.
#[derive(Debug, Clone, Copy, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Pretty,
    Json,
}

/// Errors of setting telemetry up.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("OTLP exporter: {0}")]
    Otlp(String),
    #[error("log file {path}: {source}")]
    LogFile {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
}

static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();
static PROMETHEUS: OnceLock<Option<metrics_exporter_prometheus::PrometheusHandle>> =
    OnceLock::new();

/// Sets up logging, tracing and metrics for `service`. Safe to call more
/// than once in a process (tests start several services): the first call
/// wins.
pub fn init(service: &str, cfg: &TelemetryConfig) -> Result<(), TelemetryError> {
    if PROVIDER.get().is_some() {
        return Ok(());
    }
    let mut builder = SdkTracerProvider::builder().with_resource(
        opentelemetry_sdk::Resource::builder()
            .with_service_name(service.to_owned())
            .build(),
    );
    if let Some(endpoint) = &cfg.otlp_endpoint {
        use opentelemetry_otlp::WithExportConfig as _;
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(endpoint.clone())
            .build()
            .map_err(|e| TelemetryError::Otlp(e.to_string()))?;
        builder = builder.with_batch_exporter(exporter);
    }
    let provider = builder.build();
    let tracer = provider.tracer(service.to_owned());
    if PROVIDER.set(provider.clone()).is_err() {
        return Ok(());
    }
    opentelemetry::global::set_tracer_provider(provider);
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());

    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(cfg.log_filter.as_deref().unwrap_or("info")))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let otel = tracing_opentelemetry::layer().with_tracer(tracer);
    let registry = tracing_subscriber::registry().with(filter).with(otel);
    // Where the lines go: a file (no colours) or stderr.
    let file = match &cfg.log_file {
        Some(path) => Some(std::sync::Mutex::new(open_log(path)?)),
        None => None,
    };
    let fmt = tracing_subscriber::fmt::layer();
    // A subscriber set by someone else (a test harness) is fine: keep it.
    let _ = match (cfg.log_format, file) {
        (LogFormat::Json, Some(f)) => registry.with(fmt.json().with_writer(f)).try_init(),
        (LogFormat::Pretty, Some(f)) => registry
            .with(fmt.with_ansi(false).with_writer(f))
            .try_init(),
        (LogFormat::Json, None) => registry
            .with(fmt.json().with_writer(std::io::stderr))
            .try_init(),
        // Colours only for a person at a terminal.
        (LogFormat::Pretty, None) => registry
            .with(
                fmt.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                    .with_writer(std::io::stderr),
            )
            .try_init(),
    };
    prometheus();
    Ok(())
}

/// Opens (creating it and its directory) a log file for appending.
fn open_log(path: &std::path::Path) -> Result<std::fs::File, TelemetryError> {
    let err = |source| TelemetryError::LogFile {
        path: path.to_owned(),
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(err)
}

/// Flushes spans that are still buffered. Call once at shutdown.
pub fn shutdown() {
    if let Some(p) = PROVIDER.get() {
        let _ = p.force_flush();
    }
}

/// The Prometheus handle, installing the global recorder on first use.
pub fn prometheus() -> Option<&'static metrics_exporter_prometheus::PrometheusHandle> {
    PROMETHEUS
        .get_or_init(|| {
            // Histograms with buckets (not the exporter's default
            // summaries): they aggregate across processes and replicas.
            metrics_exporter_prometheus::PrometheusBuilder::new()
                .set_buckets(SECONDS_BUCKETS)
                .ok()?
                .install_recorder()
                .ok()
        })
        .as_ref()
}

/// Renders every metric in the Prometheus text format.
pub fn render_metrics() -> String {
    prometheus().map(|h| h.render()).unwrap_or_default()
}

/// Serves `GET /metrics` (this process's metrics, Prometheus text format)
/// and `GET /healthz` on `listener` until `stop`: for a service that serves
/// no other HTTP (`metrics_listen`, or a `bcm --services …` process without
/// the API).
pub async fn serve_metrics(
    listener: tokio::net::TcpListener,
    stop: tokio_util::sync::CancellationToken,
) -> std::io::Result<()> {
    let app = axum::Router::new()
        .route(
            "/metrics",
            axum::routing::get(|| async {
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        "text/plain; version=0.0.4",
                    )],
                    render_metrics(),
                )
            }),
        )
        .route("/healthz", axum::routing::get(|| async { "ok" }));
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .await
}

/// Binds `listen` and serves [`serve_metrics`] there in a task.
pub async fn spawn_metrics(
    listen: std::net::SocketAddr,
    stop: tokio_util::sync::CancellationToken,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    tracing::info!(addr = %listener.local_addr()?, "metrics listening");
    Ok(tokio::spawn(async move {
        if let Err(e) = serve_metrics(listener, stop).await {
            tracing::warn!(error = %e, "the metrics listener stopped");
        }
    }))
}

/// The `traceparent` of the current span, if it has a trace.
pub fn current_traceparent() -> Option<String> {
    let cx = tracing::Span::current().context();
    let mut carrier: HashMap<String, String> = HashMap::new();
    TraceContextPropagator::new().inject_context(&cx, &mut carrier);
    carrier.remove(TRACEPARENT)
}

/// Makes `span` a child of the remote span a `traceparent` names. A missing
/// or malformed value leaves the span a root.
pub fn set_remote_parent(span: &tracing::Span, traceparent: Option<&str>) {
    let Some(tp) = traceparent else { return };
    let carrier: HashMap<String, String> = HashMap::from([(TRACEPARENT.to_owned(), tp.to_owned())]);
    let cx = TraceContextPropagator::new().extract(&carrier);
    span.set_parent(cx);
}

/// The trace id (32 hex digits) of a `traceparent` value.
pub fn trace_id_of(traceparent: &str) -> Option<&str> {
    let mut parts = traceparent.split('-');
    let _version = parts.next()?;
    parts.next().filter(|id| id.len() == 32)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `traceparent` from outside (a caller, an agent's result, a
    /// message) that is garbage leaves the span a root of a trace of its
    /// own; a valid one makes it a child in the caller's trace.
    #[test]
    fn a_garbage_traceparent_is_ignored_and_a_valid_one_is_continued() {
        let provider = SdkTracerProvider::builder().build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        tracing::subscriber::with_default(subscriber, || {
            let caller = "4bf92f3577b34da6a3ce929d0e0e4736";
            for garbage in [
                "",
                "garbage",
                "00-zz-00f067aa0ba902b7-01",
                "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
                &"9".repeat(4096),
            ] {
                let span = tracing::info_span!("t");
                set_remote_parent(&span, Some(garbage));
                let tp = span
                    .in_scope(current_traceparent)
                    .expect("a trace of its own");
                assert_ne!(trace_id_of(&tp), Some(caller), "{garbage:?}");
                assert!(trace_id_of(&tp).is_some_and(|id| id != "0".repeat(32)));
            }
            let span = tracing::info_span!("t");
            set_remote_parent(&span, Some(&format!("00-{caller}-00f067aa0ba902b7-01")));
            let tp = span.in_scope(current_traceparent).expect("continued");
            assert_eq!(trace_id_of(&tp), Some(caller));
        });
    }
}
