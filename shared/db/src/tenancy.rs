//! Tenants, sites and pools (with their policy).

use bcm_core::{PoolId, SiteId, TenantId};

use crate::{Db, DbError};

/// A pool and its policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pool {
    pub id: PoolId,
    pub tenant_id: TenantId,
    pub site_id: SiteId,
    pub name: String,
    pub hardware_profile: String,
    /// `bcd` (the ramdisk agent runs) or `none` (agentless).
    pub agent_mode: String,
    /// Commissioning accepts `diag.dcgm` answering `unsupported` (no GPU).
    pub accept_unsupported_diag: bool,
    /// The deploy profile ids the pool accepts; `None`: every profile of
    /// its tenant.
    pub deploy_profiles: Option<Vec<String>>,
    /// A release's wipe when the request names none.
    pub release_wipe: String,
    /// Commissioning's wipe.
    pub commission_wipe: String,
    /// Adoption's acceptance checks (`None`: any machine whose agent
    /// joined).
    pub adopt_acceptance: Option<bcm_core::reconcile::AdoptAcceptance>,
    /// An agentless pool's release without an attested erase: `failed` or
    /// `ready`.
    pub unattested_release: String,
    /// The methods that satisfy `secure-erase` and `crypto-erase` (`None`:
    /// the default policy).
    pub erase_methods: Option<bcm_core::erase::ErasePolicy>,
}

/// What a pool says of its machines' agent, as the reconciler and the
/// verbs read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgentPolicy {
    pub agent: bcm_core::agentless::AgentMode,
    pub unattested_release: bcm_core::agentless::UnattestedRelease,
}

impl AgentPolicy {
    /// The release policy when the pool is agentless; `None` when its
    /// machines run bcd.
    pub fn agentless_release(&self) -> Option<bcm_core::agentless::UnattestedRelease> {
        self.agent.is_agentless().then_some(self.unattested_release)
    }
}

/// What a verb reads of its node's pool.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct PoolVerbPolicy {
    pub deploy_profiles: Option<Vec<String>>,
    pub release_wipe: String,
}

/// Creates or renames a tenant.
pub async fn tenant_upsert(db: &Db, id: &TenantId, name: &str) -> Result<(), DbError> {
    sqlx::query(
        "INSERT INTO tenants (id, name) VALUES ($1, $2) ON CONFLICT (id) DO UPDATE SET name = $2",
    )
    .bind(id.as_str())
    .bind(name)
    .execute(db.pool())
    .await?;
    Ok(())
}

/// Creates or renames a site.
pub async fn site_upsert(db: &Db, id: &SiteId, name: &str) -> Result<(), DbError> {
    sqlx::query(
        "INSERT INTO sites (id, name) VALUES ($1, $2) ON CONFLICT (id) DO UPDATE SET name = $2",
    )
    .bind(id.as_str())
    .bind(name)
    .execute(db.pool())
    .await?;
    Ok(())
}

/// Creates a pool or updates its policy. A pool never changes tenant.
pub async fn pool_upsert(db: &Db, p: &Pool) -> Result<(), DbError> {
    let n = sqlx::query(
        "INSERT INTO pools (id, tenant_id, site_id, name, hardware_profile, agent_mode, accept_unsupported_diag, deploy_profiles, release_wipe, commission_wipe, adopt_acceptance, unattested_release, erase_methods) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13) \
         ON CONFLICT (id) DO UPDATE SET site_id = $3, name = $4, hardware_profile = $5, agent_mode = $6, accept_unsupported_diag = $7, \
         deploy_profiles = $8, release_wipe = $9, commission_wipe = $10, adopt_acceptance = $11, unattested_release = $12, erase_methods = $13 \
         WHERE pools.tenant_id = $2",
    )
    .bind(p.id.as_str())
    .bind(p.tenant_id.as_str())
    .bind(p.site_id.as_str())
    .bind(&p.name)
    .bind(&p.hardware_profile)
    .bind(&p.agent_mode)
    .bind(p.accept_unsupported_diag)
    .bind(&p.deploy_profiles)
    .bind(&p.release_wipe)
    .bind(&p.commission_wipe)
    .bind(
        p.adopt_acceptance
            .as_ref()
            .filter(|a| !a.is_empty())
            .map(|a| serde_json::to_value(a).unwrap_or_default()),
    )
    .bind(&p.unattested_release)
    .bind(
        p.erase_methods
            .as_ref()
            .map(|e| serde_json::to_value(e).unwrap_or_default()),
    )
    .execute(db.pool())
    .await?
    .rows_affected();
    if n == 0 {
        return Err(DbError::Duplicate {
            constraint: "pools_pkey".into(),
        });
    }
    Ok(())
}

#[derive(sqlx::FromRow)]
struct PoolRow {
    id: String,
    tenant_id: String,
    site_id: String,
    name: String,
    hardware_profile: String,
    agent_mode: String,
    accept_unsupported_diag: bool,
    deploy_profiles: Option<Vec<String>>,
    release_wipe: String,
    commission_wipe: String,
    adopt_acceptance: Option<serde_json::Value>,
    unattested_release: String,
    erase_methods: Option<serde_json::Value>,
}

const POOL_COLUMNS: &str = "id, tenant_id, site_id, name, hardware_profile, agent_mode, accept_unsupported_diag, deploy_profiles, release_wipe, commission_wipe, adopt_acceptance, unattested_release, erase_methods";

impl TryFrom<PoolRow> for Pool {
    type Error = DbError;

    fn try_from(r: PoolRow) -> Result<Self, DbError> {
        let bad = |w: &str| DbError::Corrupt(format!("pool {} {w}", r.id));
        Ok(Pool {
            id: r.id.parse().map_err(|_| bad("id"))?,
            tenant_id: r.tenant_id.parse().map_err(|_| bad("tenant"))?,
            site_id: r.site_id.parse().map_err(|_| bad("site"))?,
            name: r.name,
            hardware_profile: r.hardware_profile,
            agent_mode: r.agent_mode,
            accept_unsupported_diag: r.accept_unsupported_diag,
            deploy_profiles: r.deploy_profiles,
            release_wipe: r.release_wipe,
            commission_wipe: r.commission_wipe,
            adopt_acceptance: r
                .adopt_acceptance
                .map(serde_json::from_value)
                .transpose()
                .map_err(|_| bad("adopt acceptance"))?,
            unattested_release: r.unattested_release,
            erase_methods: r
                .erase_methods
                .map(serde_json::from_value)
                .transpose()
                .map_err(|_| bad("erase methods"))?,
        })
    }
}

/// Reads a pool.
pub async fn pool_fetch(db: &Db, id: &PoolId) -> Result<Pool, DbError> {
    let r: PoolRow = sqlx::query_as(&format!("SELECT {POOL_COLUMNS} FROM pools WHERE id = $1"))
        .bind(id.as_str())
        .fetch_one(db.pool())
        .await?;
    r.try_into()
}

/// Every pool, or a tenant's, by id.
pub async fn pools_list(db: &Db, tenant: Option<&str>) -> Result<Vec<Pool>, DbError> {
    let rows: Vec<PoolRow> = sqlx::query_as(&format!(
        "SELECT {POOL_COLUMNS} FROM pools WHERE $1::text IS NULL OR tenant_id = $1 ORDER BY id"
    ))
    .bind(tenant)
    .fetch_all(db.pool())
    .await?;
    rows.into_iter().map(Pool::try_from).collect()
}

/// The policy a verb on a node of pool `id` reads, in its transaction.
pub async fn pool_verb_policy_in_txn(
    tx: &mut crate::Tx<'_>,
    id: &str,
) -> Result<PoolVerbPolicy, DbError> {
    Ok(
        sqlx::query_as("SELECT deploy_profiles, release_wipe FROM pools WHERE id = $1")
            .bind(id)
            .fetch_one(&mut **tx)
            .await?,
    )
}

/// A pool's agent mode and unattested-release policy (a pool that is gone
/// reads as one whose machines run bcd).
pub async fn pool_agent_policy_in_txn(
    tx: &mut crate::Tx<'_>,
    id: &str,
) -> Result<AgentPolicy, DbError> {
    let row: Option<(String, String)> =
        sqlx::query_as("SELECT agent_mode, unattested_release FROM pools WHERE id = $1")
            .bind(id)
            .fetch_optional(&mut **tx)
            .await?;
    let Some((agent, unattested)) = row else {
        return Ok(AgentPolicy {
            agent: bcm_core::agentless::AgentMode::Bcd,
            unattested_release: Default::default(),
        });
    };
    let bad = |w: &str| DbError::Corrupt(format!("pool {id} {w}"));
    Ok(AgentPolicy {
        agent: bcm_core::agentless::AgentMode::parse(&agent).ok_or_else(|| bad("agent mode"))?,
        unattested_release: bcm_core::agentless::UnattestedRelease::parse(&unattested)
            .ok_or_else(|| bad("unattested release"))?,
    })
}

/// Whether a pool accepts `diag.dcgm` answering `unsupported`.
pub async fn pool_accepts_unsupported_diag_in_txn(
    tx: &mut crate::Tx<'_>,
    id: &str,
) -> Result<bool, DbError> {
    Ok(
        sqlx::query_scalar("SELECT accept_unsupported_diag FROM pools WHERE id = $1")
            .bind(id)
            .fetch_optional(&mut **tx)
            .await?
            .unwrap_or(false),
    )
}

/// The wipe a pool's commissioning runs (`quick` when the pool is gone).
pub async fn pool_commission_wipe_in_txn(
    tx: &mut crate::Tx<'_>,
    id: &str,
) -> Result<String, DbError> {
    Ok(
        sqlx::query_scalar("SELECT commission_wipe FROM pools WHERE id = $1")
            .bind(id)
            .fetch_optional(&mut **tx)
            .await?
            .unwrap_or_else(|| "quick".to_owned()),
    )
}

/// A pool's policy stored as JSON in `column`, read as `T`; `T`'s default
/// when the pool sets none, or is gone.
async fn pool_json_in_txn<T: serde::de::DeserializeOwned + Default>(
    tx: &mut crate::Tx<'_>,
    id: &str,
    column: PoolJson,
) -> Result<T, DbError> {
    let sql = match column {
        PoolJson::AdoptAcceptance => "SELECT adopt_acceptance FROM pools WHERE id = $1",
        PoolJson::EraseMethods => "SELECT erase_methods FROM pools WHERE id = $1",
    };
    let v: Option<Option<serde_json::Value>> = sqlx::query_scalar(sql)
        .bind(id)
        .fetch_optional(&mut **tx)
        .await?;
    match v.flatten() {
        None => Ok(T::default()),
        Some(v) => serde_json::from_value(v)
            .map_err(|e| DbError::Corrupt(format!("pool {id} {column:?}: {e}"))),
    }
}

/// The pool policies stored as JSON.
#[derive(Debug, Clone, Copy)]
enum PoolJson {
    AdoptAcceptance,
    EraseMethods,
}

/// A pool's adoption acceptance checks (empty when it sets none).
pub async fn pool_adopt_acceptance_in_txn(
    tx: &mut crate::Tx<'_>,
    id: &str,
) -> Result<bcm_core::reconcile::AdoptAcceptance, DbError> {
    pool_json_in_txn(tx, id, PoolJson::AdoptAcceptance).await
}

/// A pool's erase policy (the default when it sets none, or is gone).
pub async fn pool_erase_policy_in_txn(
    tx: &mut crate::Tx<'_>,
    id: &str,
) -> Result<bcm_core::erase::ErasePolicy, DbError> {
    pool_json_in_txn(tx, id, PoolJson::EraseMethods).await
}

/// A site and its settings.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Site {
    pub id: String,
    pub name: String,
    /// The site's upstream HTTP proxy (`http://host:port`).
    pub http_proxy: Option<String>,
    /// The principal that set (or cleared) it last.
    pub http_proxy_set_by: Option<String>,
}

/// Reads a site.
pub async fn site_fetch(db: &Db, id: &SiteId) -> Result<Option<Site>, DbError> {
    Ok(
        sqlx::query_as("SELECT id, name, http_proxy, http_proxy_set_by FROM sites WHERE id = $1")
            .bind(id.as_str())
            .fetch_optional(db.pool())
            .await?,
    )
}

/// Sets (or clears) a site's upstream HTTP proxy, by `by`; `false` when
/// the site does not exist.
pub async fn site_set_http_proxy(
    db: &Db,
    id: &SiteId,
    proxy: Option<&str>,
    by: &str,
) -> Result<bool, DbError> {
    Ok(
        sqlx::query("UPDATE sites SET http_proxy = $2, http_proxy_set_by = $3 WHERE id = $1")
            .bind(id.as_str())
            .bind(proxy)
            .bind(by)
            .execute(db.pool())
            .await?
            .rows_affected()
            == 1,
    )
}

/// Whether `tenant` has a pool in `site`.
pub async fn tenant_in_site(db: &Db, tenant: &str, site: &str) -> Result<bool, DbError> {
    Ok(sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pools WHERE tenant_id = $1 AND site_id = $2)",
    )
    .bind(tenant)
    .bind(site)
    .fetch_one(db.pool())
    .await?)
}
