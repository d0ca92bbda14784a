//! `bcm-reconciler`: the metal reconciler service.

use clap::Parser;
use serde::Deserialize;

/// The metal reconciler.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// A TOML configuration file; `BCM_RECONCILER_*` environment variables override it.
    #[arg(long, env = "BCM_RECONCILER_CONFIG")]
    config: Option<std::path::PathBuf>,
}

/// Configuration of the service.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    database_url: String,
    bus: bcm_bus::BusConfig,
    #[serde(default)]
    reconciler: bcm_reconciler::ReconcilerConfig,
    #[serde(default)]
    telemetry: bcm_telemetry::TelemetryConfig,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let cfg: Config = bcm_config::load(args.config.as_deref(), "BCM_RECONCILER_")?;
    bcm_telemetry::init("bcm-reconciler", &cfg.telemetry)?;
    let db = bcm_db::Db::connect(&cfg.database_url, 16).await?;
    db.migrate().await?;
    let bus = bcm_bus::Bus::connect(&cfg.bus).await?;
    let shutdown = bcm_telemetry::signals::shutdown_token();
    if let Some(listen) = cfg.telemetry.metrics_listen {
        bcm_telemetry::spawn_metrics(listen, shutdown.clone()).await?;
    }
    let stop = shutdown.clone();
    let drain = bcm_telemetry::signals::DRAIN;
    bcm_telemetry::signals::drained(
        "reconciler",
        &stop,
        drain,
        bcm_reconciler::run(db, bus, cfg.reconciler, shutdown),
    )
    .await;
    bcm_telemetry::shutdown();
    Ok(())
}
