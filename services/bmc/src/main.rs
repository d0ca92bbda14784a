//! `bcm-bmc`: the bmc service of one site.

use clap::Parser;

/// Executes a site's `bmc.*` commands against its BMCs.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// A TOML configuration file; `BCM_BMC_*` environment variables override it.
    #[arg(long, env = "BCM_BMC_CONFIG")]
    config: Option<std::path::PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let cfg = bcm_bmc::BmcConfig::load(args.config.as_deref())?;
    bcm_telemetry::init("bcm-bmc", &cfg.telemetry)?;
    let shutdown = bcm_telemetry::signals::shutdown_token();
    if let Some(listen) = cfg.telemetry.metrics_listen {
        bcm_telemetry::spawn_metrics(listen, shutdown.clone()).await?;
    }
    let (_ctx, task) = bcm_bmc::start(&cfg, cfg.drivers()?, shutdown.clone()).await?;
    tracing::info!(site = %cfg.site, "bmc service running");
    if std::env::var_os(bcm_bmc::rotation::CRASH_AFTER_PHASE1_ENV).is_some() {
        tracing::warn!(
            "TEST HOOK {} is set: this process aborts after the first phase of a password rotation",
            bcm_bmc::rotation::CRASH_AFTER_PHASE1_ENV
        );
    }
    // Told to stop, it finishes what it holds within the drain.
    let drain = bcm_telemetry::signals::DRAIN;
    if let Some(ended) = bcm_telemetry::signals::drained("bmc", &shutdown, drain, task).await {
        ended?;
    }
    bcm_telemetry::shutdown();
    Ok(())
}
