//! What the bus's tests share: a bus under a namespace of its own.

use bcm_bus::{Bus, BusConfig};

/// A bus under a namespace of its own (`t<tag><nanos>`) on the `NATS_URL`
/// server.
pub async fn bus(tag: &str) -> Bus {
    let url = std::env::var("NATS_URL").expect("NATS_URL (the test command starts a nats-server)");
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let mut cfg = BusConfig::new(url);
    cfg.namespace = Some(format!("t{tag}{nanos}"));
    Bus::connect(&cfg).await.expect("connect")
}
