//! Key-value buckets against a real JetStream: an expiring bucket drops a
//! value its set time after the last write, a bucket made before its
//! values expired is changed to expire them (keeping what it holds), and a
//! throwaway namespace's cleanup takes its buckets with its streams and
//! leaves every other namespace's.

use bcm_bus::kv::Bucket;
use bcm_bus::{Bus, BusConfig};
use std::time::{Duration, Instant};

mod support;
use support::bus;

fn site() -> bcm_core::SiteId {
    "s1".parse().expect("site")
}

#[tokio::test]
async fn an_expiring_bucket_drops_a_value_its_max_age_after_the_last_write() {
    let bus = bus("kvexp").await;
    let name = bus.subjects().kv_bucket("bmc_runs", &site());
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
    bcm_bus::streams::delete_all(&bus, &[site()])
        .await
        .expect("cleanup");
}

#[tokio::test]
async fn a_bucket_kept_for_good_is_changed_to_expire_and_keeps_its_values() {
    let bus = bus("kvupd").await;
    let name = bus.subjects().kv_bucket("bmc_runs", &site());
    let old = Bucket::open(&bus, &name).await.expect("open");
    assert_eq!(old.max_age().await.expect("status"), None);
    old.put("x.c1", &"done").await.expect("put");
    // What its operator set stays (here, a byte limit).
    let js = bus.jetstream();
    let mut tuned = js
        .get_stream(format!("KV_{name}"))
        .await
        .expect("stream")
        .cached_info()
        .config
        .clone();
    tuned.max_bytes = 1 << 20;
    js.update_stream(tuned).await.expect("limit");

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
    let kept = js
        .get_stream(format!("KV_{name}"))
        .await
        .expect("stream")
        .cached_info()
        .config
        .max_bytes;
    assert_eq!(kept, 1 << 20, "the operator's byte limit is kept");
    // Opening it again as it is (`open`) does not undo the expiry.
    let again = Bucket::open(&bus, &name).await.expect("open again");
    assert_eq!(again.max_age().await.expect("status"), Some(week));
    bcm_bus::streams::delete_all(&bus, &[site()])
        .await
        .expect("cleanup");
}

#[tokio::test]
async fn a_namespace_s_cleanup_deletes_its_buckets_and_no_one_else_s() {
    let mine = bus("kvdel").await;
    let ns = mine.subjects().namespace().expect("namespace").to_owned();
    // Namespaces whose bucket names start as this one's do.
    let lookalike = |suffix: &str| {
        let mut cfg = BusConfig::new(std::env::var("NATS_URL").expect("NATS_URL"));
        cfg.namespace = Some(format!("{ns}{suffix}"));
        cfg
    };
    let dash = Bus::connect(&lookalike("-sim")).await.expect("connect");
    let under = Bus::connect(&lookalike("_x")).await.expect("connect");
    bcm_bus::streams::ensure_all(&mine).await.expect("streams");
    let mut others = vec![];
    for (bus, name) in [(&mine, "sim_runs"), (&mine, "bmc_runs")] {
        let bucket = bus.subjects().kv_bucket(name, &site());
        Bucket::open(bus, &bucket)
            .await
            .expect("open")
            .put("k", &1)
            .await
            .expect("put");
    }
    for bus in [&dash, &under] {
        for name in ["sim", "sim_runs"] {
            let bucket = bus.subjects().kv_bucket(name, &site());
            Bucket::open(bus, &bucket)
                .await
                .expect("open")
                .put("k", &2)
                .await
                .expect("put");
            others.push((bus, bucket));
        }
    }

    bcm_bus::streams::delete_all(&mine, &[site()])
        .await
        .expect("cleanup");

    let js = mine.jetstream();
    for name in ["sim_runs", "bmc_runs"] {
        let bucket = mine.subjects().kv_bucket(name, &site());
        assert!(
            js.get_key_value(&bucket).await.is_err(),
            "{bucket}: the namespace's bucket is gone"
        );
    }
    let stream = mine
        .subjects()
        .stream(bcm_bus::subjects::StreamKind::Events);
    assert!(
        js.get_stream(&stream).await.is_err(),
        "the namespace's streams are gone"
    );
    for (bus, bucket) in others {
        let kept = Bucket::open(bus, &bucket).await.expect("open");
        assert_eq!(
            kept.get::<i32>("k").await.expect("get"),
            Some(2),
            "{bucket} of another namespace is kept"
        );
    }
    for bus in [&dash, &under] {
        bcm_bus::streams::delete_all(bus, &[site()])
            .await
            .expect("cleanup");
    }
}
