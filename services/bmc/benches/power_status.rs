//! Power-status reads per second against the real BMC peers, with 50 nodes:
//! sushy-emulator with 50 fake systems (auth on), and ipmi_sim (one BMC,
//! read by 50 clients, as 50 nodes behind one address would be). Prints one
//! JSON line per peer: operations/s and latency p50/p99.
//!
//! `eval "$(tests/peers/install.sh)"; cargo bench -p bcm-bmc --bench power_status`

#[path = "../tests/peers/mod.rs"]
mod peers;

use bcm_bmc::driver::{Driver, DriverSettings};
use bcm_core::BmcDriver;
use futures::StreamExt as _;
use std::sync::Arc;
use std::time::Instant;

const NODES: usize = 50;
const ROUNDS: usize = 10;
const CONCURRENCY: usize = 16;

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[(((sorted.len() - 1) as f64) * p).round() as usize]
}

async fn measure(name: &str, drivers: Vec<Arc<Driver>>) {
    let started = Instant::now();
    let mut lat: Vec<f64> = futures::stream::iter((0..ROUNDS).flat_map(|_| drivers.clone()))
        .map(|d| async move {
            let t = Instant::now();
            d.power_state()
                .await
                .map(|_| t.elapsed().as_secs_f64() * 1000.0)
        })
        .buffer_unordered(CONCURRENCY)
        .filter_map(|r| async move {
            match r {
                Ok(ms) => Some(ms),
                Err(e) => {
                    eprintln!("{name}: {e}");
                    None
                }
            }
        })
        .collect()
        .await;
    let secs = started.elapsed().as_secs_f64();
    lat.sort_by(f64::total_cmp);
    println!(
        "{}",
        serde_json::json!({
            "peer": name, "nodes": NODES, "operations": lat.len(), "concurrency": CONCURRENCY,
            "opsPerSecond": lat.len() as f64 / secs,
            "latencyMs": {"p50": percentile(&lat, 0.5), "p99": percentile(&lat, 0.99)},
        })
    );
}

#[tokio::main]
async fn main() {
    let settings = DriverSettings::default();
    let sushy = peers::Sushy::start(NODES).await;
    let drivers = (1..=NODES)
        .map(|i| {
            Driver::open(
                BmcDriver::Redfish,
                &sushy.system_address(i),
                sushy.username.clone().into(),
                sushy.password.clone().into(),
                &settings,
                None,
            )
            .map(Arc::new)
            .expect("driver")
        })
        .collect();
    measure("sushy-emulator (Redfish; basic auth, bcrypt per request: sushy-tools has no SessionService)", drivers).await;
    drop(sushy);

    let sim = peers::IpmiSim::start().await;
    let drivers = (0..NODES)
        .map(|_| {
            Driver::open(
                BmcDriver::Ipmi,
                &sim.address(),
                sim.username.clone().into(),
                sim.password.clone().into(),
                &settings,
                None,
            )
            .map(Arc::new)
            .expect("driver")
        })
        .collect();
    measure("ipmi_sim (ipmitool lanplus)", drivers).await;
}
