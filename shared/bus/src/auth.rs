//! Who may do what on the bus: NATS's own authentication (an nkey per
//! identity) and, for each identity, subject permissions that allow exactly
//! its job, rendered as the server's `authorization` block.
//!
//! - The control plane's services (`api`, `workflow`, `reconciler`,
//!   `attestation`, and `control` for the all-in-one) create the streams,
//!   publish events, work and commands, and consume everything — but never
//!   publish a site's result: only a site answers for itself.
//! - A site's BMC service (`bmc-<site>`) reads only `cmd.<site>.bmc.>`
//!   through its own durable consumer, publishes only `result.<site>.>` and
//!   its own dead letters, and keeps its own KV bucket; nothing else.
//! - A site's boot service (`boot-<site>`) likewise for `cmd.<site>.site.>`
//!   and its buckets; the simulated site (`sim-<site>`) for the families it
//!   plays. No site identity can create or change a stream, read another
//!   site's commands, or publish a command.
//!
//! Replies go to a per-identity inbox prefix (`_INBOX_<key>`), which only
//! that identity may subscribe to, so one identity never reads another's
//! JetStream deliveries. The permissions are computed from [`Subjects`]
//! (the only place subjects are spelled), so they follow the namespace.

use std::path::{Path, PathBuf};

use bcm_core::SiteId;

use crate::subjects::{StreamKind, Subjects};

/// Errors of identity generation and loading.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("{path}: {why}")]
    Io { path: PathBuf, why: String },
    #[error("{path} does not hold an nkey user seed: {why}")]
    BadSeed { path: PathBuf, why: String },
}

/// A bus identity: what it is for decides what it may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// A control-plane service (its name: `api`, `workflow`, …).
    ControlPlane(String),
    /// The BMC service of a site.
    Bmc(SiteId),
    /// The boot service of a site.
    Boot(SiteId),
    /// The simulated site, playing both site services.
    Sim(SiteId),
}

/// The control plane's services, each with an identity of its own; the
/// all-in-one runs them in one process as `control`.
pub const CONTROL_PLANE: [&str; 5] = ["api", "workflow", "reconciler", "attestation", "control"];

impl Identity {
    /// The file name stem of its seed, e.g. `bmc-lab`.
    pub fn name(&self) -> String {
        match self {
            Identity::ControlPlane(s) => s.clone(),
            Identity::Bmc(site) => format!("bmc-{site}"),
            Identity::Boot(site) => format!("boot-{site}"),
            Identity::Sim(site) => format!("sim-{site}"),
        }
    }

    /// Every identity of a control plane serving `sites`.
    pub fn all_for(sites: &[SiteId]) -> Vec<Identity> {
        let mut out: Vec<Identity> = CONTROL_PLANE
            .iter()
            .map(|s| Identity::ControlPlane((*s).to_owned()))
            .collect();
        for site in sites {
            out.push(Identity::Bmc(site.clone()));
            out.push(Identity::Boot(site.clone()));
            out.push(Identity::Sim(site.clone()));
        }
        out
    }
}

/// What an identity may publish and subscribe to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Permissions {
    pub publish_allow: Vec<String>,
    pub publish_deny: Vec<String>,
    pub subscribe_allow: Vec<String>,
    /// May answer requests it received (the attestation service answers
    /// the API's requests on the API's inbox).
    pub allow_responses: bool,
}

/// The inbox prefix of the identity whose public key is `public_key`: the
/// client uses it for every reply subject, and only it may subscribe there.
pub fn inbox_prefix(public_key: &str) -> String {
    let short: String = public_key.chars().take(20).collect();
    format!("_INBOX_{short}")
}

/// The durable consumer a site service reads its commands with, and the
/// one command filter it may give it.
fn site_consumer(subjects: &Subjects, site: &SiteId, durable: &str, filter: &str) -> Vec<String> {
    let commands = subjects.stream(StreamKind::Commands);
    vec![
        // The account's limits (read before a KV bucket is made).
        "$JS.API.INFO".to_owned(),
        format!("$JS.API.STREAM.INFO.{commands}"),
        format!("$JS.API.CONSUMER.INFO.{commands}.{durable}"),
        // The filter is part of the subject: a site cannot create its
        // consumer over another site's commands.
        format!("$JS.API.CONSUMER.CREATE.{commands}.{durable}.{filter}"),
        format!("$JS.API.CONSUMER.MSG.NEXT.{commands}.{durable}"),
        format!("$JS.ACK.{commands}.{durable}.>"),
        subjects.dead_letter(durable),
        subjects.result(site, ">"),
    ]
}

/// A KV bucket of the identity's own: the bucket's stream API, its
/// subjects and the direct gets.
fn own_bucket(bucket: &str) -> Vec<String> {
    vec![
        format!("$JS.API.*.*.KV_{bucket}"),
        format!("$JS.API.*.*.KV_{bucket}.>"),
        format!("$KV.{bucket}.>"),
    ]
}

/// The BMC service's durable consumer of `site` and its command filter
/// (`bcm_bmc` reads with it; its identity may use no other).
pub fn bmc_consumer(subjects: &Subjects, site: &SiteId) -> (String, String) {
    (
        format!("bmc-{site}"),
        subjects.commands_of_site_family(site, "bmc"),
    )
}

/// The boot service's durable consumer of `site` (shared by every boot
/// process of the site) and its command filter.
pub fn boot_consumer(subjects: &Subjects, site: &SiteId) -> (String, String) {
    (
        format!("boot-{site}"),
        subjects.commands_of_site_family(site, "site"),
    )
}

/// The consumer name and command filter the simulated site uses when it
/// plays `families` of `site` (`bcm_sim::site::run` names them).
pub fn sim_consumer(subjects: &Subjects, site: &SiteId, families: &[&str]) -> (String, String) {
    match families {
        ["site"] => (
            format!("site-{site}-no-bmc"),
            subjects.commands_of_site_family(site, "site"),
        ),
        [one] => (
            format!("site-{site}-{one}-metal"),
            subjects.commands_of_site_family(site, one),
        ),
        _ => (format!("site-{site}"), subjects.commands_of_site(site)),
    }
}

/// The permissions of `identity` whose inbox prefix is `inbox`;
/// `control_inboxes` are the inbox prefixes of the control plane's
/// identities, which a control-plane service may answer on (the
/// attestation service answers the API's requests, also after a reconnect,
/// when the server no longer knows the request it answers).
pub fn permissions(
    subjects: &Subjects,
    identity: &Identity,
    inbox: &str,
    control_inboxes: &[String],
) -> Permissions {
    let own_inbox = format!("{inbox}.>");
    match identity {
        Identity::ControlPlane(_) => Permissions {
            publish_allow: [
                "$JS.API.>".to_owned(),
                "$JS.ACK.>".to_owned(),
                "$JS.FC.>".to_owned(),
                "$KV.>".to_owned(),
                subjects.events_all(),
                subjects.stream_subjects(StreamKind::Work).remove(0),
                subjects.stream_subjects(StreamKind::Commands).remove(0),
                subjects.stream_subjects(StreamKind::DeadLetter).remove(0),
                subjects.attest(">"),
            ]
            .into_iter()
            .chain(control_inboxes.iter().map(|i| format!("{i}.>")))
            .collect(),
            // Only a site answers for itself.
            publish_deny: vec![subjects.results_all()],
            subscribe_allow: vec![own_inbox, subjects.attest(">")],
            allow_responses: true,
        },
        Identity::Bmc(site) => site_permissions(
            subjects,
            site,
            own_inbox,
            &[bmc_consumer(subjects, site)],
            &["bmc_runs"],
        ),
        Identity::Boot(site) => site_permissions(
            subjects,
            site,
            own_inbox,
            &[boot_consumer(subjects, site)],
            &["boot_entries", "boot_lease"],
        ),
        Identity::Sim(site) => {
            let consumers: Vec<(String, String)> =
                [&["bmc", "site"][..], &["bmc"][..], &["site"][..]]
                    .into_iter()
                    .map(|families| sim_consumer(subjects, site, families))
                    .collect();
            site_permissions(subjects, site, own_inbox, &consumers, &["sim", "sim_runs"])
        }
    }
}

/// What a site service may do: read its commands through `consumers`
/// (durable name, filter), answer for its site, keep `buckets`, and
/// subscribe only to its own inbox.
fn site_permissions(
    subjects: &Subjects,
    site: &SiteId,
    own_inbox: String,
    consumers: &[(String, String)],
    buckets: &[&str],
) -> Permissions {
    let mut publish: Vec<String> = consumers
        .iter()
        .flat_map(|(durable, filter)| site_consumer(subjects, site, durable, filter))
        .collect();
    publish.sort();
    publish.dedup();
    for bucket in buckets {
        publish.extend(own_bucket(&subjects.kv_bucket(bucket, site)));
    }
    Permissions {
        publish_allow: publish,
        publish_deny: vec![],
        subscribe_allow: vec![own_inbox],
        allow_responses: false,
    }
}

fn quoted(list: &[String]) -> String {
    let items: Vec<String> = list
        .iter()
        .map(|s| format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\"")))
        .collect();
    format!("[{}]", items.join(", "))
}

/// One entry of the server's `users` list: the identity's public key and
/// its permissions.
pub fn user_entry(
    subjects: &Subjects,
    identity: &Identity,
    public_key: &str,
    control_inboxes: &[String],
) -> String {
    let p = permissions(
        subjects,
        identity,
        &inbox_prefix(public_key),
        control_inboxes,
    );
    let mut publish = format!("allow: {}", quoted(&p.publish_allow));
    if !p.publish_deny.is_empty() {
        publish.push_str(&format!(", deny: {}", quoted(&p.publish_deny)));
    }
    let responses = if p.allow_responses {
        ", allow_responses: true"
    } else {
        ""
    };
    format!(
        "# {name}\n{{ nkey: \"{public_key}\", permissions: {{ publish: {{ {publish} }}, subscribe: {{ allow: {sub} }}{responses} }} }}\n",
        name = identity.name(),
        sub = quoted(&p.subscribe_allow),
    )
}

/// The identities of a control plane and its sites, with their seeds, as
/// written to a directory by [`generate`].
#[derive(Debug)]
pub struct Generated {
    /// `<dir>/users.conf`: the entries of the server's `users` list.
    pub users: PathBuf,
    /// `<dir>/auth.conf`: a whole `authorization` block of those users.
    pub authorization: PathBuf,
    /// Each identity and the file of its seed.
    pub seeds: Vec<(Identity, PathBuf)>,
}

/// Writes a seed file (mode 0600) for each identity of a control plane
/// serving `sites` that has none yet, and the server's configuration of
/// all of them. Seeds already there are kept: running it again after
/// adding a site changes only what the new site needs.
pub fn generate(dir: &Path, subjects: &Subjects, sites: &[SiteId]) -> Result<Generated, AuthError> {
    let io = |path: &Path, e: std::io::Error| AuthError::Io {
        path: path.to_owned(),
        why: e.to_string(),
    };
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    let mut keys = vec![];
    for identity in Identity::all_for(sites) {
        let path = dir.join(format!("{}.nk", identity.name()));
        let key = if path.exists() {
            load_seed(&path)?
        } else {
            let key = nkeys::KeyPair::new_user();
            let seed = key.seed().map_err(|e| AuthError::BadSeed {
                path: path.clone(),
                why: e.to_string(),
            })?;
            write_private(&path, &format!("{seed}\n")).map_err(|e| io(&path, e))?;
            key
        };
        keys.push((identity, path, key.public_key()));
    }
    let control_inboxes: Vec<String> = keys
        .iter()
        .filter(|(i, _, _)| matches!(i, Identity::ControlPlane(_)))
        .map(|(_, _, pk)| inbox_prefix(pk))
        .collect();
    let mut entries = String::new();
    let mut seeds = vec![];
    for (identity, path, pk) in keys {
        entries.push_str(&user_entry(subjects, &identity, &pk, &control_inboxes));
        seeds.push((identity, path));
    }
    let users = dir.join("users.conf");
    std::fs::write(&users, &entries).map_err(|e| io(&users, e))?;
    let authorization = dir.join("auth.conf");
    std::fs::write(
        &authorization,
        format!("# Generated by `bcm nats-auth`; the seeds are beside it.\nauthorization {{\n  users = [\n{entries}  ]\n}}\n"),
    )
    .map_err(|e| io(&authorization, e))?;
    Ok(Generated {
        users,
        authorization,
        seeds,
    })
}

fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    #[cfg(unix)]
    use std::os::unix::fs::OpenOptionsExt;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    opts.mode(0o600);
    let mut f = opts.open(path)?;
    f.write_all(text.as_bytes())
}

/// Reads an nkey user seed from `path`.
pub fn load_seed(path: &Path) -> Result<nkeys::KeyPair, AuthError> {
    let text = std::fs::read_to_string(path).map_err(|e| AuthError::Io {
        path: path.to_owned(),
        why: e.to_string(),
    })?;
    let seed = text.trim();
    let key = nkeys::KeyPair::from_seed(seed).map_err(|e| AuthError::BadSeed {
        path: path.to_owned(),
        why: e.to_string(),
    })?;
    if !key.public_key().starts_with('U') {
        return Err(AuthError::BadSeed {
            path: path.to_owned(),
            why: "not a user key".to_owned(),
        });
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn site(s: &str) -> SiteId {
        s.parse().expect("site")
    }

    #[test]
    fn a_site_may_touch_only_its_own_commands_results_and_buckets() {
        let s = Subjects::new(None, 16);
        let p = permissions(
            &s,
            &Identity::Bmc(site("a")),
            "_INBOX_X",
            &["_INBOX_C".into()],
        );
        assert!(p
            .publish_allow
            .contains(&"$JS.API.CONSUMER.CREATE.BCM_COMMANDS.bmc-a.cmd.a.bmc.>".to_owned()));
        assert!(p.publish_allow.contains(&"result.a.>".to_owned()));
        assert!(p.publish_allow.iter().all(|s| !s.contains(".b.")
            && !s.starts_with("cmd.")
            && !s.contains("STREAM.CREATE.BCM_")
            && s != "$JS.API.>"));
        assert_eq!(p.subscribe_allow, vec!["_INBOX_X.>".to_owned()]);
        assert!(!p.publish_allow.iter().any(|s| s.starts_with("_INBOX")));
        let c = permissions(
            &s,
            &Identity::ControlPlane("api".into()),
            "_INBOX_Y",
            &["_INBOX_C".into()],
        );
        assert_eq!(c.publish_deny, vec!["result.>".to_owned()]);
        assert!(c.publish_allow.contains(&"_INBOX_C.>".to_owned()));
    }

    #[test]
    fn every_site_command_kind_is_within_its_executors_consumer_filter() {
        use bcm_contracts::commands::{CommandKind, Family};
        let s = Subjects::new(None, 16);
        let a = site("a");
        let (_, boot) = boot_consumer(&s, &a);
        let (_, bmc) = bmc_consumer(&s, &a);
        for kind in CommandKind::ALL {
            let subject = s.command(&a, kind.as_str());
            let filter = match kind.family() {
                Family::Site => &boot,
                Family::Bmc => &bmc,
                Family::Agent => continue,
            };
            let prefix = filter.trim_end_matches('>');
            assert!(
                subject.starts_with(prefix),
                "{kind}: {subject} is outside {filter}"
            );
        }
    }

    #[test]
    fn namespaced_permissions_follow_the_namespace() {
        let s = Subjects::new(Some("t1".into()), 16);
        let p = permissions(&s, &Identity::Boot(site("a")), "_INBOX_X", &[]);
        assert!(p.publish_allow.contains(&"t1.result.a.>".to_owned()));
        assert!(p.publish_allow.contains(
            &"$JS.API.CONSUMER.CREATE.BCM_T1_COMMANDS.boot-a.t1.cmd.a.site.>".to_owned()
        ));
        assert!(p
            .publish_allow
            .contains(&"$KV.BCM_T1_BOOT_ENTRIES_A.>".to_owned()));
    }

    #[test]
    fn generation_keeps_seeds_and_refuses_a_bad_one() {
        let dir = std::env::temp_dir().join(format!("bcm-auth-{}", ulid::Ulid::new()));
        let s = Subjects::new(None, 16);
        let first = generate(&dir, &s, &[site("a")]).expect("generate");
        let api = &first.seeds[0].1;
        let before = std::fs::read_to_string(api).expect("seed");
        let again = generate(&dir, &s, &[site("a"), site("b")]).expect("again");
        assert_eq!(std::fs::read_to_string(api).expect("seed"), before);
        assert_eq!(again.seeds.len(), first.seeds.len() + 3);
        let conf = std::fs::read_to_string(&again.authorization).expect("conf");
        assert!(conf.contains("# bmc-b") && conf.contains("\"result.b.>\""));
        std::fs::write(api, "not a seed").expect("write");
        assert!(matches!(load_seed(api), Err(AuthError::BadSeed { .. })));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
