//! The OpenAPI document of the HTTP API, generated from the handlers and
//! types; `proto/openapi.json` is the checked-in copy.

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::{admin, agent, bulk, downloads, images, join_tokens, profiles, reads, verbs};

struct Bearer;

impl Modify for Bearer {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "The bootstrap admin token of the configuration, or an API token the admin minted (`POST /api/compute/admin/tokens`) with grants on tenants or pools",
                    ))
                    .build(),
            ),
        );
        components.add_security_scheme(
            "agentSession",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some("The session token a join returned"))
                    .build(),
            ),
        );
    }
}

/// Operation ids a generated client reads well (camelCase, unique, the
/// spec's method names), in place of the handlers' function names.
const OPERATION_IDS: &[(&str, &str)] = &[
    ("rotate_credentials", "rotateCredentials"),
    ("create", "createJoinToken"),
    ("get_node", "getNode"),
    ("list_nodes", "listNodes"),
    ("put_tenant", "putTenant"),
    ("put_site", "putSite"),
    ("put_pool", "putPool"),
    ("create_token", "createToken"),
    ("join", "agentJoin"),
    ("rejoin", "agentRejoin"),
    ("heartbeat", "agentHeartbeat"),
    ("commands", "agentCommands"),
    ("results", "agentResults"),
];

/// The verbs on one node: their request bodies take the node as a
/// response names it, so a node's view links to each.
const NODE_VERBS: &[&str] = &[
    "manage",
    "inspect",
    "provide",
    "deploy",
    "undeploy",
    "rescue",
    "unrescue",
    "abort",
    "recover",
    "retire",
    "power",
    "rotateCredentials",
];

struct OperationIdsAndLinks;

impl Modify for OperationIdsAndLinks {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::link::LinkBuilder;
        for item in doc.paths.paths.values_mut() {
            for op in [&mut item.get, &mut item.put, &mut item.post]
                .into_iter()
                .flatten()
            {
                if let Some(id) = op.operation_id.as_mut() {
                    if let Some((_, to)) = OPERATION_IDS.iter().find(|(from, _)| from == id) {
                        *id = (*to).to_owned();
                    }
                }
                let returns_node = op
                    .operation_id
                    .as_deref()
                    .is_some_and(|id| id == "enroll" || NODE_VERBS.contains(&id));
                if !returns_node {
                    continue;
                }
                // A node's view links to its read and to every verb on it,
                // so a client (and the conformance run's stateful phase)
                // can follow a node from enroll through its verbs.
                let Some(utoipa::openapi::RefOr::T(ok)) = op.responses.responses.get_mut("200")
                else {
                    continue;
                };
                ok.links.insert(
                    "getNode".to_owned(),
                    LinkBuilder::new()
                        .operation_id("getNode")
                        .parameter("nodeId", "$response.body#/nodeId")
                        .build()
                        .into(),
                );
                for verb in NODE_VERBS {
                    ok.links.insert(
                        (*verb).to_owned(),
                        LinkBuilder::new()
                            .operation_id(*verb)
                            .request_body(Some(serde_json::json!({
                                "tenantId": "$response.body#/tenantId",
                                "nodeId": "$response.body#/nodeId"
                            })))
                            .build()
                            .into(),
                    );
                }
            }
        }
    }
}

#[derive(OpenApi)]
#[openapi(
    info(title = "Better Compute Metal API", version = "0.1.0",
        description = "The metal API group: enroll machines by their BMCs and move them through the provision state machine. Errors are {code, message} with the spec's codes."),
    paths(
        verbs::enroll, verbs::manage, verbs::inspect, verbs::provide, verbs::deploy, verbs::undeploy,
        verbs::rescue, verbs::unrescue, verbs::abort, verbs::recover, verbs::retire, verbs::power, verbs::rotate_credentials,
        join_tokens::create,
        bulk::create, bulk::list, bulk::get, bulk::nodes, bulk::approve, bulk::reject, bulk::cancel,
        bulk::put_approver, bulk::list_approvers, bulk::revoke_approver,
        reads::get_node, reads::list_nodes,
        admin::put_tenant, admin::put_site, admin::get_site, admin::put_site_http_proxy, admin::put_pool, admin::get_pool, admin::list_pools, admin::list_hardware_profiles, admin::create_token,
        admin::list_tokens, admin::revoke_token,
        agent::join, agent::rejoin, agent::heartbeat, agent::commands, agent::results,
        profiles::publish, profiles::list, profiles::get,
        images::register, images::list, images::get, images::prewarm,
        crate::leases::list,
        downloads::list, downloads::get,
    ),
    components(schemas(crate::error::ApiErrorBody)),
    modifiers(&Bearer, &OperationIdsAndLinks),
    tags((name = "metal", description = "The metal API group"), (name = "admin", description = "Bootstrap administration"),
        (name = "profiles", description = "The tenant deploy profile catalog"),
        (name = "downloads", description = "What machines download (bcd for the installed OS)"),
        (name = "agent", description = "What the ramdisk and installed-OS agents speak"))
)]
struct ApiDoc;

/// A release's wipe as the API accepts it: every wipe mode that can end in
/// `ready` (`none` is refused, 400), or null.
pub fn release_wipe_schema() -> utoipa::openapi::Object {
    wipe_schema("How the release wipes: quick, secure-erase or crypto-erase; absent or null: the pool's releaseWipe. `none` is refused: a released node reaches ready only through a verified wipe.")
}

/// A pool's commissioning wipe as the document states it.
pub fn commission_wipe_schema() -> utoipa::openapi::Object {
    wipe_schema("How commissioning wipes: quick, secure-erase or crypto-erase; absent or null: quick. `none` is refused: a node reaches ready only through a verified wipe.")
}

fn wipe_schema(description: &str) -> utoipa::openapi::Object {
    use utoipa::openapi::schema::{SchemaType, Type};
    // The field is optional: null (or absent) takes the pool's default.
    let mut modes: Vec<serde_json::Value> = bcm_core::WipeMode::ALL
        .into_iter()
        .filter(|w| w.can_reach_ready())
        .map(|w| w.as_str().into())
        .collect();
    modes.push(serde_json::Value::Null);
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::String, Type::Null]))
        .enum_values(Some(modes))
        .description(Some(description))
        .build()
}

/// The OpenAPI document, as served and checked in.
pub fn document() -> serde_json::Value {
    let mut doc = serde_json::to_value(ApiDoc::openapi())
        .expect("an OpenAPI document built in memory serializes");
    camel_case_links(&mut doc);
    close_request_objects(&mut doc);
    doc
}

/// Every object a request body holds refuses fields it does not name (the
/// API deserializes with `deny_unknown_fields`), but utoipa states that only
/// for structs, not for the variants of a tagged enum (`BmcTls`). Marks each
/// object with properties that a request body reaches as closed, so the
/// document says what the server does. The conformance run holds the two
/// together: a closed object the server left open fails it.
fn close_request_objects(doc: &mut serde_json::Value) {
    let mut pending: Vec<String> = vec![];
    if let Some(paths) = doc.get("paths").and_then(|p| p.as_object()) {
        for body in paths
            .values()
            .filter_map(|item| item.as_object())
            .flat_map(|item| item.values())
            .filter_map(|op| op.pointer("/requestBody/content/application~1json/schema"))
        {
            collect_refs(body, &mut pending);
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    while let Some(name) = pending.pop() {
        if !seen.insert(name.clone()) {
            continue;
        }
        let pointer = format!("/components/schemas/{name}");
        if let Some(schema) = doc.pointer(&pointer) {
            collect_refs(schema, &mut pending);
        }
        if let Some(schema) = doc.pointer_mut(&pointer) {
            close_objects(schema);
        }
    }
}

/// The component names `schema` refers to, anywhere inside it.
fn collect_refs(schema: &serde_json::Value, into: &mut Vec<String>) {
    match schema {
        serde_json::Value::Object(map) => {
            if let Some(r) = map.get("$ref").and_then(|r| r.as_str()) {
                if let Some(name) = r.strip_prefix("#/components/schemas/") {
                    into.push(name.to_owned());
                }
            }
            map.values().for_each(|v| collect_refs(v, into));
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| collect_refs(v, into)),
        _ => {}
    }
}

/// Sets `additionalProperties: false` on `schema` and the inline schemas
/// of its combinators when they list properties and say nothing of others.
fn close_objects(schema: &mut serde_json::Value) {
    let Some(map) = schema.as_object_mut() else {
        return;
    };
    if map.contains_key("properties") && !map.contains_key("additionalProperties") {
        map.insert(
            "additionalProperties".to_owned(),
            serde_json::Value::Bool(false),
        );
    }
    for key in ["oneOf", "anyOf", "allOf"] {
        if let Some(serde_json::Value::Array(branches)) = map.get_mut(key) {
            branches.iter_mut().for_each(close_objects);
        }
    }
}

/// utoipa 5.5 serializes a Link object's fields in snake_case
/// (`operation_id`, `request_body`); OpenAPI names them `operationId` and
/// `requestBody`, and a tool reading the document ignores the others.
fn camel_case_links(doc: &mut serde_json::Value) {
    let Some(paths) = doc.get_mut("paths").and_then(|p| p.as_object_mut()) else {
        return;
    };
    let operations = paths
        .values_mut()
        .filter_map(|item| item.as_object_mut())
        .flat_map(|item| item.values_mut());
    let responses = operations
        .filter_map(|op| op.get_mut("responses").and_then(|r| r.as_object_mut()))
        .flat_map(|responses| responses.values_mut());
    let links = responses
        .filter_map(|response| response.get_mut("links").and_then(|l| l.as_object_mut()))
        .flat_map(|links| links.values_mut())
        .filter_map(|link| link.as_object_mut());
    for link in links {
        for (from, to) in [
            ("operation_id", "operationId"),
            ("operation_ref", "operationRef"),
            ("request_body", "requestBody"),
        ] {
            if let Some(value) = link.remove(from) {
                link.insert(to.to_owned(), value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn links_use_the_field_names_of_openapi() {
        let doc = super::document();
        let link = &doc["paths"]["/api/compute/metal/enroll"]["post"]["responses"]["200"]["links"]
            ["deploy"];
        assert_eq!(link["operationId"], "deploy");
        assert_eq!(link["requestBody"]["nodeId"], "$response.body#/nodeId");
        assert!(link.get("operation_id").is_none() && link.get("request_body").is_none());
    }

    #[test]
    fn objects_of_request_bodies_are_closed_and_views_are_not_touched() {
        let doc = super::document();
        let tls = &doc["components"]["schemas"]["BmcTls"]["oneOf"];
        let branches = tls.as_array().expect("BmcTls is a oneOf");
        assert!(!branches.is_empty());
        for branch in branches {
            assert_eq!(branch["additionalProperties"], false, "{branch}");
        }
        assert_eq!(
            doc["components"]["schemas"]["EnrollRequest"]["additionalProperties"],
            false
        );
        // A response object is as utoipa wrote it.
        assert!(doc["components"]["schemas"]["NodeView"]
            .get("additionalProperties")
            .is_none());
    }
}
