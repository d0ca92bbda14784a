//! Authorization decisions: actions, grants on a scope, and the decision for
//! a request. A caller that can see nothing of a node's tenant or pool gets
//! `NOT_FOUND`, so tenants never learn of each other's nodes; a caller that
//! sees the node but lacks the action gets `FORBIDDEN`.

use serde::{Deserialize, Serialize};

use crate::ids::{PoolId, TenantId};
use crate::table::Verb;

crate::wire_enum! {
    /// An action a grant allows.
    pub enum Action "action" {
        NodesProvision = "compute:nodes:provision",
        NodesPower = "compute:nodes:power",
        NodesRead = "compute:nodes:read",
        PoolsEnroll = "compute:pools:enroll",
        ProfilesPublish = "compute:profiles:publish",
        ProfilesRead = "compute:profiles:read",
    }
}

impl Action {
    /// The action a verb is decided as: `power` is `compute:nodes:power`,
    /// every other verb `compute:nodes:provision` on the node.
    pub const fn for_verb(verb: Verb) -> Action {
        match verb {
            Verb::Power => Action::NodesPower,
            _ => Action::NodesProvision,
        }
    }
}

/// What a grant covers.
#[derive(
    Debug,
    Clone,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
    utoipa::ToSchema,
)]
#[serde(
    tag = "kind",
    content = "id",
    rename_all = "lowercase",
    deny_unknown_fields
)]
pub enum Scope {
    /// Everything (the bootstrap admin).
    Global,
    /// Every pool and node of a tenant.
    Tenant(TenantId),
    /// One pool and its nodes.
    Pool(PoolId),
}

/// One action on one scope.
#[derive(
    Debug,
    Clone,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
    utoipa::ToSchema,
)]
#[serde(deny_unknown_fields)]
pub struct Grant {
    pub action: Action,
    pub scope: Scope,
}

/// Where a resource sits: its tenant and pool (the authorization projection).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub tenant: TenantId,
    pub pool: PoolId,
}

/// The outcome of an authorization check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// The caller sees the resource but lacks the action.
    Forbidden,
    /// The caller sees nothing of the resource's tenant or pool.
    NotFound,
}

impl Scope {
    /// Whether this scope covers a resource placed at `at`.
    pub fn covers(&self, at: &Placement) -> bool {
        match self {
            Scope::Global => true,
            Scope::Tenant(t) => *t == at.tenant,
            Scope::Pool(p) => *p == at.pool,
        }
    }
}

/// Decides `action` on a resource of a whole tenant (its deploy profile
/// catalog): only a global or tenant grant covers it; a caller with a grant
/// on the tenant but not the action is `Forbidden`, and one with none there
/// (a pool grant included: it sees nodes, not the tenant) `NotFound`.
pub fn decide_on_tenant(grants: &[Grant], action: Action, tenant: &TenantId) -> Decision {
    let covers = |s: &Scope| match s {
        Scope::Global => true,
        Scope::Tenant(t) => t == tenant,
        Scope::Pool(_) => false,
    };
    if grants
        .iter()
        .any(|g| g.action == action && covers(&g.scope))
    {
        Decision::Allow
    } else if grants.iter().any(|g| covers(&g.scope)) {
        Decision::Forbidden
    } else {
        Decision::NotFound
    }
}

/// Decides `action` on a resource placed at `at` for a caller with `grants`.
pub fn decide(grants: &[Grant], action: Action, at: &Placement) -> Decision {
    if grants
        .iter()
        .any(|g| g.action == action && g.scope.covers(at))
    {
        Decision::Allow
    } else if grants.iter().any(|g| g.scope.covers(at)) {
        Decision::Forbidden
    } else {
        Decision::NotFound
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(t: &str, p: &str) -> Placement {
        Placement {
            tenant: t.parse().expect("tenant"),
            pool: p.parse().expect("pool"),
        }
    }

    #[test]
    fn tenant_resources_are_decided_on_tenant_grants_only() {
        let t = |s: &str| -> TenantId { s.parse().expect("tenant") };
        let grants = vec![
            Grant {
                action: Action::ProfilesRead,
                scope: Scope::Tenant(t("a")),
            },
            Grant {
                action: Action::ProfilesPublish,
                scope: Scope::Pool("b-gpu".parse().expect("p")),
            },
        ];
        assert_eq!(
            decide_on_tenant(&grants, Action::ProfilesRead, &t("a")),
            Decision::Allow
        );
        assert_eq!(
            decide_on_tenant(&grants, Action::ProfilesPublish, &t("a")),
            Decision::Forbidden
        );
        // A pool grant does not reach the tenant's catalog.
        assert_eq!(
            decide_on_tenant(&grants, Action::ProfilesPublish, &t("b")),
            Decision::NotFound
        );
        let admin = [Grant {
            action: Action::ProfilesPublish,
            scope: Scope::Global,
        }];
        assert_eq!(
            decide_on_tenant(&admin, Action::ProfilesPublish, &t("z")),
            Decision::Allow
        );
    }

    #[test]
    fn decisions() {
        let grants = vec![
            Grant {
                action: Action::NodesRead,
                scope: Scope::Tenant("a".parse().expect("t")),
            },
            Grant {
                action: Action::NodesProvision,
                scope: Scope::Pool("a-gpu".parse().expect("p")),
            },
        ];
        assert_eq!(
            decide(&grants, Action::NodesProvision, &at("a", "a-gpu")),
            Decision::Allow
        );
        assert_eq!(
            decide(&grants, Action::NodesProvision, &at("a", "a-cpu")),
            Decision::Forbidden
        );
        assert_eq!(
            decide(&grants, Action::NodesPower, &at("a", "a-gpu")),
            Decision::Forbidden
        );
        assert_eq!(
            decide(&grants, Action::NodesRead, &at("b", "b-gpu")),
            Decision::NotFound
        );
        let admin = vec![Grant {
            action: Action::NodesPower,
            scope: Scope::Global,
        }];
        assert_eq!(
            decide(&admin, Action::NodesPower, &at("b", "x")),
            Decision::Allow
        );
        assert_eq!(Action::for_verb(Verb::Power), Action::NodesPower);
        assert_eq!(Action::for_verb(Verb::Release), Action::NodesProvision);
    }

    #[test]
    fn a_grant_names_only_its_action_and_scope() {
        let ok: Grant = serde_json::from_str(
            r#"{"action":"compute:nodes:read","scope":{"kind":"pool","id":"p"}}"#,
        )
        .expect("grant");
        assert_eq!(ok.scope, Scope::Pool("p".parse().expect("pool")));
        for bad in [
            r#"{"action":"compute:nodes:read","scope":{"kind":"pool","id":"p","x":1}}"#,
            r#"{"action":"compute:nodes:read","scope":{"kind":"global"},"x":1}"#,
        ] {
            assert!(serde_json::from_str::<Grant>(bad).is_err(), "{bad}");
        }
    }
}
