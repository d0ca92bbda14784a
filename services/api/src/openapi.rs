//! The OpenAPI document of the HTTP API, generated from the handlers and
//! types; `proto/openapi.json` is the checked-in copy.

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::{admin, agent, join_tokens, reads, verbs};

struct Bearer;

impl Modify for Bearer {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
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

#[derive(OpenApi)]
#[openapi(
    info(title = "Better Compute Metal API", version = "0.1.0",
        description = "The metal API group: enroll machines by their BMCs and move them through the provision state machine. Errors are {code, message} with the spec's codes."),
    paths(
        verbs::enroll, verbs::manage, verbs::inspect, verbs::provide, verbs::deploy, verbs::undeploy,
        verbs::rescue, verbs::unrescue, verbs::abort, verbs::recover, verbs::retire, verbs::power, verbs::rotate_credentials,
        join_tokens::create,
        reads::get_node, reads::list_nodes,
        admin::put_tenant, admin::put_site, admin::put_pool, admin::create_token,
        agent::join, agent::heartbeat, agent::commands, agent::results,
    ),
    modifiers(&Bearer),
    tags((name = "metal", description = "The metal API group"), (name = "admin", description = "Bootstrap administration"),
        (name = "agent", description = "What the ramdisk and installed-OS agents speak"))
)]
struct ApiDoc;

/// The OpenAPI document.
pub fn document() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}
