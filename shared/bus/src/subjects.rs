//! Every subject and stream name, in one place. Subjects may carry a
//! namespace prefix so several control planes share a NATS server.
//!
//! - events: `events.<tenantId>.node.enrolled`, `events.<tenantId>.node.provision.<state>`
//! - work: `work.reconcile.<shard>.<nodeId>`
//! - commands: `cmd.<siteId>.<kind>`, results `result.<siteId>.<commandId>`

use bcm_core::{NodeId, SiteId, TenantId};

/// The logical streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamKind {
    /// Events for subscribers: limits retention.
    Events,
    /// Reconcile and workflow work: work-queue retention.
    Work,
    /// Commands to site services: work-queue retention.
    Commands,
    /// Results of commands.
    Results,
    /// Messages durable consumers gave up on (`dlq.<consumer>`): limits
    /// retention, for an operator to read.
    DeadLetter,
}

impl StreamKind {
    /// Every stream.
    pub const ALL: [StreamKind; 5] = [
        StreamKind::Events,
        StreamKind::Work,
        StreamKind::Commands,
        StreamKind::Results,
        StreamKind::DeadLetter,
    ];

    const fn base_name(self) -> &'static str {
        match self {
            StreamKind::Events => "EVENTS",
            StreamKind::Work => "WORK",
            StreamKind::Commands => "COMMANDS",
            StreamKind::Results => "RESULTS",
            StreamKind::DeadLetter => "DEADLETTER",
        }
    }

    const fn root(self) -> &'static str {
        match self {
            StreamKind::Events => "events",
            StreamKind::Work => "work",
            StreamKind::Commands => "cmd",
            StreamKind::Results => "result",
            StreamKind::DeadLetter => "dlq",
        }
    }
}

/// Subject and stream names under an optional namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subjects {
    namespace: Option<String>,
    shards: u32,
}

impl Subjects {
    /// Names under `namespace` (a subject-safe token) with `shards`
    /// reconcile shards.
    pub fn new(namespace: Option<String>, shards: u32) -> Self {
        Self {
            namespace: namespace.filter(|n| !n.is_empty()),
            shards: shards.max(1),
        }
    }

    /// The namespace, if any.
    pub fn namespace(&self) -> Option<&str> {
        self.namespace.as_deref()
    }

    fn p(&self, s: String) -> String {
        match &self.namespace {
            Some(ns) => format!("{ns}.{s}"),
            None => s,
        }
    }

    /// The stream name of `kind`, e.g. `BCM_EVENTS`.
    pub fn stream(&self, kind: StreamKind) -> String {
        match &self.namespace {
            Some(ns) => format!(
                "BCM_{}_{}",
                ns.to_uppercase().replace(['-', '.'], "_"),
                kind.base_name()
            ),
            None => format!("BCM_{}", kind.base_name()),
        }
    }

    /// The subjects a stream captures, e.g. `events.>`.
    pub fn stream_subjects(&self, kind: StreamKind) -> Vec<String> {
        vec![self.p(format!("{}.>", kind.root()))]
    }

    /// An event of `tenant`, e.g. `events.root.node.provision.ready`; `ty`
    /// is the event type (`node.provision.ready`).
    pub fn event(&self, tenant: &TenantId, ty: &str) -> String {
        self.p(format!("events.{tenant}.{ty}"))
    }

    /// Every event of one tenant.
    pub fn events_of_tenant(&self, tenant: &TenantId) -> String {
        self.p(format!("events.{tenant}.>"))
    }

    /// Every `node.provision.*` event of one tenant.
    pub fn provision_events_of_tenant(&self, tenant: &TenantId) -> String {
        self.p(format!("events.{tenant}.node.provision.>"))
    }

    /// Every event.
    pub fn events_all(&self) -> String {
        self.p("events.>".to_owned())
    }

    /// The number of reconcile shards.
    pub fn shards(&self) -> u32 {
        self.shards
    }

    /// The reconcile work subject of a node.
    pub fn reconcile(&self, node: &NodeId) -> String {
        self.p(format!(
            "work.reconcile.{}.{node}",
            shard_of(node, self.shards)
        ))
    }

    /// Every reconcile request of one shard.
    pub fn reconcile_shard(&self, shard: u32) -> String {
        self.p(format!("work.reconcile.{shard}.*"))
    }

    /// A command of `kind` (e.g. `bmc.power`) to the services of `site`.
    pub fn command(&self, site: &SiteId, kind: &str) -> String {
        self.p(format!("cmd.{site}.{kind}"))
    }

    /// Every command to the services of `site`.
    pub fn commands_of_site(&self, site: &SiteId) -> String {
        self.p(format!("cmd.{site}.>"))
    }

    /// Every command of one family (`bmc`, `site`) to `site`:
    /// `cmd.<site>.<family>.>`; each site service consumes its family.
    pub fn commands_of_site_family(&self, site: &SiteId, family: &str) -> String {
        self.p(format!("cmd.{site}.{family}.>"))
    }

    /// A JetStream key-value bucket of `site`, e.g. `BCM_BOOT_ENTRIES_S1`
    /// for `kv_bucket("boot_entries", site)`: bucket names allow only
    /// letters, digits, `_` and `-`.
    pub fn kv_bucket(&self, name: &str, site: &SiteId) -> String {
        match &self.namespace {
            Some(ns) => format!(
                "BCM_{}_{}_{}",
                bucket_token(ns),
                bucket_token(name),
                bucket_token(site.as_str())
            ),
            None => format!("BCM_{}_{}", bucket_token(name), bucket_token(site.as_str())),
        }
    }

    /// Requests to the attestation service: `attest.join`, `attest.rejoin`,
    /// `attest.result`.
    pub fn attest(&self, what: &str) -> String {
        self.p(format!("attest.{what}"))
    }

    /// Every command result.
    pub fn results_all(&self) -> String {
        self.p("result.>".to_owned())
    }

    /// The result of a command.
    pub fn result(&self, site: &SiteId, command: &str) -> String {
        self.p(format!("result.{site}.{command}"))
    }

    /// The site whose identity published the result on `subject`
    /// (`result.<site>.<commandId>`): the only site the bus lets publish
    /// there. `None` for any other subject.
    pub fn site_of_result(&self, subject: &str) -> Option<SiteId> {
        let rest = match &self.namespace {
            Some(ns) => subject.strip_prefix(ns.as_str())?.strip_prefix('.')?,
            None => subject,
        };
        let mut parts = rest.split('.');
        match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some("result"), Some(site), Some(_), None) => site.parse().ok(),
            _ => None,
        }
    }

    /// Where the durable consumer `consumer` puts what it gave up on.
    pub fn dead_letter(&self, consumer: &str) -> String {
        self.p(format!("dlq.{consumer}"))
    }
}

/// The shard of a node: FNV-1a of its id, modulo `shards`. Stable across
/// processes, builds and versions.
pub fn shard_of(node: &NodeId, shards: u32) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in node.to_string().bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h % shards.max(1)
}

/// Every key-value bucket name (the `name` of [`Subjects::kv_bucket`]) a
/// service or the simulated site uses.
pub const KV_BUCKETS: [&str; 5] = ["boot_entries", "boot_lease", "bmc_runs", "sim", "sim_runs"];

/// `s` as a part of a bucket name: letters and digits upper-cased,
/// anything else `_`.
fn bucket_token(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_with_and_without_namespace() {
        let t: TenantId = "root".parse().expect("tenant");
        let plain = Subjects::new(None, 16);
        assert_eq!(
            plain.event(&t, "node.provision.ready"),
            "events.root.node.provision.ready"
        );
        assert_eq!(plain.stream(StreamKind::Events), "BCM_EVENTS");
        let ns = Subjects::new(Some("t-1".into()), 16);
        assert_eq!(
            ns.event(&t, "node.enrolled"),
            "t-1.events.root.node.enrolled"
        );
        assert_eq!(ns.stream(StreamKind::Work), "BCM_T_1_WORK");
        assert_eq!(
            ns.stream_subjects(StreamKind::Commands),
            vec!["t-1.cmd.>".to_owned()]
        );
    }

    #[test]
    fn the_site_of_a_result_is_read_from_its_subject() {
        let ns = Subjects::new(Some("t-1".into()), 16);
        let site: SiteId = "lab".parse().expect("site");
        let subject = ns.result(&site, "cmd_1");
        assert_eq!(ns.site_of_result(&subject), Some(site.clone()));
        assert_eq!(ns.site_of_result("result.lab.cmd_1"), None);
        assert_eq!(ns.site_of_result("t-1.result.lab"), None);
        assert_eq!(ns.site_of_result("t-1.result.lab.cmd_1.x"), None);
        assert_eq!(ns.site_of_result("t-1.cmd.lab.cmd_1"), None);
        let plain = Subjects::new(None, 16);
        assert_eq!(plain.site_of_result("result.lab.cmd_1"), Some(site));
    }

    #[test]
    fn shards_are_stable_and_in_range() {
        let n: NodeId = "node_01jq7x1v1v1v1v1v1v1v1v1v1v".parse().expect("node");
        let s = shard_of(&n, 16);
        assert!(s < 16);
        assert_eq!(s, shard_of(&n, 16));
        let subject = Subjects::new(None, 16).reconcile(&n);
        assert_eq!(subject, format!("work.reconcile.{s}.{n}"));
    }
}
