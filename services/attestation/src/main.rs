//! `bcm-attestation`: the attestation service.

use clap::Parser;
use serde::Deserialize;

/// The attestation service.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// A TOML configuration file; `BCM_ATTEST_*` environment variables override it.
    #[arg(long, env = "BCM_ATTEST_CONFIG")]
    config: Option<std::path::PathBuf>,
}

/// Configuration of the service.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    database_url: String,
    bus: bcm_bus::BusConfig,
    attestation: bcm_attestation::AttestationConfig,
    #[serde(default)]
    telemetry: bcm_telemetry::TelemetryConfig,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let cfg: Config = bcm_config::load(args.config.as_deref(), "BCM_ATTEST_")?;
    bcm_telemetry::init("bcm-attestation", &cfg.telemetry)?;
    let db = bcm_db::Db::connect(&cfg.database_url, 8).await?;
    db.migrate().await?;
    let bus = bcm_bus::Bus::connect(&cfg.bus).await?;
    let shutdown = bcm_telemetry::signals::shutdown_token();
    if let Some(listen) = cfg.telemetry.metrics_listen {
        bcm_telemetry::spawn_metrics(listen, shutdown.clone()).await?;
    }
    let stop = shutdown.clone();
    let drain = bcm_telemetry::signals::DRAIN;
    let ran = bcm_telemetry::signals::drained(
        "attestation",
        &stop,
        drain,
        bcm_attestation::run(db, bus, cfg.attestation, shutdown),
    )
    .await
    .unwrap_or(Ok(()));
    bcm_telemetry::shutdown();
    Ok(ran?)
}
