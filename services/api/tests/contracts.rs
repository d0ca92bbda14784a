//! The checked-in contracts in `proto/` are exactly what the code generates:
//! the OpenAPI document, the JSON Schema of every message and the AsyncAPI
//! document of the subjects. Regenerate with
//! `BLESS=1 cargo test -p bcm-api --test contracts`.

use std::path::PathBuf;

fn proto() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../proto")
}

fn pretty(v: &serde_json::Value) -> String {
    serde_json::to_string_pretty(v).expect("json") + "\n"
}

fn generated() -> Vec<(PathBuf, String)> {
    let openapi = bcm_api::openapi::document();
    let mut files = vec![
        (proto().join("openapi.json"), pretty(&openapi)),
        (
            proto().join("asyncapi.json"),
            pretty(&bcm_bus::asyncapi::asyncapi()),
        ),
    ];
    for (name, schema) in bcm_contracts::schemas::json_schemas() {
        files.push((proto().join("schemas").join(name), pretty(&schema)));
    }
    for (name, schema) in bcm_contracts::schemas::plugin_schemas() {
        files.push((proto().join("plugin").join(name), pretty(&schema)));
    }
    files
}

#[test]
fn proto_matches_the_code() {
    let bless = std::env::var_os("BLESS").is_some();
    let mut drift = vec![];
    for (path, text) in generated() {
        if bless {
            std::fs::create_dir_all(path.parent().expect("dir")).expect("mkdir");
            std::fs::write(&path, &text).expect("write");
        } else if std::fs::read_to_string(&path).ok().as_deref() != Some(text.as_str()) {
            drift.push(path.display().to_string());
        }
    }
    assert!(
        drift.is_empty(),
        "proto/ differs from the code for {drift:?}; run `BLESS=1 cargo test -p bcm-api --test contracts` and commit"
    );
}

#[test]
fn proto_holds_no_schema_the_code_does_not_generate() {
    let generated: Vec<String> = bcm_contracts::schemas::json_schemas()
        .into_iter()
        .map(|(name, _)| name.to_owned())
        .collect();
    let stale: Vec<String> = std::fs::read_dir(proto().join("schemas"))
        .expect("proto/schemas")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !generated.contains(n))
        .collect();
    assert!(
        stale.is_empty(),
        "proto/schemas holds files nothing generates: {stale:?}"
    );
}

#[test]
fn every_asyncapi_reference_names_a_generated_schema() {
    let generated: Vec<String> = bcm_contracts::schemas::json_schemas()
        .into_iter()
        .map(|(name, _)| name.to_owned())
        .collect();
    let referenced = bcm_bus::asyncapi::referenced_schemas();
    let dangling: Vec<&String> = referenced
        .iter()
        .filter(|r| !generated.contains(r))
        .collect();
    assert!(
        dangling.is_empty(),
        "asyncapi.json refers to {dangling:?}, which do not exist"
    );
    let unreferenced: Vec<&String> = generated
        .iter()
        .filter(|g| !referenced.contains(g))
        .collect();
    assert!(
        unreferenced.is_empty(),
        "schemas no channel of asyncapi.json carries: {unreferenced:?}"
    );
}

#[test]
fn every_api_method_of_the_spec_is_documented() {
    let doc = bcm_api::openapi::document();
    for verb in [
        "enroll", "manage", "inspect", "provide", "deploy", "undeploy", "rescue", "unrescue",
        "abort", "recover", "retire", "power",
    ] {
        let path = format!("/api/compute/metal/{verb}");
        assert!(
            doc["paths"][&path]["post"].is_object(),
            "{path} is missing from the OpenAPI document"
        );
    }
    assert!(doc["paths"]["/api/compute/metal/nodes"]["get"].is_object());
    assert!(doc["paths"]["/api/compute/metal/nodes/{nodeId}"]["get"].is_object());
}
