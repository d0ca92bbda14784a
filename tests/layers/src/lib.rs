//! The dependency rules between the workspace's crates, as data, checked
//! over what `cargo metadata` reports (ARCHITECTURE.md states them):
//!
//! 1. A service crate (`services/`) depends, for its library and binaries,
//!    on shared crates (`shared/`) only, never on another service; its tests
//!    may also use the test crates (`tests/`). The all-in-one binary is the
//!    one composition root allowed to link services.
//! 2. A shared crate depends on no service and no test crate, not even in
//!    its own tests.
//! 3. Some crates must not link some libraries at all (their whole normal
//!    dependency closure is searched): `bcd` runs on the machine and speaks
//!    HTTP only, so it links no NATS client; the core and the contracts do
//!    no I/O.

use std::collections::{BTreeSet, HashMap};

/// Where a workspace crate lives, which decides what it may depend on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layer {
    Shared,
    Service,
    Tests,
    /// Outside the three folders: no rule applies.
    Other,
}

/// The crate allowed to depend on services: it starts them all in one
/// process.
pub const COMPOSITION_ROOTS: &[&str] = &["bcm-allinone"];

/// Libraries a crate must not link, anywhere in its normal dependency
/// closure: `(crate, forbidden, why)`.
pub const FORBIDDEN_LINKS: &[(&str, &str, &str)] = &[
    (
        "bcm-bcd",
        "async-nats",
        "bcd speaks HTTP to the control plane; it links no NATS client",
    ),
    ("bcm-core", "tokio", "the core is pure: no I/O"),
    ("bcm-core", "sqlx", "the core is pure: no I/O"),
    ("bcm-core", "async-nats", "the core is pure: no I/O"),
    ("bcm-core", "reqwest", "the core is pure: no I/O"),
    ("bcm-core", "axum", "the core is pure: no I/O"),
    ("bcm-core", "hyper", "the core is pure: no I/O"),
    ("bcm-contracts", "tokio", "the contracts are types: no I/O"),
    ("bcm-contracts", "sqlx", "the contracts are types: no I/O"),
    (
        "bcm-contracts",
        "async-nats",
        "the contracts are types: no I/O",
    ),
    (
        "bcm-contracts",
        "reqwest",
        "the contracts are types: no I/O",
    ),
];

/// Why `cargo metadata`'s output cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("cargo metadata: {0}")]
pub struct MetadataError(String);

/// How a dependency is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum DepKind {
    Normal,
    Build,
    Dev,
}

/// One package.
#[derive(Debug, Clone)]
pub struct Package {
    pub id: String,
    pub name: String,
    pub manifest_path: String,
}

/// What the rules look at: the packages, which are workspace members, and
/// the resolved dependency edges `(from id, to id, kind)`.
#[derive(Debug, Clone, Default)]
pub struct Metadata {
    pub workspace_root: String,
    pub packages: Vec<Package>,
    pub members: BTreeSet<String>,
    pub edges: Vec<(String, String, DepKind)>,
}

#[derive(serde::Deserialize)]
struct RawMeta {
    workspace_root: String,
    workspace_members: Vec<String>,
    packages: Vec<RawPackage>,
    resolve: Option<RawResolve>,
}

#[derive(serde::Deserialize)]
struct RawPackage {
    id: String,
    name: String,
    manifest_path: String,
}

#[derive(serde::Deserialize)]
struct RawResolve {
    nodes: Vec<RawNode>,
}

#[derive(serde::Deserialize)]
struct RawNode {
    id: String,
    #[serde(default)]
    deps: Vec<RawDep>,
}

#[derive(serde::Deserialize)]
struct RawDep {
    pkg: String,
    #[serde(default)]
    dep_kinds: Vec<RawDepKind>,
}

#[derive(serde::Deserialize)]
struct RawDepKind {
    kind: Option<String>,
}

impl Metadata {
    /// Reads `cargo metadata --format-version 1` output.
    pub fn parse(json: &[u8]) -> Result<Self, MetadataError> {
        let raw: RawMeta =
            serde_json::from_slice(json).map_err(|e| MetadataError(e.to_string()))?;
        let resolve = raw
            .resolve
            .ok_or_else(|| MetadataError("no resolve graph (run without --no-deps)".into()))?;
        let mut edges = vec![];
        for node in resolve.nodes {
            for dep in node.deps {
                for k in dep.dep_kinds {
                    let kind = match k.kind.as_deref() {
                        None => DepKind::Normal,
                        Some("build") => DepKind::Build,
                        Some("dev") => DepKind::Dev,
                        Some(other) => {
                            return Err(MetadataError(format!("unknown dependency kind {other:?}")))
                        }
                    };
                    edges.push((node.id.clone(), dep.pkg.clone(), kind));
                }
            }
        }
        Ok(Metadata {
            workspace_root: raw.workspace_root,
            packages: raw
                .packages
                .into_iter()
                .map(|p| Package {
                    id: p.id,
                    name: p.name,
                    manifest_path: p.manifest_path,
                })
                .collect(),
            members: raw.workspace_members.into_iter().collect(),
            edges,
        })
    }

    /// The workspace's own packages.
    pub fn members(&self) -> Vec<&Package> {
        self.packages
            .iter()
            .filter(|p| self.members.contains(&p.id))
            .collect()
    }

    /// The layer of a workspace package, from its path under the root.
    pub fn layer(&self, p: &Package) -> Layer {
        if !self.members.contains(&p.id) {
            return Layer::Other;
        }
        let rel = p
            .manifest_path
            .strip_prefix(&self.workspace_root)
            .unwrap_or(&p.manifest_path)
            .trim_start_matches('/');
        match rel.split('/').next() {
            Some("shared") => Layer::Shared,
            Some("services") => Layer::Service,
            Some("tests") => Layer::Tests,
            _ => Layer::Other,
        }
    }
}

/// One broken rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub from: String,
    pub to: String,
    pub rule: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} -> {}: {}", self.from, self.to, self.rule)
    }
}

/// Every broken rule, sorted.
pub fn check(meta: &Metadata) -> Vec<Violation> {
    let by_id: HashMap<&str, &Package> = meta.packages.iter().map(|p| (p.id.as_str(), p)).collect();
    let mut out = vec![];
    for (from, to, kind) in &meta.edges {
        let (Some(f), Some(t)) = (by_id.get(from.as_str()), by_id.get(to.as_str())) else {
            continue;
        };
        let rule = match (meta.layer(f), meta.layer(t), kind) {
            (Layer::Service, Layer::Service, DepKind::Normal | DepKind::Build)
                if !COMPOSITION_ROOTS.contains(&f.name.as_str()) =>
            {
                Some("a service depends on shared crates only, never on another service")
            }
            (Layer::Service, Layer::Service, DepKind::Dev)
                if !COMPOSITION_ROOTS.contains(&f.name.as_str()) =>
            {
                Some("a service's tests reach other services through the test crates, not directly")
            }
            (Layer::Service, Layer::Tests, DepKind::Normal | DepKind::Build) => {
                Some("only tests may depend on a test crate")
            }
            (Layer::Shared, Layer::Service, _) => Some("a shared crate never depends on a service"),
            (Layer::Shared, Layer::Tests, _) => {
                Some("a shared crate never depends on a test crate (it would reach the services)")
            }
            _ => None,
        };
        if let Some(rule) = rule {
            out.push(Violation {
                from: f.name.clone(),
                to: t.name.clone(),
                rule: rule.to_owned(),
            });
        }
    }
    for (krate, forbidden, why) in FORBIDDEN_LINKS {
        let Some(root) = meta
            .packages
            .iter()
            .find(|p| p.name == *krate && meta.members.contains(&p.id))
        else {
            continue;
        };
        if let Some(path) = linked_path(meta, &by_id, &root.id, forbidden) {
            out.push(Violation {
                from: krate.to_string(),
                to: forbidden.to_string(),
                rule: format!("{why} (linked through {})", path.join(" -> ")),
            });
        }
    }
    out.sort_by(|a, b| (&a.from, &a.to).cmp(&(&b.from, &b.to)));
    out.dedup();
    out
}

/// The chain of crates through which `root` links `target` (normal
/// dependencies only), if it does.
fn linked_path(
    meta: &Metadata,
    by_id: &HashMap<&str, &Package>,
    root: &str,
    target: &str,
) -> Option<Vec<String>> {
    let mut parent: HashMap<&str, &str> = HashMap::new();
    let mut queue = std::collections::VecDeque::from([root]);
    let mut seen = BTreeSet::from([root]);
    while let Some(id) = queue.pop_front() {
        if by_id.get(id).is_some_and(|p| p.name == target) {
            let mut path = vec![];
            let mut at = id;
            while let Some(p) = by_id.get(at) {
                path.push(p.name.clone());
                match parent.get(at) {
                    Some(up) => at = up,
                    None => break,
                }
            }
            path.reverse();
            return Some(path);
        }
        for (from, to, kind) in &meta.edges {
            if from == id && *kind == DepKind::Normal && seen.insert(to.as_str()) {
                parent.insert(to.as_str(), id);
                queue.push_back(to.as_str());
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A workspace of `members` (name, folder) plus external crates, with
    /// `edges` (from, to, kind) by name.
    fn meta(
        members: &[(&str, &str)],
        external: &[&str],
        edges: &[(&str, &str, DepKind)],
    ) -> Metadata {
        let id = |n: &str| format!("id-{n}");
        let mut packages: Vec<Package> = members
            .iter()
            .map(|(n, dir)| Package {
                id: id(n),
                name: n.to_string(),
                manifest_path: format!("/ws/{dir}/{n}/Cargo.toml"),
            })
            .collect();
        packages.extend(external.iter().map(|n| Package {
            id: id(n),
            name: n.to_string(),
            manifest_path: format!("/registry/{n}/Cargo.toml"),
        }));
        Metadata {
            workspace_root: "/ws".into(),
            members: members.iter().map(|(n, _)| id(n)).collect(),
            packages,
            edges: edges.iter().map(|(f, t, k)| (id(f), id(t), *k)).collect(),
        }
    }

    fn workspace(extra: &[(&str, &str, DepKind)]) -> Metadata {
        let mut edges = vec![
            ("bcm-api", "bcm-db", DepKind::Normal),
            ("bcm-api", "bcm-testkit", DepKind::Dev),
            ("bcm-testkit", "bcm-api", DepKind::Normal),
            ("bcm-allinone", "bcm-api", DepKind::Normal),
            ("bcm-db", "sqlx", DepKind::Normal),
            ("bcm-bcd", "bcm-contracts", DepKind::Normal),
            ("bcm-bcd", "reqwest", DepKind::Normal),
            ("bcm-bcd", "bcm-testkit", DepKind::Dev),
            ("bcm-testkit", "async-nats", DepKind::Normal),
        ];
        edges.extend_from_slice(extra);
        meta(
            &[
                ("bcm-core", "shared"),
                ("bcm-contracts", "shared"),
                ("bcm-db", "shared"),
                ("bcm-bus", "shared"),
                ("bcm-api", "services"),
                ("bcm-workflow", "services"),
                ("bcm-bcd", "services"),
                ("bcm-allinone", "services"),
                ("bcm-testkit", "tests"),
            ],
            &["sqlx", "async-nats", "reqwest", "tokio"],
            &edges,
        )
    }

    #[test]
    fn the_workspace_as_it_should_be_passes() {
        assert_eq!(check(&workspace(&[])), vec![]);
    }

    #[test]
    fn a_service_that_links_another_service_fails() {
        let v = check(&workspace(&[("bcm-workflow", "bcm-api", DepKind::Normal)]));
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(
            (v[0].from.as_str(), v[0].to.as_str()),
            ("bcm-workflow", "bcm-api")
        );
        // Its tests may not reach for it directly either.
        let v = check(&workspace(&[("bcm-workflow", "bcm-api", DepKind::Dev)]));
        assert_eq!(v.len(), 1, "{v:?}");
    }

    #[test]
    fn a_shared_crate_that_depends_on_a_service_or_the_test_harness_fails() {
        for (to, kind) in [
            ("bcm-api", DepKind::Normal),
            ("bcm-api", DepKind::Dev),
            ("bcm-testkit", DepKind::Dev),
        ] {
            let v = check(&workspace(&[("bcm-db", to, kind)]));
            assert_eq!(v.len(), 1, "{to} {kind:?}: {v:?}");
            assert_eq!(v[0].from, "bcm-db");
        }
    }

    #[test]
    fn bcd_linking_nats_through_any_chain_fails_but_its_tests_may() {
        let v = check(&workspace(&[
            ("bcm-bcd", "bcm-bus", DepKind::Normal),
            ("bcm-bus", "async-nats", DepKind::Normal),
        ]));
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(
            v[0].rule.contains("bcm-bcd -> bcm-bus -> async-nats"),
            "{}",
            v[0]
        );
        // The test harness it dev-depends on links NATS: that is fine.
        assert!(check(&workspace(&[])).is_empty());
    }

    #[test]
    fn io_in_the_core_or_the_contracts_fails() {
        let v = check(&workspace(&[("bcm-contracts", "tokio", DepKind::Normal)]));
        assert_eq!(v.len(), 1, "{v:?}");
        let v = check(&workspace(&[("bcm-core", "bcm-db", DepKind::Normal)]));
        assert!(
            v.iter().any(|x| x.from == "bcm-core" && x.to == "sqlx"),
            "{v:?}"
        );
    }

    #[test]
    fn real_cargo_metadata_output_parses() {
        let json = br#"{"workspace_root":"/ws","workspace_members":["a 0.1.0 (path+file:///ws/shared/a)"],
            "packages":[{"id":"a 0.1.0 (path+file:///ws/shared/a)","name":"a","manifest_path":"/ws/shared/a/Cargo.toml"}],
            "resolve":{"nodes":[{"id":"a 0.1.0 (path+file:///ws/shared/a)","deps":[]}]}}"#;
        let m = Metadata::parse(json).expect("parses");
        assert_eq!(m.members().len(), 1);
        assert_eq!(m.layer(m.members()[0]), Layer::Shared);
        assert!(Metadata::parse(b"{}").is_err());
    }
}
