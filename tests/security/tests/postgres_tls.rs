//! TLS to Postgres (issue 18, finding 5): the record is reached with
//! `sslmode=verify-full` against the CA that signed the server's
//! certificate (the test stack's, `BCM_STACK_PG_CA` from
//! `deploy/dev/stack.sh env`), and a client that pins another CA is
//! refused before it says anything.

use std::time::Duration;

fn with_params(base: &str, params: &str) -> String {
    let sep = if base.contains('?') { '&' } else { '?' };
    format!("{base}{sep}{params}")
}

#[tokio::test]
async fn the_record_is_reached_with_verify_full_and_another_ca_is_refused() {
    let base = std::env::var("DATABASE_URL").expect("DATABASE_URL");
    let ca = std::env::var("BCM_STACK_PG_CA").expect(
        "BCM_STACK_PG_CA: the CA of the stack's Postgres (run through `deploy/dev/stack.sh env`)",
    );
    let url = with_params(&base, &format!("sslmode=verify-full&sslrootcert={ca}"));
    let db = bcm_db::Db::connect_waiting(&url, 1, Duration::from_secs(5))
        .await
        .expect("verify-full against the stack's CA");
    assert!(
        bcm_db::admin::connection_uses_tls(&db)
            .await
            .expect("pg_stat_ssl"),
        "the session is not TLS"
    );
    db.close().await;

    let dir = std::env::temp_dir().join(format!("bcm-pg-tls-{}", ulid::Ulid::new()));
    let other =
        bcm_pki::tls::LocalTls::write_missing(&dir, &["127.0.0.1".to_owned()]).expect("another CA");
    let url = with_params(
        &base,
        &format!("sslmode=verify-full&sslrootcert={}", other.ca.display()),
    );
    let refused = bcm_db::Db::connect_waiting(&url, 1, Duration::from_secs(2)).await;
    assert!(refused.is_err(), "a server of another CA was trusted");
    let _ = std::fs::remove_dir_all(&dir);
}
