//! A service that starts while NATS is down (a restart, a crash) comes up
//! when NATS does, with its streams, instead of exiting: the chaos run
//! restarts processes while nats-server is away.

use bcm_security::AuthServer;
use std::time::Duration;

#[tokio::test]
async fn the_control_plane_started_in_a_nats_outage_makes_its_streams_when_nats_returns() {
    let mut server = AuthServer::start(&["a"]).await.expect("server");
    server.crash();
    let cfg = server.bus_config("api");
    let connecting = tokio::spawn(async move { bcm_bus::Bus::connect(&cfg).await });
    // Long enough that a first attempt's JetStream request times out
    // (here a 20 s outage fails without the wait; 7 s does not).
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert!(
        !connecting.is_finished(),
        "the connect gave up during the outage: {:?}",
        connecting.await
    );
    server.restart().await.expect("restart");
    let bus = tokio::time::timeout(Duration::from_secs(30), connecting)
        .await
        .expect("the connect returns once NATS is back")
        .expect("task")
        .expect("the control plane connects and makes the streams");
    for kind in bcm_bus::subjects::StreamKind::ALL {
        bus.jetstream()
            .get_stream(server.subjects.stream(kind))
            .await
            .expect("every stream exists");
    }
}
