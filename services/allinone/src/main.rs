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
    /// Which services to run (all by default), e.g. `--services workflow,reconciler`.
    #[arg(long, value_enum, value_delimiter = ',')]
    services: Vec<bcm_allinone::Service>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let cfg = bcm_allinone::Config::load(args.config.as_deref())?;
    bcm_telemetry::init("bcm", &cfg.api.telemetry)?;
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
        let client = bcm_allinone::demo::Client::new(&base, &token);
        if let Err(e) =
            bcm_allinone::demo::run(&client, &args.tenant, &args.pool, args.sim_machines).await
        {
            eprintln!("demo failed: {e:#}");
        }
    }
    println!(
        "the API stays up on {base}; try: metalctl --api {base} list   (Ctrl-C stops everything)"
    );
    server.await??;
    bcm_telemetry::shutdown();
    Ok(())
}
