//! `metalctl`: calls the metal API. Tables for people, `--output json` for
//! scripts; `watch` follows a node's events from JetStream, `events`
//! consumes a tenant's (durably with `--durable`); `completions` prints a
//! shell's completion script.

use anyhow::{bail, Context as _};
use async_nats::jetstream::consumer::{pull, DeliverPolicy};
use clap::{Parser, Subcommand, ValueEnum};
use comfy_table::{presets::UTF8_BORDERS_ONLY, Table};
use futures::StreamExt as _;
use serde_json::{json, Value};

mod bulk;
mod catalog;
mod image;

#[derive(Parser)]
#[command(version, about = "Drive Better Compute Metal from the command line")]
struct Cli {
    /// The API's base URL.
    #[arg(
        long,
        env = "BCM_API_URL",
        default_value = "https://127.0.0.1:8080",
        global = true
    )]
    api: String,
    /// The CA certificate to trust for the API (and nothing else), e.g.
    /// `.bcm/tls/ca.crt` of `deploy/dev/local.sh`; the system's roots when
    /// absent.
    #[arg(long, env = "BCM_CA_FILE", global = true)]
    ca_file: Option<std::path::PathBuf>,
    /// Bearer token.
    #[arg(long, env = "BCM_TOKEN", global = true, hide_env_values = true)]
    token: Option<String>,
    /// Tenant of the nodes.
    #[arg(long, env = "BCM_TENANT", default_value = "root", global = true)]
    tenant: String,
    /// `table` for people, `json` for scripts.
    #[arg(long, short, value_enum, default_value_t = Output::Table, global = true)]
    output: Output,
    /// After a verb, wait (showing progress) until the node settles in a
    /// state that is not a transition (`ready`, `deployed`, `failed`, …);
    /// fails if it settles in `failed`. `rescue` counts as settled as soon
    /// as the node enters it, while its ramdisk may still be coming up (the
    /// API does not show a workflow's progress yet).
    #[arg(long, global = true)]
    wait: bool,
    /// How long `--wait` waits at most.
    #[arg(long, global = true, default_value_t = 1800)]
    wait_secs: u64,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum ImageCmd {
    /// Create an ed25519 signing key in KEY_FILE (never overwritten) and
    /// print its public half for the attestation service's `image_keys`.
    Keygen { key_file: std::path::PathBuf },
    /// Hash IMAGE and print the signed image reference for a deploy profile.
    Sign {
        #[arg(long)]
        key_file: std::path::PathBuf,
        /// Where machines will download it from.
        #[arg(long)]
        url: String,
        /// `raw` or `qcow2`.
        #[arg(long, default_value = "raw")]
        format: String,
        /// Sign a raw image without its block map: machines then stream
        /// and hash its runs of zeros too.
        #[arg(long)]
        no_block_map: bool,
        image: std::path::PathBuf,
    },
    /// Register a signed reference (what `sign` prints) in the tenant's
    /// image catalog as NAME (a registered name never changes).
    Register {
        name: String,
        file: std::path::PathBuf,
    },
    /// The tenant's catalog images.
    List,
    /// One catalog image and each site's cache of it.
    Show { name: String },
    /// Ask a site's boot service to fetch NAME into its cache (through
    /// the site's HTTP proxy when it sets one).
    Prewarm {
        name: String,
        #[arg(long)]
        site: String,
    },
}

/// `metalctl bulk <verb> --pool P --nodes-from FILE --reason TEXT
/// [--wipe MODE] [--expires-in-secs N]` submits VERB (manage, inspect,
/// provide, undeploy, rescue, retire) for the nodes of FILE and prints the
/// digest and what approvers sign; `metalctl bulk watch BATCH` follows it.
#[derive(Subcommand)]
enum BulkCmd {
    /// Follow a bulk: a progress bar, then a per-state summary.
    Watch {
        batch: String,
        /// How often to look, in milliseconds.
        #[arg(long, default_value_t = 1000)]
        every_ms: u64,
    },
    #[command(external_subcommand)]
    Verb(Vec<String>),
}

/// The arguments of `metalctl bulk <verb>`.
#[derive(Parser)]
#[command(name = "metalctl bulk <verb>", no_binary_name = true)]
struct BulkArgs {
    /// manage, inspect, provide, undeploy, rescue or retire.
    verb: String,
    #[arg(long)]
    pool: String,
    /// One node id a line (`#` comments), or a JSON array.
    #[arg(long)]
    nodes_from: std::path::PathBuf,
    /// What approvers read.
    #[arg(long)]
    reason: String,
    /// undeploy: none, quick, secure-erase or crypto-erase.
    #[arg(long)]
    wipe: Option<String>,
    #[arg(long)]
    expires_in_secs: Option<u64>,
}

#[derive(Subcommand)]
enum BatchCmd {
    /// A batch: header, state, approvals, counts per node state and error.
    Show { batch: String },
    /// Bulk batches of the tenant, or every batch naming --node.
    List {
        #[arg(long)]
        node: Option<String>,
    },
    /// Rebuild the batch's root from its leaves and its digest from its
    /// header, then sign as APPROVER with the key in FILE.
    Approve {
        batch: String,
        #[arg(long)]
        approver: String,
        #[arg(long)]
        key: std::path::PathBuf,
        /// The requester's node list: refuse to sign when the batch holds
        /// a node it does not name.
        #[arg(long)]
        nodes_from: Option<std::path::PathBuf>,
    },
    /// Refuse the batch as APPROVER: nothing of it not yet started runs.
    Reject {
        batch: String,
        #[arg(long)]
        approver: String,
        #[arg(long)]
        reason: Option<String>,
    },
    /// Stop the batch: nodes not yet started are left alone; started ones
    /// finish their chains.
    Cancel {
        batch: String,
        #[arg(long)]
        reason: Option<String>,
    },
    /// Create an approver's ed25519 key in KEY_FILE (never overwritten);
    /// prints the public key an administrator registers
    /// (`PUT /api/compute/admin/approvers/{id}`) and the sites' anchors name.
    Keygen { key_file: std::path::PathBuf },
}

#[derive(Subcommand)]
enum ProfilesCmd {
    /// Publish a version (a published version never changes: the same
    /// content again is a no-op, other content is refused).
    Publish { file: std::path::PathBuf },
    /// Every version, or those of one profile id.
    List {
        #[arg(long)]
        id: Option<String>,
    },
    /// One version, with its user data template.
    Show { id: String, version: u32 },
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
enum Output {
    Table,
    Json,
}

#[derive(Subcommand)]
enum Cmd {
    /// Enroll a machine by its BMC.
    Enroll {
        #[arg(long)]
        pool: String,
        /// The BMC driver; default: what the node's hardware profile binds
        /// to management (a driver that contradicts it is refused).
        #[arg(long)]
        driver: Option<String>,
        /// Override the pool's hardware profile for this node.
        #[arg(long)]
        hardware_profile: Option<String>,
        #[arg(long)]
        address: String,
        #[arg(long)]
        username: String,
        /// The BMC password; read from BCM_BMC_PASSWORD when absent.
        #[arg(long, env = "BCM_BMC_PASSWORD", hide_env_values = true)]
        password: String,
        /// Verify the Redfish BMC's TLS against this CA (PEM file).
        #[arg(long, group = "tls")]
        tls_ca_file: Option<std::path::PathBuf>,
        /// Accept exactly the certificate with this SHA-256 fingerprint.
        #[arg(long, group = "tls")]
        tls_pin: Option<String>,
        /// Accept any certificate (a lab only).
        #[arg(long, group = "tls")]
        tls_insecure: bool,
    },
    /// Rotate a node's BMC password in two phases (set on the BMC, log in
    /// with it, then commit); a random one unless BCM_BMC_NEW_PASSWORD is set.
    RotateCredentials {
        node: String,
        #[arg(long, env = "BCM_BMC_NEW_PASSWORD", hide_env_values = true)]
        password: Option<String>,
    },
    /// Images: sign (publisher side, no API call), register in the
    /// tenant's catalog, list, show, pre-warm a site's cache.
    Image {
        #[command(subcommand)]
        cmd: ImageCmd,
    },
    /// Mint a one-time token that adopts a machine with its own OS into a
    /// pool: run `bcd node --api <url> --token <token>` on it.
    JoinToken {
        #[arg(long)]
        pool: String,
        #[arg(long, default_value_t = 3600)]
        ttl_secs: u64,
    },
    /// List nodes.
    List {
        #[arg(long)]
        pool: Option<String>,
        #[arg(long)]
        state: Option<String>,
    },
    /// Show one node.
    Show {
        node: String,
    },
    Manage {
        node: String,
    },
    Inspect {
        node: String,
    },
    Provide {
        node: String,
    },
    Deploy {
        node: String,
        #[arg(long)]
        profile: String,
        #[arg(long, default_value_t = 1)]
        profile_version: u32,
    },
    Undeploy {
        node: String,
        /// quick, secure-erase or crypto-erase; default: the pool's
        /// `releaseWipe`.
        #[arg(long)]
        wipe: Option<String>,
    },
    /// Boots the node's rescue ramdisk: root over SSH with the key of
    /// FILE (an OpenSSH `.pub` file), or the BMC's serial console without.
    Rescue {
        node: String,
        #[arg(long, value_name = "FILE")]
        ssh_public_key: Option<std::path::PathBuf>,
    },
    Unrescue {
        node: String,
    },
    Abort {
        node: String,
        #[arg(long)]
        reason: Option<String>,
    },
    Recover {
        node: String,
    },
    Retire {
        node: String,
    },
    /// on, off, cycle or reset.
    Power {
        node: String,
        action: String,
    },
    /// Consume the tenant's events from JetStream: every one in order, then
    /// (with --follow) new ones as they come. With --durable NAME the
    /// server keeps the position: a restart (Ctrl-C, SIGTERM) goes on after
    /// the last event printed, none lost and none repeated.
    Events {
        /// Keep waiting for new events.
        #[arg(long)]
        follow: bool,
        /// A durable consumer's name (created on first use).
        #[arg(long)]
        durable: Option<String>,
        /// Only events whose type starts with this, e.g. `node.provision.`.
        #[arg(long = "type")]
        type_prefix: Option<String>,
        /// Only events of this node.
        #[arg(long)]
        node: Option<String>,
        #[arg(long, env = "NATS_URL", default_value = "nats://127.0.0.1:4222")]
        nats: String,
        /// The bus namespace of the control plane, if any.
        #[arg(long, env = "BCM_NAMESPACE")]
        namespace: Option<String>,
        /// An nkey seed to connect with (an identity allowed to read events).
        #[arg(long, env = "BCM_NKEY_FILE")]
        nkey_file: Option<std::path::PathBuf>,
    },
    /// A verb over many nodes of a pool under one destructive batch that
    /// approvers sign once (`metal.bulk`): `metalctl bulk <verb> --pool P
    /// --nodes-from FILE --reason TEXT [--wipe MODE] [--expires-in-secs N]`
    /// (verb: manage, inspect, provide, undeploy, rescue, retire) prints
    /// the digest and what approvers sign; `metalctl bulk watch BATCH`
    /// shows its progress.
    Bulk {
        #[command(subcommand)]
        cmd: BulkCmd,
    },
    /// Destructive batches: show, list, approve (signs after checking the
    /// root and digest itself), reject, cancel; keygen for approvers.
    Batch {
        #[command(subcommand)]
        cmd: BatchCmd,
    },
    /// The tenant's deploy profiles: publish a version from a JSON file
    /// (`id`, `version`, `role`, `image`, `userData` or `userDataTemplate`:
    /// nocloud, autoinstall, bcd-preinstalled), list, show.
    Profiles {
        #[command(subcommand)]
        cmd: ProfilesCmd,
    },
    /// The site's hardware profiles: a driver per concern.
    HardwareProfiles,
    /// The tenant's pools and their policy (administrators).
    Pools,
    /// A site's upstream HTTP proxy, which its image cache fetches
    /// through: shown, set to URL (`http://host:port`), or cleared
    /// (administrators).
    SiteProxy {
        site: String,
        url: Option<String>,
        #[arg(long, conflicts_with = "url")]
        clear: bool,
    },
    /// Print a shell completion script, e.g.
    /// `metalctl completions bash > /etc/bash_completion.d/metalctl`.
    Completions {
        shell: clap_complete::Shell,
    },
    /// Follow a node's events from JetStream (history, then live).
    Watch {
        node: String,
        #[arg(long, env = "NATS_URL", default_value = "nats://127.0.0.1:4222")]
        nats: String,
        /// The bus namespace of the control plane, if any.
        #[arg(long, env = "BCM_NAMESPACE")]
        namespace: Option<String>,
    },
}

struct Api {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
}

impl Api {
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<Value> {
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let res = req
            .send()
            .await
            .with_context(|| format!("calling {}", self.base))?;
        let status = res.status();
        let v: Value = res.json().await.unwrap_or(Value::Null);
        if !status.is_success() {
            bail!(
                "{} {}: {}",
                status.as_u16(),
                v["code"].as_str().unwrap_or("ERROR"),
                v["message"].as_str().unwrap_or("")
            );
        }
        Ok(v)
    }
}

fn node_table(nodes: &[Value]) -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_BORDERS_ONLY);
    t.set_header([
        "NODE",
        "POOL",
        "STATE",
        "POWER",
        "MAINT",
        "BMC",
        "MACS",
        "LAST ERROR",
    ]);
    for n in nodes {
        let s = |k: &str| n[k].as_str().unwrap_or("").to_owned();
        let state = match n["failedFrom"].as_str() {
            Some(f) => format!("{} (from {f})", s("provisionState")),
            None => s("provisionState"),
        };
        let macs = n["macs"]
            .as_array()
            .map(|m| {
                m.iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .unwrap_or_default();
        let mut err = s("lastError");
        if err.chars().count() > 60 {
            err = err.chars().take(57).collect::<String>() + "...";
        }
        t.add_row([
            s("nodeId"),
            s("poolId"),
            state,
            s("power"),
            if n["maintenance"] == true {
                "yes".into()
            } else {
                "".into()
            },
            format!(
                "{} {}",
                n["bmc"]["driver"].as_str().unwrap_or(""),
                n["bmc"]["address"].as_str().unwrap_or("")
            ),
            macs,
            err,
        ]);
    }
    t
}

fn print(out: Output, v: &Value) {
    match out {
        Output::Json => emit(serde_json::to_string_pretty(v).unwrap_or_default()),
        Output::Table => {
            let nodes = match v.get("items") {
                Some(items) => items.as_array().cloned().unwrap_or_default(),
                None => vec![v.clone()],
            };
            emit(node_table(&nodes));
        }
    }
}

/// One paragraph of what the ramdisk found: CPUs, memory, disks, NICs.
fn inventory_summary(inv: &Value) -> String {
    let list = |key: &str, f: &dyn Fn(&Value) -> String| {
        inv.get(key)
            .and_then(Value::as_array)
            .map(|a| a.iter().map(f).collect::<Vec<_>>().join(", "))
            .unwrap_or_default()
    };
    let disks = list("disks", &|d| {
        format!(
            "{} {} B",
            d.get("name").and_then(Value::as_str).unwrap_or("?"),
            d.get("sizeBytes").and_then(Value::as_u64).unwrap_or(0)
        )
    });
    let nics = list("nics", &|n| {
        format!(
            "{} {}",
            n.get("name").and_then(Value::as_str).unwrap_or("?"),
            n.get("mac").and_then(Value::as_str).unwrap_or("?")
        )
    });
    format!(
        "inventory: {} CPUs ({}), {} MiB memory\n  disks: {disks}\n  nics: {nics}",
        inv.get("cpus").and_then(Value::as_u64).unwrap_or(0),
        inv.get("cpuModel").and_then(Value::as_str).unwrap_or("?"),
        inv.get("memoryMiB").and_then(Value::as_u64).unwrap_or(0),
    )
}

/// Prints a line; a closed pipe (`metalctl watch | head`) ends quietly.
fn emit(line: impl std::fmt::Display) {
    use std::io::Write as _;
    if writeln!(std::io::stdout(), "{line}").is_err() {
        std::process::exit(0);
    }
}

fn main() -> std::process::ExitCode {
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let http = match &cli.ca_file {
        Some(path) => bcm_pki::tls::client_pinned_to_file(path)?,
        None => reqwest::Client::new(),
    };
    let api = Api {
        http,
        base: cli.api.trim_end_matches('/').to_owned(),
        token: cli.token.clone(),
    };
    let tenant = cli.tenant.as_str();
    match &cli.cmd {
        Cmd::Image {
            cmd: ImageCmd::Register { name, file },
        } => catalog::image_register(&api, cli.output, tenant, name, file).await,
        Cmd::Image {
            cmd: ImageCmd::List,
        } => catalog::image_list(&api, cli.output, tenant).await,
        Cmd::Image {
            cmd: ImageCmd::Show { name },
        } => catalog::image_show(&api, cli.output, tenant, name).await,
        Cmd::Image {
            cmd: ImageCmd::Prewarm { name, site },
        } => catalog::image_prewarm(&api, cli.output, tenant, name, site).await,
        Cmd::Image { cmd } => image_cmd(cmd, cli.output),
        Cmd::SiteProxy { site, url, clear } => {
            let set = match (url, clear) {
                (Some(u), _) => Some(Some(u.as_str())),
                (None, true) => Some(None),
                (None, false) => None,
            };
            catalog::site_proxy(&api, cli.output, site, set).await
        }
        Cmd::JoinToken { pool, ttl_secs } => {
            join_token(&api, cli.output, tenant, pool, *ttl_secs).await
        }
        Cmd::List { pool, state } => {
            list(&api, cli.output, tenant, pool.as_deref(), state.as_deref()).await
        }
        Cmd::Show { node } => show(&api, cli.output, node).await,
        Cmd::Watch {
            node,
            nats,
            namespace,
        } => watch(tenant, node, nats, namespace.clone(), cli.output).await,
        Cmd::Events {
            follow,
            durable,
            type_prefix,
            node,
            nats,
            namespace,
            nkey_file,
        } => {
            let bus = attach(nats, namespace.clone(), nkey_file.clone()).await?;
            let select = EventFilter {
                type_prefix: type_prefix.clone(),
                node: node.clone(),
            };
            events(
                &bus,
                tenant,
                durable.as_deref(),
                *follow,
                &select,
                cli.output,
            )
            .await
        }
        Cmd::Bulk { cmd } => match cmd {
            BulkCmd::Watch { batch, every_ms } => {
                bulk::watch(
                    &api,
                    cli.output,
                    batch,
                    std::time::Duration::from_millis((*every_ms).max(100)),
                )
                .await
            }
            BulkCmd::Verb(args) => {
                let a = BulkArgs::try_parse_from(args)?;
                bulk::submit(
                    &api,
                    cli.output,
                    tenant,
                    &a.verb,
                    &a.pool,
                    &a.nodes_from,
                    a.wipe.as_deref(),
                    &a.reason,
                    a.expires_in_secs,
                )
                .await
            }
        },
        Cmd::Profiles { cmd } => match cmd {
            ProfilesCmd::Publish { file } => catalog::publish(&api, cli.output, tenant, file).await,
            ProfilesCmd::List { id } => {
                catalog::list(&api, cli.output, tenant, id.as_deref()).await
            }
            ProfilesCmd::Show { id, version } => {
                catalog::show(&api, cli.output, tenant, id, *version).await
            }
        },
        Cmd::HardwareProfiles => catalog::hardware_profiles(&api, cli.output).await,
        Cmd::Pools => catalog::pools(&api, cli.output, tenant).await,
        Cmd::Batch { cmd } => match cmd {
            BatchCmd::Show { batch } => bulk::show(&api, cli.output, batch).await,
            BatchCmd::List { node } => bulk::list(&api, cli.output, tenant, node.as_deref()).await,
            BatchCmd::Approve {
                batch,
                approver,
                key,
                nodes_from,
            } => {
                bulk::approve(
                    &api,
                    cli.output,
                    batch,
                    approver,
                    key,
                    nodes_from.as_deref(),
                )
                .await
            }
            BatchCmd::Reject {
                batch,
                approver,
                reason,
            } => {
                bulk::end(
                    &api,
                    cli.output,
                    batch,
                    "reject",
                    Some(approver),
                    reason.as_deref(),
                )
                .await
            }
            BatchCmd::Cancel { batch, reason } => {
                bulk::end(&api, cli.output, batch, "cancel", None, reason.as_deref()).await
            }
            BatchCmd::Keygen { key_file } => {
                emit(image::keygen(key_file)?);
                Ok(())
            }
        },
        Cmd::Completions { shell } => {
            use clap::CommandFactory as _;
            clap_complete::generate(
                *shell,
                &mut Cli::command(),
                "metalctl",
                &mut std::io::stdout(),
            );
            Ok(())
        }
        cmd => {
            let (path, body) = mutation(tenant, cmd)?;
            let v = api.call(reqwest::Method::POST, &path, Some(body)).await?;
            match (cli.wait, v["nodeId"].as_str()) {
                (true, Some(node)) => {
                    let within = std::time::Duration::from_secs(cli.wait_secs);
                    let settled = wait_settled(&api, node, within).await?;
                    print(cli.output, &settled);
                    if settled["provisionState"] == "failed" {
                        bail!("{node} failed: {}", settled["lastError"]);
                    }
                    Ok(())
                }
                _ => {
                    print(cli.output, &v);
                    Ok(())
                }
            }
        }
    }
}

/// Whether a provision state is a transition a workflow is driving
/// (`enrolling`, `deploying`, …) rather than one a node rests in.
fn moving(state: &str) -> bool {
    state.ends_with("ing")
}

/// Polls `node` until it rests in a state that is not a transition, with
/// a spinner on stderr (drawn only at a terminal) naming where it is.
async fn wait_settled(api: &Api, node: &str, within: std::time::Duration) -> anyhow::Result<Value> {
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_style(indicatif::ProgressStyle::with_template(
        "{spinner} {elapsed:>4} {msg}",
    )?);
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    let started = std::time::Instant::now();
    loop {
        let n = api
            .call(
                reqwest::Method::GET,
                &format!("/api/compute/metal/nodes/{node}"),
                None,
            )
            .await?;
        let state = n["provisionState"].as_str().unwrap_or("?").to_owned();
        bar.set_message(format!("{node}  {state}"));
        if !moving(&state) {
            bar.finish_and_clear();
            eprintln!(
                "{node} is {state} after {:.1} s",
                started.elapsed().as_secs_f64()
            );
            return Ok(n);
        }
        if started.elapsed() > within {
            bar.finish_and_clear();
            bail!("{node} is still {state} after {} s", within.as_secs());
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}

/// The path and body of a command that changes something: `enroll` and
/// every verb.
fn mutation(tenant: &str, cmd: &Cmd) -> anyhow::Result<(String, Value)> {
    let verb = |name: &str, node: &str, extra: Value| {
        let mut body = json!({ "tenantId": tenant, "nodeId": node });
        if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
            b.extend(e.clone());
        }
        (format!("/api/compute/metal/{name}"), body)
    };
    Ok(match cmd {
        Cmd::Enroll {
            pool,
            driver,
            hardware_profile,
            address,
            username,
            password,
            tls_ca_file,
            tls_pin,
            tls_insecure,
        } => {
            let mut bmc = json!({"address": address, "username": username, "password": password});
            if let (Some(d), Some(b)) = (driver, bmc.as_object_mut()) {
                b.insert("driver".into(), json!(d));
            }
            if let (Some(t), Some(b)) = (
                tls_policy(tls_ca_file.as_deref(), tls_pin.as_deref(), *tls_insecure)?,
                bmc.as_object_mut(),
            ) {
                b.insert("tls".into(), t);
            }
            ("/api/compute/metal/enroll".to_owned(), {
                let mut body = json!({"tenantId": tenant, "poolId": pool, "bmc": bmc});
                if let (Some(p), Some(b)) = (hardware_profile, body.as_object_mut()) {
                    b.insert("hardwareProfile".into(), json!(p));
                }
                body
            })
        }
        Cmd::RotateCredentials { node, password } => {
            verb("rotateCredentials", node, json!({"password": password}))
        }
        Cmd::Manage { node } => verb("manage", node, json!({})),
        Cmd::Inspect { node } => verb("inspect", node, json!({})),
        Cmd::Provide { node } => verb("provide", node, json!({})),
        Cmd::Deploy {
            node,
            profile,
            profile_version,
        } => verb(
            "deploy",
            node,
            json!({"profileId": profile, "profileVersion": profile_version}),
        ),
        Cmd::Undeploy { node, wipe } => verb("undeploy", node, json!({"wipe": wipe})),
        Cmd::Rescue {
            node,
            ssh_public_key,
        } => {
            let key = match ssh_public_key {
                Some(file) => Some(
                    std::fs::read_to_string(file)
                        .with_context(|| format!("cannot read {}", file.display()))?
                        .trim()
                        .to_owned(),
                ),
                None => None,
            };
            verb("rescue", node, json!({ "sshPublicKey": key }))
        }
        Cmd::Unrescue { node } => verb("unrescue", node, json!({})),
        Cmd::Abort { node, reason } => verb("abort", node, json!({"reason": reason})),
        Cmd::Recover { node } => verb("recover", node, json!({})),
        Cmd::Retire { node } => verb("retire", node, json!({})),
        Cmd::Power { node, action } => verb("power", node, json!({"action": action})),
        Cmd::Image { .. }
        | Cmd::JoinToken { .. }
        | Cmd::List { .. }
        | Cmd::Show { .. }
        | Cmd::Watch { .. }
        | Cmd::Bulk { .. }
        | Cmd::Batch { .. }
        | Cmd::Events { .. }
        | Cmd::Profiles { .. }
        | Cmd::HardwareProfiles
        | Cmd::Pools
        | Cmd::SiteProxy { .. }
        | Cmd::Completions { .. } => {
            anyhow::bail!("not a command that changes anything")
        }
    })
}

/// The `bmc.tls` of an enroll, from the flags.
fn tls_policy(
    ca_file: Option<&std::path::Path>,
    pin: Option<&str>,
    insecure: bool,
) -> anyhow::Result<Option<Value>> {
    Ok(match (ca_file, pin, insecure) {
        (Some(file), _, _) => {
            let pem = std::fs::read_to_string(file)
                .with_context(|| format!("reading {}", file.display()))?;
            Some(json!({"mode": "ca", "caPem": pem}))
        }
        (None, Some(pin), _) => Some(json!({"mode": "pinned", "sha256": pin})),
        (None, None, true) => Some(json!({"mode": "insecure"})),
        _ => None,
    })
}

/// `metalctl image keygen|sign`: the publisher's side, no API call.
fn image_cmd(cmd: &ImageCmd, output: Output) -> anyhow::Result<()> {
    match cmd {
        ImageCmd::Keygen { key_file } => {
            let public = image::keygen(key_file)?;
            match output {
                Output::Json => emit(json!({ "publicKey": public })),
                Output::Table => emit(format!(
                    "public key {public}\n(private key in {}; add the public key to the attestation service's image_keys)",
                    key_file.display()
                )),
            }
        }
        ImageCmd::Sign {
            key_file,
            url,
            format,
            no_block_map,
            image: file,
        } => {
            let r = image::sign(key_file, file, url, format, !no_block_map)?;
            // Both outputs are the reference itself: it is meant to be
            // pasted into a profile.
            emit(serde_json::to_string_pretty(&r).unwrap_or_default());
        }
        ImageCmd::Register { .. }
        | ImageCmd::List
        | ImageCmd::Show { .. }
        | ImageCmd::Prewarm { .. } => anyhow::bail!("an image catalog command calls the API"),
    }
    Ok(())
}

/// `metalctl join-token`: a pool's one-time adopt token, shown once.
async fn join_token(
    api: &Api,
    output: Output,
    tenant: &str,
    pool: &str,
    ttl_secs: u64,
) -> anyhow::Result<()> {
    let body = json!({"tenantId": tenant, "poolId": pool, "ttlSecs": ttl_secs});
    let v = api
        .call(
            reqwest::Method::POST,
            "/api/compute/metal/joinTokens",
            Some(body),
        )
        .await?;
    match output {
        Output::Json => emit(serde_json::to_string_pretty(&v).unwrap_or_default()),
        Output::Table => emit(format!(
            "token {}\npool {}\nexpires {}\n(shown once; run `bcd node --api <control plane> --token <token>` on the machine)",
            v["token"].as_str().unwrap_or_default(),
            v["poolId"].as_str().unwrap_or_default(),
            v["expiresAt"].as_str().unwrap_or_default()
        )),
    }
    Ok(())
}

/// `metalctl list`: every page of the node list.
async fn list(
    api: &Api,
    output: Output,
    tenant: &str,
    pool: Option<&str>,
    state: Option<&str>,
) -> anyhow::Result<()> {
    let mut items = vec![];
    let mut page: Option<String> = None;
    loop {
        let mut q = format!("/api/compute/metal/nodes?tenantId={tenant}&limit=1000");
        if let Some(p) = pool {
            q.push_str(&format!("&poolId={p}"));
        }
        if let Some(s) = state {
            q.push_str(&format!("&state={s}"));
        }
        if let Some(p) = &page {
            q.push_str(&format!("&pageToken={p}"));
        }
        let v = api.call(reqwest::Method::GET, &q, None).await?;
        items.extend(v["items"].as_array().cloned().unwrap_or_default());
        match v["nextPageToken"].as_str() {
            Some(t) => page = Some(t.to_owned()),
            None => break,
        }
    }
    print(output, &json!({ "items": items }));
    Ok(())
}

/// `metalctl show`: one node, with its inventory summarized in a table.
async fn show(api: &Api, output: Output, node: &str) -> anyhow::Result<()> {
    let v = api
        .call(
            reqwest::Method::GET,
            &format!("/api/compute/metal/nodes/{node}"),
            None,
        )
        .await?;
    print(output, &v);
    if output == Output::Table {
        if let Some(inv) = v.get("inventory") {
            emit(inventory_summary(inv));
        }
    }
    Ok(())
}

async fn watch(
    tenant: &str,
    node: &str,
    nats: &str,
    namespace: Option<String>,
    out: Output,
) -> anyhow::Result<()> {
    let bus = attach(nats, namespace, None).await?;
    let tenant: bcm_bus::TenantId = tenant.parse()?;
    let subjects = bus.subjects();
    let stream = bus
        .jetstream()
        .get_stream(subjects.stream(bcm_bus::subjects::StreamKind::Events))
        .await?;
    let consumer = stream
        .create_consumer(pull::Config {
            filter_subject: subjects.events_of_tenant(&tenant),
            deliver_policy: DeliverPolicy::All,
            ack_policy: async_nats::jetstream::consumer::AckPolicy::None,
            inactive_threshold: std::time::Duration::from_secs(30),
            ..Default::default()
        })
        .await?;
    let mut messages = consumer.messages().await?;
    while let Some(msg) = messages.next().await {
        let msg = msg.map_err(|e| anyhow::anyhow!("{e}"))?;
        let Ok(ev) = serde_json::from_slice::<Value>(&msg.payload) else {
            continue;
        };
        if ev["subject"].as_str() != Some(node) {
            continue;
        }
        match out {
            Output::Json => emit(&ev),
            Output::Table => emit(event_line(&ev)),
        }
    }
    Ok(())
}

/// The bus, for reading events (`watch`, `events`).
async fn attach(
    nats: &str,
    namespace: Option<String>,
    nkey_file: Option<std::path::PathBuf>,
) -> anyhow::Result<bcm_bus::Bus> {
    Ok(bcm_bus::Bus::attach(&bcm_bus::BusConfig {
        url: nats.to_owned(),
        namespace,
        shards: 16,
        nkey_file,
    })
    .await?)
}

/// Which events `metalctl events` prints.
struct EventFilter {
    type_prefix: Option<String>,
    node: Option<String>,
}

impl EventFilter {
    fn wants(&self, ev: &Value) -> bool {
        let ty = ev["type"].as_str().unwrap_or("");
        self.type_prefix
            .as_deref()
            .is_none_or(|p| ty.starts_with(p))
            && self
                .node
                .as_deref()
                .is_none_or(|n| ev["subject"].as_str() == Some(n))
    }
}

/// How many events a durable consumer holds unacknowledged at once.
const EVENTS_BATCH: usize = 64;

/// `metalctl events`: the tenant's events in stream order. A durable
/// consumer acknowledges each event once it is printed (and waits for the
/// server to confirm), and hands back what it fetched but did not print
/// when stopped, so the next run starts exactly after the last one printed.
async fn events(
    bus: &bcm_bus::Bus,
    tenant: &str,
    durable: Option<&str>,
    follow: bool,
    select: &EventFilter,
    out: Output,
) -> anyhow::Result<()> {
    use async_nats::jetstream::consumer::AckPolicy;
    let tenant: bcm_bus::TenantId = tenant.parse()?;
    let subjects = bus.subjects();
    let stream = bus
        .jetstream()
        .get_stream(subjects.stream(bcm_bus::subjects::StreamKind::Events))
        .await?;
    let filter_subject = subjects.events_of_tenant(&tenant);
    let consumer = match durable {
        Some(name) => {
            stream
                .get_or_create_consumer(
                    name,
                    pull::Config {
                        durable_name: Some(name.to_owned()),
                        filter_subject,
                        deliver_policy: DeliverPolicy::All,
                        ack_policy: AckPolicy::Explicit,
                        ack_wait: std::time::Duration::from_secs(30),
                        max_ack_pending: EVENTS_BATCH as i64,
                        ..Default::default()
                    },
                )
                .await?
        }
        None => {
            stream
                .create_consumer(pull::Config {
                    filter_subject,
                    deliver_policy: DeliverPolicy::All,
                    ack_policy: AckPolicy::None,
                    inactive_threshold: std::time::Duration::from_secs(30),
                    ..Default::default()
                })
                .await?
        }
    };
    let stop = bcm_telemetry::signals::shutdown_token();
    let wait = std::time::Duration::from_secs(if follow { 5 } else { 1 });
    while !stop.is_cancelled() {
        let mut batch = consumer
            .fetch()
            .max_messages(EVENTS_BATCH)
            .expires(wait)
            .messages()
            .await
            .map_err(|e| anyhow::anyhow!("fetching events: {e}"))?;
        let mut got = 0;
        loop {
            let next = tokio::select! {
                m = batch.next() => m,
                _ = stop.cancelled() => None,
            };
            let Some(msg) = next else {
                if stop.is_cancelled() && durable.is_some() {
                    hand_back(&mut batch).await;
                    // The hand-backs reach the server before this exits.
                    bus.client()
                        .flush()
                        .await
                        .map_err(|e| anyhow::anyhow!("flushing: {e}"))?;
                }
                break;
            };
            let msg = msg.map_err(|e| anyhow::anyhow!("{e}"))?;
            got += 1;
            match serde_json::from_slice::<Value>(&msg.payload) {
                Ok(ev) if select.wants(&ev) => match out {
                    Output::Json => emit(&ev),
                    Output::Table => emit(event_line(&ev)),
                },
                Ok(_) => {}
                Err(e) => eprintln!("skipping an event that is not JSON ({e})"),
            }
            if durable.is_some() {
                msg.double_ack()
                    .await
                    .map_err(|e| anyhow::anyhow!("acknowledging an event: {e}"))?;
            }
        }
        if got == 0 && !follow {
            break;
        }
    }
    Ok(())
}

/// Hands back (`Nak`) what the server already sent of a fetch that will
/// not be printed: redelivered at once, first, to the next run, instead of
/// after the acknowledgement wait.
async fn hand_back(batch: &mut async_nats::jetstream::consumer::pull::Batch) {
    use async_nats::jetstream::AckKind;
    while let Ok(Some(Ok(msg))) =
        tokio::time::timeout(std::time::Duration::from_millis(300), batch.next()).await
    {
        let _ = msg.ack_with(AckKind::Nak(None)).await;
    }
}

/// One event as a line of a table: time, node version, type, what changed.
fn event_line(ev: &Value) -> String {
    let d = &ev["data"];
    let detail = [
        d["provisionState"].as_str(),
        d["profileId"].as_str(),
        d["step"].as_str(),
        d["status"].as_str(),
        d["error"].as_str(),
        d["lastError"].as_str(),
    ]
    .into_iter()
    .flatten()
    .collect::<Vec<_>>()
    .join("  ");
    format!(
        "{}  v{:<4} {:<28} {:<30} {}",
        ev["time"].as_str().unwrap_or(""),
        ev["nodeversion"]
            .as_i64()
            .map(|v| v.to_string())
            .unwrap_or_default(),
        ev["type"].as_str().unwrap_or(""),
        ev["subject"].as_str().unwrap_or(""),
        detail
    )
}
