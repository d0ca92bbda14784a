//! The agent endpoints' hints pool pings no connection before a statement
//! (the ping after each one stays): a connection that died idle fails the
//! one statement that finds it, as an outage, and the next statement gets
//! a new connection. The main pool pings first and never shows it.

mod support;

use bcm_db::Db;
use std::time::Duration;
use support::fresh_database as database;

#[tokio::test]
async fn a_hints_connection_that_died_idle_fails_one_statement_as_an_outage_then_is_replaced() {
    let (server, name, url) = database("hints").await;
    let hints = Db::connect_for_hints(&url, 1, Duration::from_secs(10), Duration::ZERO)
        .await
        .expect("hints pool");
    hints.migrate().await.expect("migrate");
    assert_eq!(
        bcm_db::nodes::installed_os_count(&hints)
            .await
            .expect("count"),
        0
    );
    let ended = bcm_db::admin::connections_terminate(&server, &name)
        .await
        .expect("terminate");
    assert!(ended >= 1, "no idle connection was there to end");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let first = bcm_db::nodes::installed_os_count(&hints).await;
    assert!(
        first.as_ref().is_err_and(|e| e.unreachable()),
        "the statement on the dead connection: {first:?}"
    );
    assert_eq!(
        bcm_db::nodes::installed_os_count(&hints)
            .await
            .expect("the next statement has a new connection"),
        0
    );
}

#[tokio::test]
async fn the_main_pool_replaces_a_connection_that_died_idle_before_using_it() {
    let (server, name, url) = database("mainping").await;
    let main = Db::connect_waiting(&url, 1, Duration::ZERO)
        .await
        .expect("main pool");
    main.migrate().await.expect("migrate");
    bcm_db::nodes::installed_os_count(&main)
        .await
        .expect("count");
    let ended = bcm_db::admin::connections_terminate(&server, &name)
        .await
        .expect("terminate");
    assert!(ended >= 1, "no idle connection was there to end");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        bcm_db::nodes::installed_os_count(&main)
            .await
            .expect("pinged, replaced, answered"),
        0
    );
}
