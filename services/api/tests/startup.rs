//! A service starting while its database goes away and comes back (a
//! restart, a failover) comes up with the database instead of exiting.

use bcm_testkit::{fresh_database, Options, TestEnv};
use std::time::{Duration, Instant};

#[tokio::test]
async fn a_service_whose_database_drops_its_connections_while_it_starts_comes_up() {
    let server = std::env::var("DATABASE_URL").expect("DATABASE_URL");
    let url = fresh_database().await.expect("database");
    let name = url.rsplit('/').next().expect("a database name").to_owned();
    // For 1.5 s every connection to the database is ended as soon as it
    // appears: the migrations, the seed and the downloads each lose theirs
    // part way, as in an outage that begins just after the service connected.
    let outage = Duration::from_millis(1500);
    let terminator = tokio::spawn(async move {
        let started = Instant::now();
        let mut ended = 0;
        while started.elapsed() < outage {
            ended += bcm_db::admin::connections_terminate(&server, &name)
                .await
                .expect("terminate");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        ended
    });
    let env = TestEnv::start_with(Options {
        database_url: Some(url),
        ..Options::api_only()
    })
    .await;
    let ended = terminator.await.expect("terminator");
    assert!(
        ended > 0,
        "the outage ended no connection: it tested nothing"
    );
    let env = env.expect("the service came up after the outage");
    // It is whole: migrated, and seeded with the tenant and pool it enrolls in.
    let node = env.enroll("a", "a-pool").await.expect("enroll");
    assert_eq!(node["provisionState"], "enrolling", "{node}");
}
