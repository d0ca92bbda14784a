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

#[tokio::test]
async fn site_services_opening_their_buckets_as_nats_restarts_wait_for_it() {
    let mut server = AuthServer::start(&["a"]).await.expect("server");
    let site: bcm_core::SiteId = "a".parse().expect("site");
    bcm_bus::Bus::connect(&server.bus_config("api"))
        .await
        .expect("the control plane makes the streams");
    let attach = |identity: &str| {
        let cfg = server.bus_config(identity);
        async move { bcm_bus::Bus::attach(&cfg).await.expect("attach") }
    };
    let (bmc, sim, boot) = (
        attach("bmc-a").await,
        attach("sim-a").await,
        attach("boot-a").await,
    );
    server.crash();
    let runs_name = bmc.subjects().kv_bucket("bmc_runs", &site);
    let runs = tokio::spawn(async move {
        bcm_bus::kv::Bucket::open_expiring(&bmc, &runs_name, Duration::from_secs(60)).await
    });
    let sim_name = sim.subjects().kv_bucket("sim", &site);
    let machines = tokio::spawn(async move { bcm_bus::kv::Bucket::open(&sim, &sim_name).await });
    let boot_site = site.clone();
    let entries = tokio::spawn(async move {
        bcm_boot::commands::buckets(&boot, &boot_site, Duration::from_secs(30))
            .await
            .map(|_| ())
    });
    // Long enough for a first attempt's request to time out (10 s).
    tokio::time::sleep(Duration::from_secs(20)).await;
    for (what, finished) in [
        ("bmc_runs", runs.is_finished()),
        ("sim", machines.is_finished()),
        ("boot_entries", entries.is_finished()),
    ] {
        assert!(!finished, "opening {what} gave up during the outage");
    }
    server.restart().await.expect("restart");
    let within = Duration::from_secs(60);
    let runs = tokio::time::timeout(within, runs)
        .await
        .expect("bmc_runs opens once NATS is back")
        .expect("task")
        .expect("bmc_runs opened");
    assert_eq!(
        runs.max_age().await.expect("max age"),
        Some(Duration::from_secs(60))
    );
    tokio::time::timeout(within, machines)
        .await
        .expect("sim opens once NATS is back")
        .expect("task")
        .expect("sim opened");
    tokio::time::timeout(within, entries)
        .await
        .expect("the boot buckets open once NATS is back")
        .expect("task")
        .expect("boot buckets opened");
}

#[tokio::test]
async fn a_bucket_name_that_is_refused_is_an_error_at_once_not_a_wait() {
    let server = AuthServer::start(&["a"]).await.expect("server");
    bcm_bus::Bus::connect(&server.bus_config("api"))
        .await
        .expect("the control plane makes the streams");
    // An invalid bucket name is refused (by the client library, before
    // the server is asked), and the probe of its stream is refused alike:
    // no outage to wait through.
    let bus = bcm_bus::Bus::attach(&server.bus_config("api"))
        .await
        .expect("attach");
    let started = std::time::Instant::now();
    let opened = bcm_bus::kv::Bucket::open(&bus, "not a valid name").await;
    assert!(opened.is_err(), "an invalid bucket name opened");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "a refusal waited {:?} as for an outage",
        started.elapsed()
    );
}
