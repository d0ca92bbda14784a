//! `bcm-api`: the metal API service.

use clap::Parser;

/// The metal API: verbs, node views, administration and the outbox relay.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// A TOML configuration file; `BCM_API_*` environment variables override it.
    #[arg(long, env = "BCM_API_CONFIG")]
    config: Option<std::path::PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let cfg = bcm_api::ApiConfig::load(args.config.as_deref())?;
    anyhow::ensure!(
        cfg.join_key.is_set(),
        "join_key.file is required: the control plane's join key (`bcm nats-auth` writes join.key)"
    );
    bcm_telemetry::init("bcm-api", &cfg.telemetry)?;
    let listener = tokio::net::TcpListener::bind(cfg.listen).await?;
    let shutdown = bcm_telemetry::signals::shutdown_token();
    let result = bcm_api::run(cfg, listener, shutdown).await;
    bcm_telemetry::shutdown();
    Ok(result?)
}
