//! One verb is one trace, across every process. The control plane runs as
//! separate `bcm --services …` processes (api, relay, workflow, reconciler,
//! attestation, the simulated site), each exporting its spans over OTLP/HTTP
//! to a real receiver here, which decodes them with the OpenTelemetry
//! protocol's own message types (`opentelemetry-proto`). One node is enrolled
//! (to `ready`) and deployed, each verb with a `traceparent` of the caller's;
//! each verb's trace must hold spans of every one of those services, form
//! one tree under the caller's span, and go forward in time from parent to
//! child. Then each process's `/metrics` is scraped and parsed with a
//! Prometheus text-format parser (`prometheus-parse`): each shows the
//! families of its own work, with the values this run must have produced.

use axum::body::Bytes;
use bcm_core::ProvisionState;
use bcm_testkit::{Options, TestEnv};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use prost::Message as _;
use serde_json::json;
use std::collections::{BTreeSet, HashMap};
use std::process::Child;
use std::sync::{Arc, Mutex};
use std::time::Duration;

mod common;
use common::{spawn_child_on, T};

/// A span as the receiver got it.
#[derive(Debug, Clone)]
struct Received {
    service: String,
    trace_id: String,
    span_id: String,
    parent: String,
    name: String,
    start: u64,
    attributes: HashMap<String, String>,
}

type Spans = Arc<Mutex<Vec<Received>>>;

fn text(v: &Option<opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    match v.as_ref().and_then(|v| v.value.as_ref()) {
        Some(AnyValue::StringValue(s)) => s.clone(),
        Some(AnyValue::IntValue(i)) => i.to_string(),
        Some(AnyValue::BoolValue(b)) => b.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// An OTLP/HTTP (protobuf) traces receiver on loopback; returns its
/// endpoint and what it received.
async fn receiver() -> (String, Spans) {
    let spans: Spans = Arc::default();
    let kept = spans.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: Bytes| {
            let kept = kept.clone();
            async move {
                let Ok(req) = ExportTraceServiceRequest::decode(body) else {
                    return axum::http::StatusCode::BAD_REQUEST;
                };
                let mut out = kept.lock().unwrap_or_else(|p| p.into_inner());
                for rs in req.resource_spans {
                    let service = rs
                        .resource
                        .as_ref()
                        .and_then(|r| r.attributes.iter().find(|a| a.key == "service.name"))
                        .map(|a| text(&a.value))
                        .unwrap_or_default();
                    for ss in rs.scope_spans {
                        for s in ss.spans {
                            out.push(Received {
                                service: service.clone(),
                                trace_id: hex(&s.trace_id),
                                span_id: hex(&s.span_id),
                                parent: hex(&s.parent_span_id),
                                name: s.name.clone(),
                                start: s.start_time_unix_nano,
                                attributes: s
                                    .attributes
                                    .iter()
                                    .map(|a| (a.key.clone(), text(&a.value)))
                                    .collect(),
                            });
                        }
                    }
                }
                axum::http::StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind receiver");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}/v1/traces"), spans)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Every service the trace of a verb that runs workflows must reach.
const SERVICES: &[&str] = &[
    "bcm-api",
    "bcm-relay",
    "bcm-reconciler",
    "bcm-workflow",
    "bcm-sim",
    "bcm-attestation",
];

/// The spans of `trace_id`, once every service has exported some.
fn trace_of(spans: &Spans, trace_id: &str) -> Option<Vec<Received>> {
    let all = spans.lock().unwrap_or_else(|p| p.into_inner());
    let trace: Vec<Received> = all
        .iter()
        .filter(|s| s.trace_id == trace_id)
        .cloned()
        .collect();
    let services: BTreeSet<&str> = trace.iter().map(|s| s.service.as_str()).collect();
    // Complete: every service is in, and every parent has arrived (each
    // process exports what closed within 200 ms).
    let ids: BTreeSet<&str> = trace.iter().map(|s| s.span_id.as_str()).collect();
    let complete = trace
        .iter()
        .all(|s| s.parent == CALLER_SPAN || ids.contains(s.parent.as_str()));
    (complete && SERVICES.iter().all(|s| services.contains(s))).then_some(trace)
}

/// The span id of the caller's `traceparent`.
const CALLER_SPAN: &str = "00f067aa0ba902b7";

/// Kills the child processes however the test ends.
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The order a verb reaches the services in.
const SERVICE_ORDER: [&str; 4] = ["bcm-api", "bcm-relay", "bcm-reconciler", "bcm-workflow"];

/// When each service first appears in the trace.
fn first_start(trace: &[Received], svc: &str) -> u64 {
    trace
        .iter()
        .filter(|s| s.service == svc)
        .map(|s| s.start)
        .min()
        .unwrap_or(u64::MAX)
}

/// Whether `b` first appears no earlier than `a`, the service that hands it
/// the work. A workflow is started by the reconciler's pass that the
/// verb's event wakes, or, when the reconciler's periodic look
/// (`metal_poll_ms`) finds the node first, by a pass no message started:
/// then its steps are children of the verb's request itself and the engine
/// may run before the event is even published. That path is no disorder.
fn hands_on(trace: &[Received], a: &str, b: &str) -> bool {
    if first_start(trace, a) <= first_start(trace, b) {
        return true;
    }
    let by_id: HashMap<&str, &Received> = trace.iter().map(|s| (s.span_id.as_str(), s)).collect();
    (a, b) == ("bcm-reconciler", "bcm-workflow")
        && trace
            .iter()
            .filter(|s| s.service == b)
            .min_by_key(|s| s.start)
            .and_then(|first| by_id.get(first.parent.as_str()))
            .is_some_and(|parent| parent.service == "bcm-api")
}

/// Whether the services first appear in the order a verb reaches them.
fn services_in_order(trace: &[Received]) -> bool {
    SERVICE_ORDER
        .windows(2)
        .all(|w| hands_on(trace, w[0], w[1]))
}

/// One tree under the caller's span, forward in time, and the services in
/// the order a verb reaches them.
fn assert_causal(trace: &[Received], caller_span: &str, node: &str) {
    let by_id: HashMap<&str, &Received> = trace.iter().map(|s| (s.span_id.as_str(), s)).collect();
    let roots: Vec<&Received> = trace.iter().filter(|s| s.parent == caller_span).collect();
    assert!(
        roots.len() == 1 && roots[0].service == "bcm-api",
        "the API's request span is the one child of the caller's: {roots:?}"
    );
    for s in trace {
        if s.parent == caller_span {
            continue;
        }
        let parent = by_id.get(s.parent.as_str()).unwrap_or_else(|| {
            panic!(
                "{} ({}) has a parent {} outside the trace",
                s.name, s.service, s.parent
            )
        });
        assert!(
            s.start >= parent.start,
            "{} ({}) starts before its parent {} ({})",
            s.name,
            s.service,
            parent.name,
            parent.service
        );
    }
    // Each service first appears after the one that hands it the work.
    for w in SERVICE_ORDER.windows(2) {
        assert!(
            hands_on(trace, w[0], w[1]),
            "{} first appears after {}: {:?}",
            w[0],
            w[1],
            {
                let mut v: Vec<(u64, &str, &str)> = trace
                    .iter()
                    .map(|s| (s.start, s.service.as_str(), s.name.as_str()))
                    .collect();
                v.sort();
                v.into_iter().take(12).collect::<Vec<_>>()
            }
        );
    }
    // Steps and commands name their node, step and command kind.
    let steps: Vec<&Received> = trace
        .iter()
        .filter(|s| {
            s.name == "workflow.step"
                && s.attributes.get("node_id").map(String::as_str) == Some(node)
        })
        .collect();
    assert!(!steps.is_empty(), "no workflow.step span names node {node}");
    assert!(
        steps.iter().any(|s| s
            .attributes
            .get("command_kind")
            .is_some_and(|k| !k.is_empty())),
        "no step span names its command kind"
    );
    assert!(
        trace.iter().any(|s| s.service == "bcm-sim"
            && s.name == "site.command"
            && s.attributes.get("node_id").map(String::as_str) == Some(node)),
        "no site command span names node {node}"
    );
}

/// A scrape in the Prometheus text format, parsed.
fn scrape_text(text: &str) -> prometheus_parse::Scrape {
    prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned())))
        .unwrap_or_else(|e| panic!("not the Prometheus text format: {e}\n{text}"))
}

/// The sum of the samples named `name` whose labels include `labels` (a
/// histogram counts its observations).
fn total(scrape: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == name)
        .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match &s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => *v,
            prometheus_parse::Value::Histogram(buckets) => {
                buckets.iter().map(|b| b.count).fold(0.0, f64::max)
            }
            prometheus_parse::Value::Summary(_) => 0.0,
        })
        .sum()
}

/// (process, metric, labels): each must be above zero once one node went
/// to ready and was deployed.
type Expected = (
    &'static str,
    &'static str,
    &'static [(&'static str, &'static str)],
);
const EXPECTED: &[Expected] = &[
    (
        "api",
        "bcm_api_verbs_total",
        &[("verb", "deploy"), ("outcome", "ok")],
    ),
    ("api", "bcm_api_verb_seconds", &[("verb", "deploy")]),
    (
        "api",
        "bcm_api_request_seconds",
        &[
            ("route", "/api/compute/metal/deploy"),
            ("method", "POST"),
            ("status", "200"),
        ],
    ),
    ("api", "bcm_db_pool_wait_seconds", &[("pool", "main")]),
    ("api", "bcm_db_pool_wait_seconds", &[("pool", "agent")]),
    (
        "api",
        "bcm_api_agent_request_seconds",
        &[("endpoint", "results"), ("status", "204")],
    ),
    (
        "api",
        "bcm_api_agent_request_seconds",
        &[("endpoint", "heartbeat"), ("status", "200")],
    ),
    ("relay", "bcm_outbox_published_total", &[]),
    ("relay", "bcm_outbox_lag_seconds", &[]),
    (
        "relay",
        "bcm_outbox_relay_round_seconds",
        &[("phase", "read")],
    ),
    (
        "relay",
        "bcm_outbox_relay_round_seconds",
        &[("phase", "publish")],
    ),
    ("workflow", "bcm_workflow_commands_issued_total", &[]),
    ("workflow", "bcm_workflow_txn_seconds", &[("what", "steps")]),
    (
        "workflow",
        "bcm_workflow_txn_seconds",
        &[("what", "results")],
    ),
    (
        "workflow",
        "bcm_workflow_step_seconds",
        &[("status", "succeeded")],
    ),
    (
        "workflow",
        "bcm_workflow_seconds",
        &[("status", "succeeded")],
    ),
    ("workflow", "bcm_db_pool_wait_seconds", &[]),
    ("reconciler", "bcm_nodes", &[("state", "deployed")]),
    ("reconciler", "bcm_db_pool_wait_seconds", &[]),
    (
        "attestation",
        "bcm_attest_requests_total",
        &[("what", "result")],
    ),
    ("attestation", "bcm_attest_seconds", &[("what", "join")]),
    (
        "sim",
        "bcm_site_commands_total",
        &[("service", "sim"), ("outcome", "done")],
    ),
    ("sim", "bcm_site_command_seconds", &[("service", "sim")]),
];

/// Each process's `/metrics`, parsed; what this run did shows in it.
async fn every_process_serves_its_metrics(http: &reqwest::Client, ports: &[(String, String)]) {
    for (process, listen) in ports {
        let url = format!("http://{listen}/metrics");
        let mine: Vec<&Expected> = EXPECTED.iter().filter(|(p, _, _)| p == process).collect();
        let missing = |scrape: &prometheus_parse::Scrape| -> Vec<&Expected> {
            mine.iter()
                .copied()
                .filter(|(_, name, labels)| total(scrape, name, labels) <= 0.0)
                .collect()
        };
        // The reconciler counts the fleet once per stall-watch round (1 s).
        let started = std::time::Instant::now();
        let scrape = loop {
            let last = match http.get(&url).send().await {
                Ok(r) => r.text().await.unwrap_or_default(),
                Err(e) => format!("unreachable: {e}"),
            };
            let scrape = scrape_text(&last);
            if missing(&scrape).is_empty() {
                break scrape;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "{process} at {url} lacks {:?}:\n{last}",
                missing(&scrape)
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        };
        // Latencies are histograms (buckets), not summaries.
        for (_, name, _) in &mine {
            if let Some(s) = scrape.samples.iter().find(|s| s.metric == *name) {
                assert!(
                    !matches!(s.value, prometheus_parse::Value::Summary(_)),
                    "{process}: {name} is a summary; histograms are expected"
                );
            }
        }
    }
}

fn config(env: &TestEnv, dir: &std::path::Path, api: &str, otlp: &str) -> std::path::PathBuf {
    common::config_file(
        env,
        dir,
        "traces.toml",
        &format!("listen = \"{api}\"\nadmin_token = \"traces-admin-token-0123456789\""),
        &format!(
            r#"
[api.telemetry]
otlp_endpoint = "{otlp}"
log_filter = "info"
[api.tls]
plain_http = true
[engine]
control_plane_url = "http://{api}"
poll_ms = 100
join_poll_ms = 50
[reconciler]
metal_poll_ms = 2000
stall_check_secs = 1
"#
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_verb_is_one_trace_across_every_service_and_each_serves_metrics() {
    let env = TestEnv::start_with(Options::api_only()).await.expect("env");
    let (otlp, spans) = receiver().await;
    let dir = std::env::temp_dir().join(format!("bcm-traces-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let api = format!("127.0.0.1:{}", free_port());
    let cfg = config(&env, &dir, &api, &otlp);
    // The API's listener serves the API; every other process's serves its
    // metrics.
    let ports: Vec<(String, String)> = [
        "api",
        "relay",
        "workflow",
        "reconciler",
        "attestation",
        "sim",
    ]
    .iter()
    .map(|s| {
        let listen = match *s {
            "api" => api.clone(),
            _ => format!("127.0.0.1:{}", free_port()),
        };
        (s.to_string(), listen)
    })
    .collect();
    let _children = Children(
        ports
            .iter()
            .map(|(s, listen)| spawn_child_on(&cfg, s, &dir.join(format!("{s}.log")), listen))
            .collect(),
    );
    let http = reqwest::Client::new();
    let base = format!("http://{api}");
    bcm_testkit::eventually(Duration::from_secs(60), || async {
        Ok(http
            .get(format!("{base}/readyz"))
            .send()
            .await
            .ok()
            .filter(|r| r.status().is_success())
            .map(|_| ()))
    })
    .await
    .expect("the API process is ready");

    let verb = |path: &'static str, body: serde_json::Value, trace: &'static str| {
        let (http, base) = (http.clone(), base.clone());
        async move {
            let res = http
                .post(format!("{base}/api/compute/metal/{path}"))
                .bearer_auth("traces-admin-token-0123456789")
                .header("traceparent", format!("00-{trace}-{CALLER_SPAN}-01"))
                .json(&body)
                .send()
                .await
                .expect("post");
            let status = res.status();
            let body: serde_json::Value = res.json().await.unwrap_or_default();
            assert_eq!(status.as_u16(), 200, "{path}: {body}");
            body
        }
    };
    let enroll_trace = "5bf92f3577b34da6a3ce929d0e0e4736";
    let enrolled = verb(
        "enroll",
        json!({"tenantId": "a", "poolId": "a-pool",
               "hardwareProfile": "sim", "bmc": {"driver": "sim", "address": "sim://traced", "username": "u", "password": "p"}}),
        enroll_trace,
    )
    .await;
    let node: bcm_core::NodeId = enrolled["nodeId"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("nodeId");
    env.wait_state(&node, ProvisionState::Ready, T)
        .await
        .expect("ready");
    let deploy_trace = "6bf92f3577b34da6a3ce929d0e0e4736";
    verb(
        "deploy",
        json!({"tenantId": "a", "nodeId": node.to_string(), "profileId": "p", "profileVersion": 1}),
        deploy_trace,
    )
    .await;
    env.wait_state(&node, ProvisionState::Deployed, T)
        .await
        .expect("deployed");

    for trace_id in [enroll_trace, deploy_trace] {
        let trace = bcm_testkit::eventually(Duration::from_secs(30), || async {
            Ok(trace_of(&spans, trace_id))
        })
        .await
        .unwrap_or_else(|_| {
            let all = spans.lock().unwrap_or_else(|p| p.into_inner());
            let got: BTreeSet<(String, String)> = all
                .iter()
                .filter(|s| s.trace_id == trace_id)
                .map(|s| (s.service.clone(), s.name.clone()))
                .collect();
            let ids: BTreeSet<&str> = all.iter().map(|s| s.span_id.as_str()).collect();
            let orphans: Vec<(String, String)> = all
                .iter()
                .filter(|s| s.trace_id == trace_id && s.parent != CALLER_SPAN && !ids.contains(s.parent.as_str()))
                .map(|s| (s.service.clone(), s.name.clone()))
                .collect();
            let elsewhere: BTreeSet<(String, String, String)> = all
                .iter()
                .filter(|s| s.trace_id != trace_id)
                .map(|s| (s.service.clone(), s.name.clone(), s.trace_id.clone()))
                .take(40)
                .collect();
            panic!("trace {trace_id} is not one tree over every service; it has {got:?}; spans whose parent never arrived: {orphans:?}; other traces: {elsewhere:?}")
        });
        // Complete means every parent arrived, not every leaf: a leaf that
        // closed before the check (a reconcile pass with no child) may
        // still be in its process's 200 ms export batch, and the order of
        // first appearances below would see a later span of that service
        // first. Each process has exported what closed by then a second on.
        // Under load (CI's two cores busy) a batch can take longer than
        // that: the order is looked at again for up to 15 s before it is
        // judged (a wrong order never comes right, so it still fails).
        tokio::time::sleep(Duration::from_secs(1)).await;
        let mut trace = trace_of(&spans, trace_id).unwrap_or(trace);
        for _ in 0..30 {
            if services_in_order(&trace) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            trace = trace_of(&spans, trace_id).unwrap_or(trace);
        }
        assert_causal(&trace, CALLER_SPAN, &node.to_string());
    }
    every_process_serves_its_metrics(&http, &ports).await;
    let _ = std::fs::remove_dir_all(&dir);
}
