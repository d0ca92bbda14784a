//! `bcm-boot`: the boot service of one site.

use clap::Parser;

/// Proxy DHCP, TFTP and HTTP boot for a site's machines.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// A TOML configuration file; `BCM_BOOT_*` environment variables override it.
    #[arg(long, env = "BCM_BOOT_CONFIG")]
    config: Option<std::path::PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let cfg = bcm_boot::BootConfig::load(args.config.as_deref())?;
    bcm_telemetry::init("bcm-boot", &cfg.telemetry)?;
    let shutdown = bcm_telemetry::signals::shutdown_token();
    if let Some(listen) = cfg.telemetry.metrics_listen {
        bcm_telemetry::spawn_metrics(listen, shutdown.clone()).await?;
    }
    let running = bcm_boot::start(&cfg, shutdown.clone()).await?;
    // Told to stop, its servers finish what they hold within the drain.
    let tasks = running.tasks;
    let servers = async move {
        for t in tasks {
            let _ = t.await;
        }
    };
    let drain = bcm_telemetry::signals::DRAIN;
    bcm_telemetry::signals::drained("boot", &shutdown, drain, servers).await;
    bcm_telemetry::shutdown();
    Ok(())
}
