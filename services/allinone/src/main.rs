//! `bcm`: the whole control plane in one process with a simulated site.

/// mimalloc: many small short-lived allocations (rows, JSON, HTTP) are
/// cheaper than with glibc's allocator (measured by bench-lifecycle).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::Parser;

/// Every service in one process, with a simulated site.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// A TOML configuration file (see deploy/config/bcm.example.toml).
    #[arg(long, env = "BCM_ALL_CONFIG")]
    config: Option<std::path::PathBuf>,
    /// Enroll this many simulated machines, bring them to ready, deploy one
    /// and release it; 0 skips the demo.
    #[arg(long, default_value_t = 8)]
    sim_machines: usize,
    /// Tenant and pool of the demo.
    #[arg(long, default_value = "root")]
    tenant: String,
    #[arg(long, default_value = "default")]
    pool: String,
    /// Append log lines to this file instead of the terminal (overrides
    /// `api.telemetry.log_file`), so the terminal shows only the demo.
    #[arg(long, env = "BCM_LOG_FILE")]
    log_file: Option<std::path::PathBuf>,
    /// Log to the terminal even when a log file is configured.
    #[arg(long)]
    verbose: bool,
    /// A text to print once the demo is done (`local.sh` puts the URL, the
    /// token and where the logs are in it, so they do not scroll away).
    #[arg(long)]
    summary_file: Option<std::path::PathBuf>,
    /// Which services to run (all by default), e.g. `--services workflow,reconciler`.
    #[arg(long, value_enum, value_delimiter = ',')]
    services: Vec<bcm_allinone::Service>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Writes an nkey seed for each bus identity (the control plane's
    /// services and, per site, its bmc, boot and simulated services) that
    /// has none yet in DIR, and the NATS server's configuration of them
    /// (`auth.conf`, an `authorization` block; `users.conf`, its entries);
    /// and the join keys: the control plane's `join.key`, and per site
    /// `join-<site>.key` for its boot service (derived from `join.key`).
    NatsAuth {
        /// Where the seeds and the server configuration go.
        #[arg(long)]
        dir: std::path::PathBuf,
        /// A site to make identities for (repeatable).
        #[arg(long = "site", required = true)]
        sites: Vec<bcm_core::SiteId>,
        /// The subject namespace of the control plane, if any.
        #[arg(long)]
        namespace: Option<String>,
    },
    /// Writes a local CA (`ca.crt`) and a server certificate signed by it
    /// (`api.crt`, `api.key` 0600) for the API's HTTPS into DIR, unless
    /// they are there already: for local use, where no CA of your own
    /// issues one. Clients pin `ca.crt`.
    LocalTls {
        /// Where the files go.
        #[arg(long)]
        dir: std::path::PathBuf,
        /// A DNS name or IP address the API is reached by (repeatable).
        #[arg(long = "name", required = true)]
        names: Vec<String>,
    },
    /// Writes the destructive-batch quorum's local keys into DIR, keeping
    /// those there: the control plane's policy key (`policy.key`, for
    /// `api.quorum.policy_key_file`), approver keys (`approver-<n>.key`,
    /// for `metalctl batch approve --key`) and the site's trust anchor
    /// naming them (`anchor.json`, for the bmc, boot and simulated
    /// services' `quorum_anchor_file`). Prints the anchor's path.
    QuorumKeys {
        #[arg(long)]
        dir: std::path::PathBuf,
        /// Approver keys to make.
        #[arg(long, default_value_t = 3)]
        approvers: usize,
        /// Distinct approvers a batch needs at the site's edges.
        #[arg(long, default_value_t = 2)]
        quorum: usize,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(Command::NatsAuth {
        dir,
        sites,
        namespace,
    }) = &args.command
    {
        let subjects = bcm_bus::Subjects::new(namespace.clone(), 16);
        let made = bcm_bus::auth::generate(dir, &subjects, sites)?;
        let sites: Vec<&str> = sites.iter().map(|s| s.as_str()).collect();
        bcm_pki::join_key::write_keys(dir, &sites)?;
        println!("{}", made.authorization.display());
        return Ok(());
    }
    if let Some(Command::QuorumKeys {
        dir,
        approvers,
        quorum,
    }) = &args.command
    {
        let w = bcm_quorum::files::write_missing(dir, *approvers, *quorum)?;
        println!("{}", w.anchor.display());
        return Ok(());
    }
    if let Some(Command::LocalTls { dir, names }) = &args.command {
        let files = bcm_pki::tls::LocalTls::write_missing(dir, names)?;
        println!("{}", files.ca.display());
        return Ok(());
    }
    let mut cfg = bcm_allinone::Config::load(args.config.as_deref())?;
    if args.log_file.is_some() {
        cfg.api.telemetry.log_file = args.log_file.clone();
    }
    if args.verbose {
        cfg.api.telemetry.log_file = None;
    }
    // The demo trusts the CA the simulated agents pin.
    let demo_http = match &cfg.sim.api_ca_file {
        Some(path) => bcm_pki::tls::client_pinned_to_file(path)?,
        None => reqwest::Client::new(),
    };
    bcm_telemetry::init(&service_name(&args.services), &cfg.api.telemetry)?;
    let listener = tokio::net::TcpListener::bind(cfg.api.listen).await?;
    let token = secrecy::ExposeSecret::expose_secret(&cfg.api.admin_token).to_owned();
    let shutdown = bcm_telemetry::signals::shutdown_token();
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let services = if args.services.is_empty() {
        bcm_allinone::Service::ALL.to_vec()
    } else {
        args.services.clone()
    };
    // The demo drives the simulated site through the API: without both
    // (a real site's control plane) there is nothing to show.
    let with_demo = services.contains(&bcm_allinone::Service::Api)
        && services.contains(&bcm_allinone::Service::Sim);
    // The API serves `/metrics` itself; a process without it serves them
    // on `api.telemetry.metrics_listen`, where one is given, as the
    // services' own binaries do.
    if !services.contains(&bcm_allinone::Service::Api) {
        if let Some(listen) = cfg.api.telemetry.metrics_listen {
            bcm_telemetry::spawn_metrics(listen, shutdown.clone()).await?;
        }
    }
    let server = tokio::spawn(async move {
        bcm_allinone::run(cfg, &services, listener, ready_tx, shutdown.clone()).await
    });
    let Ok(base) = ready_rx.await else {
        // It stopped before it was ready: its own error says why.
        let ran = server.await?;
        bcm_telemetry::shutdown();
        return ran.map_err(anyhow::Error::from);
    };
    if args.sim_machines > 0 && with_demo {
        let client = bcm_allinone::demo::Client::new(demo_http, &base, &token);
        if let Err(e) =
            bcm_allinone::demo::run(&client, &args.tenant, &args.pool, args.sim_machines).await
        {
            eprintln!("demo failed: {e:#}");
        }
    }
    match args
        .summary_file
        .as_deref()
        .and_then(|f| std::fs::read_to_string(f).ok())
    {
        Some(summary) => print!("{summary}"),
        None => println!(
            "the API stays up on {base}; try: metalctl --api {base} list   (Ctrl-C stops everything)"
        ),
    }
    server.await??;
    bcm_telemetry::shutdown();
    Ok(())
}

/// The name a process's spans carry: `bcm` with every service, else
/// `bcm-<service>[+<service>…]` (Jaeger tells the processes apart by it).
fn service_name(services: &[bcm_allinone::Service]) -> String {
    use clap::ValueEnum as _;
    if services.is_empty() {
        return "bcm".to_owned();
    }
    let names: Vec<String> = services
        .iter()
        .filter_map(|s| s.to_possible_value().map(|v| v.get_name().to_owned()))
        .collect();
    format!("bcm-{}", names.join("+"))
}
