//! What the db crate's own tests share: a fresh, migrated database on the
//! `DATABASE_URL` server for each test, a few rows to hang the others on,
//! and the catalog reads that check a schema.

#![allow(dead_code)]

use bcm_core::{BmcDriver, NodeId, PoolId, ProvisionState, SiteId, TenantId};
use bcm_db::nodes::Node;
use bcm_db::Db;

/// A new, empty database on the `DATABASE_URL` server: the server's URL,
/// the database's name and its URL.
pub async fn fresh_database(tag: &str) -> (String, String, String) {
    let server = std::env::var("DATABASE_URL")
        .expect("DATABASE_URL (the test command starts a throwaway Postgres)");
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let name = format!("dbt_{tag}_{}_{nanos}", std::process::id());
    let url = bcm_db::admin::database_create(&server, &name)
        .await
        .expect("create database");
    (server, name, url)
}

/// A new database, migrated, on the `DATABASE_URL` server.
pub async fn fresh_db(tag: &str) -> Db {
    let (_, _, url) = fresh_database(tag).await;
    let db = Db::connect(&url, 8).await.expect("connect");
    db.migrate().await.expect("migrate");
    db
}

/// Runs statements (a test's own damage or set-up).
pub async fn exec(db: &Db, sql: &str) {
    bcm_db::admin::execute_raw(db, sql).await.expect(sql);
}

/// The public tables, sorted.
pub async fn tables(db: &Db) -> Vec<String> {
    bcm_db::admin::tables(db).await.expect("tables")
}

/// The columns of `table`, sorted.
pub async fn columns(db: &Db, table: &str) -> Vec<String> {
    bcm_db::admin::columns(db, table).await.expect("columns")
}

/// Tenant `t`, site `s` and pool `p`.
pub async fn tenancy(db: &Db) -> (TenantId, SiteId, PoolId) {
    let t: TenantId = "t".parse().expect("tenant");
    let s: SiteId = "s".parse().expect("site");
    let p: PoolId = "p".parse().expect("pool");
    bcm_db::tenancy::tenant_upsert(db, &t, "T")
        .await
        .expect("tenant");
    bcm_db::tenancy::site_upsert(db, &s, "S")
        .await
        .expect("site");
    bcm_db::tenancy::pool_upsert(
        db,
        &bcm_db::tenancy::Pool {
            id: p.clone(),
            tenant_id: t.clone(),
            site_id: s.clone(),
            name: "P".into(),
            hardware_profile: "default".into(),
            agent_mode: "bcd".into(),
            accept_unsupported_diag: false,
            deploy_profiles: None,
            release_wipe: "quick".into(),
            commission_wipe: "quick".into(),
            adopt_acceptance: None,
            unattested_release: "failed".into(),
            erase_methods: None,
        },
    )
    .await
    .expect("pool");
    (t, s, p)
}

/// A node in `enrolling` of pool `p`, not yet stored.
pub fn new_node(t: &TenantId, s: &SiteId, p: &PoolId) -> Node {
    Node::first(
        NodeId::generate(),
        t.clone(),
        p.clone(),
        s.clone(),
        ProvisionState::Enrolling,
        BmcDriver::Sim,
        format!("sim://{}", NodeId::generate()),
        "default".into(),
    )
}

/// A stored node.
pub async fn node(db: &Db) -> Node {
    let (t, s, p) = tenancy(db).await;
    let n = new_node(&t, &s, &p);
    let mut tx = db.begin().await.expect("tx");
    bcm_db::nodes::node_insert_in_txn(&mut tx, &n)
        .await
        .expect("insert");
    tx.commit().await.expect("commit");
    n
}
