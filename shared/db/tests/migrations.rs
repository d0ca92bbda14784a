//! Migrations: append-only (a landed migration's text never changes), applied
//! from an empty database and again without effect, and the one migration
//! that was edited after it landed repaired on a database that ran its
//! first text.

mod support;

use sha2::{Digest, Sha384};

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// `(version, sha384, file)` of every line of `migrations.lock`.
fn lock() -> Vec<(i64, String, String)> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations.lock");
    std::fs::read_to_string(&path)
        .expect("migrations.lock")
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let mut parts = l.split_whitespace();
            let version = parts.next().and_then(|v| v.parse().ok()).expect("version");
            let sum = parts.next().expect("sha384").to_owned();
            let file = parts.next().expect("file").to_owned();
            (version, sum, file)
        })
        .collect()
}

#[test]
fn landed_migrations_never_change_and_new_ones_are_locked() {
    let locked = lock();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
    for (version, sum, file) in &locked {
        let text = std::fs::read(dir.join(file))
            .unwrap_or_else(|e| panic!("{file} was locked and is gone: {e}"));
        assert_eq!(
            &hex(&Sha384::digest(&text)),
            sum,
            "{file} changed after it landed: add a new migration instead"
        );
        let embedded = bcm_db::MIGRATOR
            .iter()
            .find(|m| m.version == *version)
            .unwrap_or_else(|| panic!("{file} is not embedded"));
        assert_eq!(
            &hex(&embedded.checksum),
            sum,
            "{file}: the binary embeds other text"
        );
    }
    for m in bcm_db::MIGRATOR.iter() {
        assert!(
            locked.iter().any(|(v, _, _)| *v == m.version),
            "migration {} ({}) has no line in migrations.lock: add `{:04} {} <file>`",
            m.version,
            m.description,
            m.version,
            hex(&m.checksum)
        );
    }
}

#[tokio::test]
async fn migrations_apply_from_empty_and_again_without_effect() {
    let db = support::fresh_db("migrate").await;
    let tables = support::tables(&db).await;
    for t in [
        "nodes",
        "node_placements",
        "workflows",
        "workflow_steps",
        "commands",
        "outbox",
        "join_tokens",
        "node_certs",
        "agent_sessions",
        "deploy_profiles",
        "pools",
    ] {
        assert!(tables.contains(&t.to_owned()), "no table {t} in {tables:?}");
    }
    db.migrate().await.expect("a second run changes nothing");
    assert_eq!(support::tables(&db).await, tables);
}

#[tokio::test]
async fn a_database_that_ran_the_first_text_of_0007_is_repaired() {
    let db = support::fresh_db("repair").await;
    let (version, first, _) = bcm_db::EDITED_MIGRATIONS[0];
    assert_eq!(version, 7);
    // As a database that applied 0007 before it gained its last statement.
    support::exec(
        &db,
        &format!(
            "ALTER TABLE pools DROP COLUMN accept_unsupported_diag; \
             UPDATE _sqlx_migrations SET checksum = decode('{first}', 'hex') WHERE version = 7"
        ),
    )
    .await;
    assert!(!support::columns(&db, "pools")
        .await
        .contains(&"accept_unsupported_diag".to_owned()));
    db.migrate()
        .await
        .expect("the edited migration is repaired, not refused");
    assert!(support::columns(&db, "pools")
        .await
        .contains(&"accept_unsupported_diag".to_owned()));
    // And it stays repaired.
    db.migrate().await.expect("again");
}

/// A server that is not there is waited for (a service started during an
/// outage comes up with the database), then given up on; a URL that does
/// not parse fails at once.
#[tokio::test]
async fn connect_waits_for_an_absent_server_and_refuses_a_bad_url() {
    let absent = bcm_db::Db::connect_waiting(
        "postgres://postgres@127.0.0.1:9/none",
        1,
        std::time::Duration::from_millis(800),
    )
    .await;
    assert!(absent.is_err(), "nothing listens on port 9");
    let bad = bcm_db::Db::connect_waiting("not a url", 1, std::time::Duration::from_secs(60)).await;
    assert!(bad.is_err());
}
