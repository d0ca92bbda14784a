//! Key-value buckets against a real JetStream: an expiring bucket drops a
//! value its set time after the last write, a bucket made before its
//! values expired is changed to expire them (keeping what it holds), and a
//! throwaway namespace's cleanup takes its buckets with its streams and
//! leaves every other namespace's.

use bcm_bus::kv::Bucket;
use bcm_bus::{Bus, BusConfig};
use std::time::{Duration, Instant};

/// A bus under a namespace of its own on the `NATS_URL` server.
async fn bus(tag: &str) -> Bus {
    let url = std::env::var("NATS_URL").expect("NATS_URL (the test command starts a nats-server)");
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let mut cfg = BusConfig::new(url);
    cfg.namespace = Some(format!("t{tag}{nanos}"));
    Bus::connect(&cfg).await.expect("connect")
}

fn site() -> bcm_core::SiteId {
    "s1".parse().expect("site")
}

#[tokio::test]
async fn an_expiring_bucket_drops_a_value_its_max_age_after_the_last_write() {
    let bus = bus("kvexp").await;
    let name = bus.subjects().kv_bucket("runs", &site());
    let runs = Bucket::open_expiring(&bus, &name, Duration::from_secs(1))
        .await
        .expect("open");
    assert_eq!(
        runs.max_age().await.expect("status"),
        Some(Duration::from_secs(1))
    );
    runs.put("x.c1", &"done").await.expect("put");
    assert_eq!(
        runs.get::<String>("x.c1").await.expect("get").as_deref(),
        Some("done")
    );
    let give_up = Instant::now() + Duration::from_secs(30);
    loop {
        if runs.get::<String>("x.c1").await.expect("get").is_none() {
            break;
        }
        assert!(
            Instant::now() < give_up,
            "a value of a bucket with a max age of 1 s still there after 30 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    bcm_bus::streams::delete_all(&bus).await.expect("cleanup");
}

#[tokio::test]
async fn a_bucket_kept_for_good_is_changed_to_expire_and_keeps_its_values() {
    let bus = bus("kvupd").await;
    let name = bus.subjects().kv_bucket("runs", &site());
    let old = Bucket::open(&bus, &name).await.expect("open");
    assert_eq!(old.max_age().await.expect("status"), None);
    old.put("x.c1", &"done").await.expect("put");

    let week = bcm_bus::streams::COMMAND_RETENTION;
    let runs = Bucket::open_expiring(&bus, &name, week)
        .await
        .expect("open expiring");
    assert_eq!(runs.max_age().await.expect("status"), Some(week));
    assert_eq!(
        runs.get::<String>("x.c1").await.expect("get").as_deref(),
        Some("done"),
        "the change to expire values kept what the bucket held"
    );
    // Opening it again as it is (`open`) does not undo the expiry.
    let again = Bucket::open(&bus, &name).await.expect("open again");
    assert_eq!(again.max_age().await.expect("status"), Some(week));
    bcm_bus::streams::delete_all(&bus).await.expect("cleanup");
}

#[tokio::test]
async fn a_namespace_s_cleanup_deletes_its_buckets_and_no_one_else_s() {
    let mine = bus("kvdel").await;
    let theirs = bus("kvdelother").await;
    bcm_bus::streams::ensure_all(&mine).await.expect("streams");
    let my_bucket = mine.subjects().kv_bucket("sim_runs", &site());
    let their_bucket = theirs.subjects().kv_bucket("sim_runs", &site());
    Bucket::open(&mine, &my_bucket)
        .await
        .expect("open")
        .put("k", &1)
        .await
        .expect("put");
    Bucket::open(&theirs, &their_bucket)
        .await
        .expect("open")
        .put("k", &2)
        .await
        .expect("put");

    bcm_bus::streams::delete_all(&mine).await.expect("cleanup");

    let js = mine.jetstream();
    assert!(
        js.get_key_value(&my_bucket).await.is_err(),
        "the namespace's bucket is gone"
    );
    let stream = mine
        .subjects()
        .stream(bcm_bus::subjects::StreamKind::Events);
    assert!(
        js.get_stream(&stream).await.is_err(),
        "the namespace's streams are gone"
    );
    let kept = Bucket::open(&theirs, &their_bucket).await.expect("open");
    assert_eq!(kept.get::<i32>("k").await.expect("get"), Some(2));
    bcm_bus::streams::delete_all(&theirs)
        .await
        .expect("cleanup");
}
