//! The bus under attack (issue 18, finding 1): every identity connects with
//! its own nkey and the server refuses what its job does not need. Each
//! attack is answered by the server with a permissions violation, and the
//! stream it aimed at is unchanged; beside each, the legitimate use of the
//! same identity works, so the permissions are not simply closed.

use async_nats::jetstream::{self, consumer::pull};
use bcm_bus::subjects::StreamKind;
use bcm_security::AuthServer;
use futures::StreamExt;
use std::time::Duration;

/// Whether the stream of `kind` holds a message on `subject` (read as the
/// control plane).
async fn stored(server: &AuthServer, kind: StreamKind, subject: &str) -> bool {
    let control = bcm_bus::Bus::attach(&server.bus_config("api"))
        .await
        .expect("control");
    let stream = control
        .jetstream()
        .get_stream(server.subjects.stream(kind))
        .await
        .expect("stream");
    stream
        .get_last_raw_message_by_subject(subject)
        .await
        .is_ok()
}

async fn control_plane(server: &AuthServer) -> bcm_bus::Bus {
    // The control plane makes the streams; no site identity could.
    bcm_bus::Bus::connect(&server.bus_config("api"))
        .await
        .expect("the control plane connects and makes the streams")
}

#[tokio::test]
async fn nobody_connects_without_an_identity_the_server_knows() {
    let server = AuthServer::start(&["a"]).await.expect("server");
    let anonymous = async_nats::ConnectOptions::new().connect(&server.url).await;
    assert!(anonymous.is_err(), "an anonymous client was let in");
    let stranger = async_nats::ConnectOptions::new()
        .nkey(nkeys::KeyPair::new_user().seed().expect("seed"))
        .connect(&server.url)
        .await;
    assert!(stranger.is_err(), "an unknown nkey was let in");
    // The generated identities are let in.
    server.client("bmc-a").await.expect("bmc-a connects");
}

#[tokio::test]
async fn a_site_publishes_only_its_own_results_and_the_control_plane_none() {
    let server = AuthServer::start(&["a", "b"]).await.expect("server");
    control_plane(&server).await;
    let site_a = server.client("bmc-a").await.expect("bmc-a");
    let api = server.client("api").await.expect("api");

    // A result in site b's name, from site a's BMC service.
    let forged = server
        .subjects
        .result(&"b".parse().expect("site"), "cmd_forged");
    site_a
        .client
        .publish(forged.clone(), "{}".into())
        .await
        .expect("sent");
    site_a
        .violation(&forged)
        .await
        .expect("refused by the server");
    // And one from the control plane, which never answers for a site.
    let by_api = server
        .subjects
        .result(&"a".parse().expect("site"), "cmd_by_api");
    api.client
        .publish(by_api.clone(), "{}".into())
        .await
        .expect("sent");
    api.violation(&by_api).await.expect("refused by the server");

    // Site a's own result is stored.
    let own = server
        .subjects
        .result(&"a".parse().expect("site"), "cmd_own");
    jetstream::new(site_a.client.clone())
        .publish(own.clone(), "{}".into())
        .await
        .expect("publish")
        .await
        .expect("stored");
    assert!(stored(&server, StreamKind::Results, &own).await);
    assert!(!stored(&server, StreamKind::Results, &forged).await);
    assert!(!stored(&server, StreamKind::Results, &by_api).await);
}

#[tokio::test]
async fn a_forged_bmc_verify_cannot_reach_the_bmc_service() {
    let server = AuthServer::start(&["a", "b"]).await.expect("server");
    let control = control_plane(&server).await;
    let site: bcm_core::SiteId = "a".parse().expect("site");
    let verify = server.subjects.command(&site, "bmc.verify");
    // What an attacker wants: the BMC service opens the credentials and
    // sends them to an address of the attacker's.
    let forged = serde_json::json!({"kind": "bmc.verify", "params": {"bmc": {"address": "https://203.0.113.9"}}});
    for identity in ["boot-a", "sim-a", "bmc-a", "bmc-b", "sim-b"] {
        let peer = server.client(identity).await.expect("peer");
        peer.client
            .publish(verify.clone(), forged.to_string().into())
            .await
            .expect("sent");
        let refused = peer.violation(&verify).await;
        assert!(
            refused.is_ok(),
            "{identity} published a command: {refused:?}"
        );
    }
    assert!(!stored(&server, StreamKind::Commands, &verify).await);

    // The BMC service's own consumer receives only the control plane's
    // command, exactly once.
    let bmc = bcm_bus::Bus::attach(&server.bus_config("bmc-a"))
        .await
        .expect("bmc-a");
    let stream = bmc
        .jetstream()
        .get_stream(server.subjects.stream(StreamKind::Commands))
        .await
        .expect("bmc-a reads its stream's info");
    let consumer = stream
        .get_or_create_consumer(
            "bmc-a",
            pull::Config {
                durable_name: Some("bmc-a".into()),
                filter_subject: server.subjects.commands_of_site_family(&site, "bmc"),
                ..Default::default()
            },
        )
        .await
        .expect("bmc-a makes its own consumer");
    let power = server.subjects.command(&site, "bmc.power");
    control
        .publish_durable(&power, "cmd-1", &[], "{}".into())
        .await
        .expect("the control plane sends a command");
    let mut got = consumer
        .fetch()
        .max_messages(10)
        .expires(Duration::from_secs(2))
        .messages()
        .await
        .expect("fetch");
    let mut subjects = vec![];
    while let Some(m) = got.next().await {
        let m = m.expect("message");
        subjects.push(m.subject.to_string());
        m.ack().await.expect("bmc-a acks its own message");
    }
    assert_eq!(subjects, vec![power]);
}

#[tokio::test]
async fn a_site_reads_nothing_of_another_site_nor_anyones_inbox() {
    let server = AuthServer::start(&["a", "b"]).await.expect("server");
    control_plane(&server).await;
    let peer = server.client("bmc-a").await.expect("bmc-a");
    let site_b: bcm_core::SiteId = "b".parse().expect("site");

    // Core subscriptions to another site's commands, to everything, and to
    // the control plane's inbox (where its JetStream deliveries arrive).
    let api_key = bcm_bus::auth::load_seed(&server.dir.join("api.nk")).expect("api key");
    let api_inbox = format!("{}.>", bcm_bus::auth::inbox_prefix(&api_key.public_key()));
    for subject in [
        server.subjects.commands_of_site(&site_b),
        ">".to_owned(),
        api_inbox,
    ] {
        let _sub = peer.client.subscribe(subject.clone()).await.expect("sent");
        peer.violation(&subject)
            .await
            .expect("refused by the server");
    }

    // A consumer over another site's commands, under its own name or the
    // other site's, or an unnamed one over the whole stream.
    let js = jetstream::new(peer.client.clone());
    let commands = server.subjects.stream(StreamKind::Commands);
    let stream = js.get_stream(&commands).await.expect("stream info");
    for (name, filter) in [
        (
            "bmc-a",
            server.subjects.commands_of_site_family(&site_b, "bmc"),
        ),
        (
            "bmc-b",
            server.subjects.commands_of_site_family(&site_b, "bmc"),
        ),
    ] {
        let made = stream
            .create_consumer(pull::Config {
                durable_name: Some(name.into()),
                filter_subject: filter.clone(),
                ..Default::default()
            })
            .await;
        assert!(made.is_err(), "bmc-a made consumer {name} over {filter}");
    }
    let unnamed = stream.create_consumer(pull::Config::default()).await;
    assert!(unnamed.is_err(), "bmc-a made an unnamed consumer");
    let create = format!("$JS.API.CONSUMER.CREATE.{commands}");
    peer.violation(&create)
        .await
        .expect("refused by the server");

    // Nor may it delete or change a stream.
    let deleted = js.delete_stream(&commands).await;
    assert!(deleted.is_err(), "bmc-a deleted the command stream");
    peer.violation(&format!("$JS.API.STREAM.DELETE.{commands}"))
        .await
        .expect("refused by the server");
}
