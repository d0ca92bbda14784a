//! Telemetry for every service: a `tracing` subscriber (JSON or pretty
//! logs), spans exported over OTLP when an endpoint is configured, W3C trace
//! context in and out of carriers (HTTP and NATS headers), and the
//! Prometheus recorder each service renders on `/metrics`; and the signals
//! that stop a service (`signals`).
//!
//! A tracer provider is always installed, with or without an exporter, so
//! trace ids exist and propagate through NATS even when nothing collects
//! them.

pub mod signals;

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
    // A subscriber set by someone else (a test harness) is fine: keep it.
    let _ = match cfg.log_format {
        LogFormat::Json => registry
            .with(tracing_subscriber::fmt::layer().json())
            .try_init(),
        LogFormat::Pretty => registry.with(tracing_subscriber::fmt::layer()).try_init(),
    };
    prometheus();
    Ok(())
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
            metrics_exporter_prometheus::PrometheusBuilder::new()
                .install_recorder()
                .ok()
        })
        .as_ref()
}

/// Renders every metric in the Prometheus text format.
pub fn render_metrics() -> String {
    prometheus().map(|h| h.render()).unwrap_or_default()
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
