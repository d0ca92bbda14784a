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
