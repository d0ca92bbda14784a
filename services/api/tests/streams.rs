//! Streams are ensured at start-up; an existing stream with an incompatible
//! configuration stops the service with a clear error and is left intact.

use async_nats::jetstream;
use bcm_bus::subjects::StreamKind;
use bcm_bus::{Bus, BusConfig, BusError, Subjects};

fn config(ns: &str) -> BusConfig {
    BusConfig {
        url: std::env::var("NATS_URL").expect("NATS_URL (run through .ci/run)"),
        namespace: Some(ns.to_owned()),
        shards: 16,
        nkey_file: None,
    }
}

#[tokio::test]
async fn an_incompatible_stream_refuses_start_and_survives() {
    let ns = format!("inc{}", ulid::Ulid::new().to_string().to_lowercase());
    let cfg = config(&ns);
    let client = Bus::attach(&cfg).await.expect("nats").client().clone();
    let js = jetstream::new(client);
    let name = Subjects::new(Some(ns.clone()), 16).stream(StreamKind::Events);
    js.create_stream(jetstream::stream::Config {
        name: name.clone(),
        subjects: vec![format!("{ns}.something-else.>")],
        ..Default::default()
    })
    .await
    .expect("create a conflicting stream");

    let err = Bus::connect(&cfg).await.expect_err("must refuse to start");
    match &err {
        BusError::IncompatibleStream { stream, why } => {
            assert_eq!(stream, &name);
            assert!(why.contains("subjects"), "{why}");
        }
        other => panic!("unexpected error: {other}"),
    }
    assert!(err.to_string().contains("left as it is"), "{err}");
    let still = js
        .get_stream(&name)
        .await
        .expect("the stream was not deleted");
    assert_eq!(
        still.cached_info().config.subjects,
        vec![format!("{ns}.something-else.>")]
    );
}

#[tokio::test]
async fn a_second_start_accepts_the_streams_it_made() {
    let ns = format!("ok{}", ulid::Ulid::new().to_string().to_lowercase());
    Bus::connect(&config(&ns))
        .await
        .expect("first start creates the streams");
    Bus::connect(&config(&ns))
        .await
        .expect("second start accepts them");
}

#[tokio::test]
async fn a_commands_stream_kept_longer_than_the_run_records_refuses_start() {
    // The sites' run records, which keep a redelivered command from running
    // twice, live the commands' retention after their last write: a
    // commands stream that keeps a command longer (here, for good) could
    // deliver it again after its record is gone.
    let ns = format!("age{}", ulid::Ulid::new().to_string().to_lowercase());
    let cfg = config(&ns);
    let client = Bus::attach(&cfg).await.expect("nats").client().clone();
    let js = jetstream::new(client);
    let subjects = Subjects::new(Some(ns.clone()), 16);
    let mut forever = bcm_bus::streams::config(&subjects, StreamKind::Commands);
    forever.max_age = std::time::Duration::ZERO;
    js.create_stream(forever)
        .await
        .expect("create a commands stream kept for good");

    let err = Bus::connect(&cfg).await.expect_err("must refuse to start");
    match &err {
        BusError::IncompatibleStream { stream, why } => {
            assert_eq!(stream, &subjects.stream(StreamKind::Commands));
            assert!(why.contains("max_age"), "{why}");
        }
        other => panic!("unexpected error: {other}"),
    }
    let still = js
        .get_stream(subjects.stream(StreamKind::Commands))
        .await
        .expect("the stream was not deleted");
    assert!(still.cached_info().config.max_age.is_zero());
}
