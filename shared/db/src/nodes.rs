//! Nodes and their authorization projection (`node_placements`).

use bcm_core::{
    BmcDriver, BmcTls, NodeId, PoolId, PowerState, ProvisionState, SiteId, TenantId, WipeMode,
    WorkflowId,
};
use chrono::{DateTime, Utc};

use crate::{DbError, Tx};

/// A node as the record holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub id: NodeId,
    pub tenant_id: TenantId,
    pub pool_id: PoolId,
    pub site_id: SiteId,
    pub provision_state: ProvisionState,
    pub failed_from: Option<ProvisionState>,
    pub last_error: Option<String>,
    pub maintenance: bool,
    pub power: PowerState,
    pub role: Option<String>,
    pub bmc_driver: BmcDriver,
    pub bmc_address: String,
    /// The sealed credentials' id; `None` once forgotten (retired).
    pub bmc_secret_id: Option<String>,
    /// The node's own TLS policy for its Redfish BMC.
    pub bmc_tls: Option<BmcTls>,
    /// The new password of a rotation in progress (sealed); the record
    /// keeps both until the rotation commits or rolls back.
    pub bmc_pending_secret_id: Option<String>,
    /// The `bmc.rotateCredentials` command carrying the rotation out; `None`
    /// when none is outstanding (a pending secret without one is a rotation
    /// left unresolved, which the next rotation resumes).
    pub bmc_rotation_command_id: Option<String>,
    pub macs: Vec<String>,
    /// The effective hardware profile's name when the node was enrolled.
    pub hardware_profile: String,
    /// Its drivers per concern, as resolved then; `None` for a node
    /// enrolled before they were kept (see [`Node::drivers`]).
    pub drivers: Option<bcm_core::hardware::Drivers>,
    pub workflow_id: Option<WorkflowId>,
    /// The profile version a `deploy` asked for, as it was then (versions
    /// are immutable).
    pub deploy_profile: Option<bcm_core::deploy::DeployProfile>,
    /// The wipe mode of the current release.
    pub release_wipe: Option<WipeMode>,
    pub unrescue_pending: bool,
    /// The batch its current verb's chain runs under: the destructive
    /// commands of its workflows carry that batch's authority.
    pub batch_id: Option<String>,
    pub version: i64,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl Node {
    /// Whether the node is an adopted machine: it has no BMC on record
    /// (only adoption makes such a node; enroll refuses the driver
    /// `none`), so what a BMC would do its own OS's agent does, or nothing
    /// does.
    pub fn is_adopted(&self) -> bool {
        self.bmc_driver == bcm_core::BmcDriver::None
    }

    /// The node's driver per concern: the snapshot taken at enroll, else
    /// its BMC driver for every BMC concern.
    pub fn drivers(&self) -> bcm_core::hardware::Drivers {
        self.drivers
            .unwrap_or_else(|| bcm_core::hardware::Drivers::of_bmc(self.bmc_driver))
    }

    /// A node as it is first stored (version 1): where it belongs, the
    /// state it starts in and its BMC; no workflow, no credentials, power
    /// unknown. Enroll and adopt set what else they know on the result.
    #[allow(clippy::too_many_arguments)]
    pub fn first(
        id: NodeId,
        tenant_id: TenantId,
        pool_id: PoolId,
        site_id: SiteId,
        provision_state: ProvisionState,
        bmc_driver: BmcDriver,
        bmc_address: String,
        hardware_profile: String,
    ) -> Node {
        let now = Utc::now();
        Node {
            id,
            tenant_id,
            pool_id,
            site_id,
            provision_state,
            failed_from: None,
            last_error: None,
            maintenance: false,
            power: PowerState::Unknown,
            role: None,
            bmc_driver,
            bmc_address,
            bmc_secret_id: None,
            bmc_tls: None,
            bmc_pending_secret_id: None,
            bmc_rotation_command_id: None,
            macs: vec![],
            hardware_profile,
            drivers: None,
            workflow_id: None,
            deploy_profile: None,
            release_wipe: None,
            unrescue_pending: false,
            batch_id: None,
            version: 1,
            created_at: now,
            updated_at: now,
        }
    }
}

#[derive(sqlx::FromRow)]
struct NodeRow {
    id: String,
    tenant_id: String,
    pool_id: String,
    site_id: String,
    provision_state: String,
    failed_from: Option<String>,
    last_error: Option<String>,
    maintenance: bool,
    power: String,
    role: Option<String>,
    bmc_driver: String,
    bmc_address: String,
    bmc_secret_id: Option<String>,
    bmc_tls: Option<serde_json::Value>,
    bmc_pending_secret_id: Option<String>,
    bmc_rotation_command_id: Option<String>,
    macs: Vec<String>,
    hardware_profile: String,
    drivers: Option<serde_json::Value>,
    workflow_id: Option<String>,
    deploy_profile: Option<serde_json::Value>,
    release_wipe: Option<String>,
    unrescue_pending: bool,
    batch_id: Option<String>,
    version: i64,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

fn corrupt(what: &str, v: &str) -> DbError {
    DbError::Corrupt(format!("{what} {v:?}"))
}

fn state(v: &str) -> Result<ProvisionState, DbError> {
    ProvisionState::parse(v).ok_or_else(|| corrupt("provision state", v))
}

impl TryFrom<NodeRow> for Node {
    type Error = DbError;
    fn try_from(r: NodeRow) -> Result<Self, DbError> {
        Ok(Node {
            id: r.id.parse().map_err(|_| corrupt("node id", &r.id))?,
            tenant_id: r
                .tenant_id
                .parse()
                .map_err(|_| corrupt("tenant id", &r.tenant_id))?,
            pool_id: r
                .pool_id
                .parse()
                .map_err(|_| corrupt("pool id", &r.pool_id))?,
            site_id: r
                .site_id
                .parse()
                .map_err(|_| corrupt("site id", &r.site_id))?,
            provision_state: state(&r.provision_state)?,
            failed_from: r.failed_from.as_deref().map(state).transpose()?,
            last_error: r.last_error,
            maintenance: r.maintenance,
            power: PowerState::parse(&r.power).ok_or_else(|| corrupt("power", &r.power))?,
            role: r.role,
            bmc_driver: BmcDriver::parse(&r.bmc_driver)
                .ok_or_else(|| corrupt("bmc driver", &r.bmc_driver))?,
            bmc_address: r.bmc_address,
            bmc_secret_id: r.bmc_secret_id,
            bmc_tls: r
                .bmc_tls
                .map(|v| {
                    serde_json::from_value(v.clone())
                        .map_err(|_| corrupt("bmc tls", &v.to_string()))
                })
                .transpose()?,
            bmc_pending_secret_id: r.bmc_pending_secret_id,
            bmc_rotation_command_id: r.bmc_rotation_command_id,
            macs: r.macs,
            hardware_profile: r.hardware_profile,
            drivers: r
                .drivers
                .map(|v| {
                    serde_json::from_value(v.clone())
                        .map_err(|e| corrupt("drivers", &e.to_string()))
                })
                .transpose()?,
            workflow_id: r
                .workflow_id
                .as_deref()
                .map(|w| w.parse().map_err(|_| corrupt("workflow id", w)))
                .transpose()?,
            deploy_profile: r
                .deploy_profile
                .map(|v| {
                    serde_json::from_value(v.clone())
                        .map_err(|e| corrupt("deploy profile", &e.to_string()))
                })
                .transpose()?,
            release_wipe: r
                .release_wipe
                .as_deref()
                .map(|w| WipeMode::parse(w).ok_or_else(|| corrupt("wipe mode", w)))
                .transpose()?,
            unrescue_pending: r.unrescue_pending,
            batch_id: r.batch_id,
            version: r.version,
            created_at: r.created_at,
            updated_at: r.updated_at,
        })
    }
}

const COLUMNS: &str = "id, tenant_id, pool_id, site_id, provision_state, failed_from, last_error, \
    maintenance, power, role, bmc_driver, bmc_address, bmc_secret_id, bmc_tls, \
    bmc_pending_secret_id, bmc_rotation_command_id, macs, hardware_profile, drivers, workflow_id, deploy_profile, release_wipe, unrescue_pending, batch_id, version, created_at, updated_at";

/// Inserts a new node (version 1) and its placement.
pub async fn node_insert_in_txn(tx: &mut Tx<'_>, n: &Node) -> Result<(), DbError> {
    sqlx::query(
        "INSERT INTO nodes (id, tenant_id, pool_id, site_id, provision_state, maintenance, power, \
         bmc_driver, bmc_address, bmc_secret_id, macs, hardware_profile, version, bmc_tls, batch_id, drivers) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)",
    )
    .bind(n.id.to_string())
    .bind(n.tenant_id.as_str())
    .bind(n.pool_id.as_str())
    .bind(n.site_id.as_str())
    .bind(n.provision_state.as_str())
    .bind(n.maintenance)
    .bind(n.power.as_str())
    .bind(n.bmc_driver.as_str())
    .bind(&n.bmc_address)
    .bind(&n.bmc_secret_id)
    .bind(&n.macs)
    .bind(&n.hardware_profile)
    .bind(n.version)
    .bind(n.bmc_tls.as_ref().map(|t| serde_json::json!(t)))
    .bind(&n.batch_id)
    .bind(n.drivers.map(|d| serde_json::json!(d)))
    .execute(&mut **tx)
    .await?;
    placement_refresh_in_txn(tx, n).await
}

/// Reads a node.
pub async fn node_fetch(db: &crate::Db, id: &NodeId) -> Result<Node, DbError> {
    let row: NodeRow = sqlx::query_as(&format!("SELECT {COLUMNS} FROM nodes WHERE id = $1"))
        .bind(id.to_string())
        .fetch_one(db.pool())
        .await?;
    row.try_into()
}

/// A node as a reader is shown it: where the authorization projection
/// places it, the node, and its `kind` fact.
#[derive(Debug, Clone)]
pub struct NodeRead {
    pub placement: (TenantId, PoolId),
    pub node: Node,
    pub fact: Option<serde_json::Value>,
}

/// Reads a node with its placement and its `kind` fact in one statement
/// (one pool connection and one round trip, where a read took three). A
/// node without a placement is not found; the caller decides on the
/// placement before it shows anything else.
pub async fn node_read(db: &crate::Db, id: &NodeId, kind: &str) -> Result<NodeRead, DbError> {
    #[derive(sqlx::FromRow)]
    struct Row {
        placed_tenant_id: String,
        placed_pool_id: String,
        fact: Option<serde_json::Value>,
        #[sqlx(flatten)]
        node: NodeRow,
    }
    let row: Row = sqlx::query_as(&format!(
        "SELECT p.tenant_id AS placed_tenant_id, p.pool_id AS placed_pool_id, \
         (SELECT f.data FROM node_facts f WHERE f.node_id = n.id AND f.kind = $2) AS fact, n.* \
         FROM node_placements p JOIN (SELECT {COLUMNS} FROM nodes WHERE id = $1) n ON n.id = p.node_id \
         WHERE p.node_id = $1"
    ))
    .bind(id.to_string())
    .bind(kind)
    .fetch_one(&mut *db.acquire().await?)
    .await?;
    let (t, p) = (row.placed_tenant_id, row.placed_pool_id);
    Ok(NodeRead {
        placement: (
            t.parse().map_err(|_| corrupt("tenant id", &t))?,
            p.parse().map_err(|_| corrupt("pool id", &p))?,
        ),
        node: row.node.try_into()?,
        fact: row.fact,
    })
}

/// Reads and locks a node for the rest of the transaction (`FOR NO KEY
/// UPDATE`, so foreign-key checks of rows that refer to it do not wait).
pub async fn node_fetch_for_update_in_txn(tx: &mut Tx<'_>, id: &NodeId) -> Result<Node, DbError> {
    let row: NodeRow = sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM nodes WHERE id = $1 FOR NO KEY UPDATE"
    ))
    .bind(id.to_string())
    .fetch_one(&mut **tx)
    .await?;
    row.try_into()
}

/// Writes every mutable field of `n` if the stored version is still
/// `n.version` (compare-and-swap), bumps the version, refreshes the
/// placement and returns the new version. A stale version is
/// [`DbError::Stale`].
pub async fn node_update_guarded_in_txn(tx: &mut Tx<'_>, n: &Node) -> Result<i64, DbError> {
    // One round trip: the guarded write and the projection of its result.
    let new_version: Option<i64> = sqlx::query_scalar(
        "WITH moved AS (UPDATE nodes SET provision_state = $2, failed_from = $3, last_error = $4, maintenance = $5, \
         power = $6, role = $7, bmc_secret_id = $8, macs = $9, workflow_id = $10, deploy_profile = $11, \
         release_wipe = $12, unrescue_pending = $13, bmc_pending_secret_id = $15, \
         bmc_rotation_command_id = $16, batch_id = $17, version = version + 1, updated_at = now() \
         WHERE id = $1 AND version = $14 RETURNING id, tenant_id, pool_id, version), \
         placed AS (INSERT INTO node_placements (node_id, tenant_id, pool_id, version) \
         SELECT id, tenant_id, pool_id, version FROM moved \
         ON CONFLICT (node_id) DO UPDATE SET tenant_id = EXCLUDED.tenant_id, pool_id = EXCLUDED.pool_id, version = EXCLUDED.version) \
         SELECT version FROM moved",
    )
    .bind(n.id.to_string())
    .bind(n.provision_state.as_str())
    .bind(n.failed_from.map(|s| s.as_str()))
    .bind(&n.last_error)
    .bind(n.maintenance)
    .bind(n.power.as_str())
    .bind(&n.role)
    .bind(&n.bmc_secret_id)
    .bind(&n.macs)
    .bind(n.workflow_id.map(|w| w.to_string()))
    .bind(
        n.deploy_profile
            .as_ref()
            .and_then(|p| serde_json::to_value(p).ok()),
    )
    .bind(n.release_wipe.map(|w| w.as_str()))
    .bind(n.unrescue_pending)
    .bind(n.version)
    .bind(&n.bmc_pending_secret_id)
    .bind(&n.bmc_rotation_command_id)
    .bind(&n.batch_id)
    .fetch_optional(&mut **tx)
    .await?;
    new_version.ok_or(DbError::Stale)
}

/// Refreshes the node's authorization projection.
pub async fn placement_refresh_in_txn(tx: &mut Tx<'_>, n: &Node) -> Result<(), DbError> {
    sqlx::query(
        "INSERT INTO node_placements (node_id, tenant_id, pool_id, version) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (node_id) DO UPDATE SET tenant_id = $2, pool_id = $3, version = $4",
    )
    .bind(n.id.to_string())
    .bind(n.tenant_id.as_str())
    .bind(n.pool_id.as_str())
    .bind(n.version)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Where a node sits, from the authorization projection.
pub async fn placement_fetch(db: &crate::Db, id: &NodeId) -> Result<(TenantId, PoolId), DbError> {
    let (t, p): (String, String) =
        sqlx::query_as("SELECT tenant_id, pool_id FROM node_placements WHERE node_id = $1")
            .bind(id.to_string())
            .fetch_one(db.pool())
            .await?;
    Ok((
        t.parse().map_err(|_| corrupt("tenant id", &t))?,
        p.parse().map_err(|_| corrupt("pool id", &p))?,
    ))
}

/// Which nodes a list may return.
#[derive(Debug, Clone, Default)]
pub struct NodeFilter {
    pub tenant: Option<TenantId>,
    pub pool: Option<PoolId>,
    pub state: Option<ProvisionState>,
    /// Return ids after this one (the page token).
    pub after: Option<NodeId>,
    /// Restrict to these tenants or pools; `None` means no restriction.
    pub visible: Option<(Vec<TenantId>, Vec<PoolId>)>,
    pub limit: i64,
}

/// Lists nodes in id order.
pub async fn node_list(db: &crate::Db, f: &NodeFilter) -> Result<Vec<Node>, DbError> {
    let (all, tenants, pools) = match &f.visible {
        None => (true, vec![], vec![]),
        Some((t, p)) => (
            false,
            t.iter().map(|t| t.as_str().to_owned()).collect::<Vec<_>>(),
            p.iter().map(|p| p.as_str().to_owned()).collect::<Vec<_>>(),
        ),
    };
    let rows: Vec<NodeRow> = sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM nodes WHERE ($1::text IS NULL OR tenant_id = $1) \
         AND ($2::text IS NULL OR pool_id = $2) AND ($3::text IS NULL OR provision_state = $3) \
         AND ($4::text IS NULL OR id > $4) \
         AND ($5 OR tenant_id = ANY($6) OR pool_id = ANY($7)) ORDER BY id LIMIT $8"
    ))
    .bind(f.tenant.as_ref().map(|t| t.as_str()))
    .bind(f.pool.as_ref().map(|p| p.as_str()))
    .bind(f.state.map(|s| s.as_str()))
    .bind(f.after.map(|a| a.to_string()))
    .bind(all)
    .bind(&tenants)
    .bind(&pools)
    .bind(f.limit)
    .fetch_all(&mut *db.acquire().await?)
    .await?;
    rows.into_iter().map(Node::try_from).collect()
}

/// Counts nodes by provision state (for metrics and the CLI).
pub async fn node_count_by_state(db: &crate::Db) -> Result<Vec<(ProvisionState, i64)>, DbError> {
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT provision_state, count(*) FROM nodes GROUP BY provision_state ORDER BY 1",
    )
    .fetch_all(db.pool())
    .await?;
    rows.into_iter().map(|(s, c)| Ok((state(&s)?, c))).collect()
}

/// How many installed operating systems heartbeat: nodes `deployed` or
/// `adopted` whose pool runs the agent (`agent_mode` `bcd`; an agentless
/// pool's nodes send nothing). The API sizes their idle cadence to it.
pub async fn installed_os_count(db: &crate::Db) -> Result<u64, DbError> {
    let (n,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM nodes n JOIN pools p ON p.id = n.pool_id \
         WHERE n.provision_state IN ('deployed', 'adopted') AND p.agent_mode = 'bcd'",
    )
    .fetch_one(db.pool())
    .await?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// Which of `macs` another live node of `site` holds: `(mac, node)` pairs
/// (MACs compared in one spelling; a MAC is unique within a site, kept by
/// the `node_macs` table).
pub async fn mac_holders_in_txn(
    tx: &mut Tx<'_>,
    site: &str,
    node: &str,
    macs: &[String],
) -> Result<Vec<(String, String)>, DbError> {
    Ok(sqlx::query_as(
        "SELECT m.mac, m.node_id FROM node_macs m \
         WHERE m.site_id = $1 AND m.node_id <> $2 \
         AND m.mac IN (SELECT canonical_mac(x) FROM unnest($3::text[]) AS x) ORDER BY m.mac",
    )
    .bind(site)
    .bind(node)
    .bind(macs)
    .fetch_all(&mut **tx)
    .await?)
}

/// Records the PXE MACs found by inspection. Not a provision change: the
/// version stays, no event is due.
pub async fn node_set_macs_in_txn(
    tx: &mut Tx<'_>,
    id: &str,
    macs: &[String],
) -> Result<(), DbError> {
    sqlx::query("UPDATE nodes SET macs = $2, updated_at = now() WHERE id = $1")
        .bind(id)
        .bind(macs)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Forgets the node's sealed BMC credentials (retire) and deletes them.
pub async fn node_forget_bmc_secret_in_txn(tx: &mut Tx<'_>, id: &str) -> Result<(), DbError> {
    let secret: Option<Option<String>> =
        sqlx::query_scalar("SELECT bmc_secret_id FROM nodes WHERE id = $1 FOR UPDATE")
            .bind(id)
            .fetch_optional(&mut **tx)
            .await?;
    sqlx::query("UPDATE nodes SET bmc_secret_id = NULL, updated_at = now() WHERE id = $1")
        .bind(id)
        .execute(&mut **tx)
        .await?;
    if let Some(Some(s)) = secret {
        crate::secrets::secret_delete_in_txn(tx, &s).await?;
    }
    Ok(())
}

/// Makes `secret_id` the node's BMC credentials and forgets the ones it
/// replaces (a committed rotation inside a workflow); the new version.
pub async fn node_replace_bmc_secret_in_txn(
    tx: &mut Tx<'_>,
    id: &str,
    secret_id: &str,
) -> Result<i64, DbError> {
    let old: Option<Option<String>> =
        sqlx::query_scalar("SELECT bmc_secret_id FROM nodes WHERE id = $1 FOR UPDATE")
            .bind(id)
            .fetch_optional(&mut **tx)
            .await?;
    let version: i64 = sqlx::query_scalar(
        "UPDATE nodes SET bmc_secret_id = $2, version = version + 1, updated_at = now() WHERE id = $1 RETURNING version",
    )
    .bind(id)
    .bind(secret_id)
    .fetch_one(&mut **tx)
    .await?;
    // The projection follows the version (a verb that read the node before
    // finds it stale and reads it again, so it never writes the old
    // credentials back).
    sqlx::query("UPDATE node_placements SET version = $2 WHERE node_id = $1")
        .bind(id)
        .bind(version)
        .execute(&mut **tx)
        .await?;
    if let Some(Some(s)) = old.filter(|o| o.as_deref() != Some(secret_id)) {
        crate::secrets::secret_delete_in_txn(tx, &s).await?;
    }
    Ok(version)
}

/// What the reconciler's periodic look reads of a node, without locking
/// it: the facts its decision takes and the summary of the workflow the
/// node points at (`None`: none, or one whose row is gone).
/// `facts.rescue_booting` is `false`: the look does not read it, and the
/// reconciler's decision does not use it.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeGlance {
    pub facts: bcm_core::NodeFacts,
    pub workflow: Option<bcm_core::reconcile::WorkflowSummary>,
}

/// One page of [`node_glances_in_states`]: each node's id with what the
/// look read of it, or why its row could not be read (that node alone).
pub type GlancePage = Vec<(NodeId, Result<NodeGlance, DbError>)>;

/// The nodes in any of `states` whose id sorts after `after` (from the
/// first when `None`), at most `limit` of them in id order, each with its
/// workflow: one statement per page, no lock taken. A row whose state or
/// workflow status this build cannot read is returned as its error, beside
/// the rest of the page; an id that is not a node id fails the page.
pub async fn node_glances_in_states(
    db: &crate::Db,
    states: &[ProvisionState],
    after: Option<&NodeId>,
    limit: u32,
) -> Result<GlancePage, DbError> {
    #[derive(sqlx::FromRow)]
    struct Row {
        id: String,
        provision_state: String,
        failed_from: Option<String>,
        unrescue_pending: bool,
        rotation_pending: bool,
        profile_id: Option<String>,
        status: Option<String>,
        wipe_verified: Option<bool>,
        error: Option<String>,
    }
    fn glance(r: Row) -> Result<NodeGlance, DbError> {
        let workflow = match (r.profile_id, r.status) {
            (Some(profile_id), Some(status)) => Some(bcm_core::reconcile::WorkflowSummary {
                phase: bcm_core::workflow::WorkflowPhase::parse(&status)
                    .ok_or_else(|| corrupt("workflow status", &status))?,
                profile_id,
                wipe_verified: r.wipe_verified.unwrap_or(false),
                error: r.error,
            }),
            _ => None,
        };
        Ok(NodeGlance {
            facts: bcm_core::NodeFacts {
                state: state(&r.provision_state)?,
                failed_from: r.failed_from.as_deref().map(state).transpose()?,
                unrescue_pending: r.unrescue_pending,
                rescue_booting: false,
                rotation_pending: r.rotation_pending,
            },
            workflow,
        })
    }
    let names: Vec<&str> = states.iter().map(|s| s.as_str()).collect();
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT n.id, n.provision_state, n.failed_from, n.unrescue_pending, \
         n.bmc_pending_secret_id IS NOT NULL AS rotation_pending, \
         w.profile_id, w.status, w.wipe_verified, w.error \
         FROM nodes n LEFT JOIN workflows w ON w.id = n.workflow_id \
         WHERE n.provision_state = ANY($1) AND n.id > $2 ORDER BY n.id LIMIT $3",
    )
    .bind(&names)
    .bind(after.map(|a| a.to_string()).unwrap_or_default())
    .bind(i64::from(limit))
    .fetch_all(db.pool())
    .await?;
    rows.into_iter()
        .map(|r| {
            let id: NodeId = r.id.parse().map_err(|_| corrupt("node id", &r.id))?;
            Ok((id, glance(r)))
        })
        .collect()
}

/// Reads a node inside a transaction without locking it.
pub async fn node_fetch_in_txn(tx: &mut Tx<'_>, id: &NodeId) -> Result<Node, DbError> {
    let row: NodeRow = sqlx::query_as(&format!("SELECT {COLUMNS} FROM nodes WHERE id = $1"))
        .bind(id.to_string())
        .fetch_one(&mut **tx)
        .await?;
    row.try_into()
}

/// Reads nodes (those that exist), in one round trip.
pub async fn nodes_fetch_many_in_txn(
    tx: &mut Tx<'_>,
    ids: &[String],
) -> Result<Vec<Node>, DbError> {
    let rows: Vec<NodeRow> =
        sqlx::query_as(&format!("SELECT {COLUMNS} FROM nodes WHERE id = ANY($1)"))
            .bind(ids)
            .fetch_all(&mut **tx)
            .await?;
    rows.into_iter().map(Node::try_from).collect()
}

/// Nodes with BMC credentials whose power was last read by the power sync
/// longer than `every` ago (or never), longest first, at most `limit`;
/// nodes being enrolled or retired, and nodes whose password is being
/// rotated, are left out.
pub async fn nodes_due_for_power_read(
    db: &crate::Db,
    every: std::time::Duration,
    limit: i64,
) -> Result<Vec<String>, DbError> {
    Ok(sqlx::query_scalar(
        "SELECT n.id FROM nodes n LEFT JOIN power_reads r ON r.node_id = n.id \
         WHERE n.bmc_secret_id IS NOT NULL AND n.bmc_pending_secret_id IS NULL AND n.provision_state NOT IN ('enrolling', 'retiring', 'retired') \
         AND (r.requested_at IS NULL OR r.requested_at < now() - make_interval(secs => $1)) \
         ORDER BY r.requested_at NULLS FIRST, n.id LIMIT $2",
    )
    .bind(every.as_secs_f64())
    .bind(limit)
    .fetch_all(db.pool())
    .await?)
}

/// Records that the power sync asked for the node's power now.
pub async fn power_read_requested_in_txn(tx: &mut Tx<'_>, id: &str) -> Result<(), DbError> {
    sqlx::query(
        "INSERT INTO power_reads (node_id, requested_at) VALUES ($1, now()) \
         ON CONFLICT (node_id) DO UPDATE SET requested_at = now()",
    )
    .bind(id)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Records `actor` as the principal whose verb started what the node does
/// now (a verb's move, in its transaction).
pub async fn node_actor_set_in_txn(
    tx: &mut Tx<'_>,
    node_id: &str,
    actor: &str,
    traceparent: Option<&str>,
) -> Result<(), DbError> {
    sqlx::query(
        "INSERT INTO node_actors (node_id, actor, traceparent) VALUES ($1, $2, $3) \
         ON CONFLICT (node_id) DO UPDATE SET actor = $2, traceparent = $3, at = now()",
    )
    .bind(node_id)
    .bind(actor)
    .bind(traceparent)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Who started what a node does now, and in which trace.
#[derive(Debug, Clone, Default, PartialEq, Eq, sqlx::FromRow)]
pub struct NodeActor {
    /// The principal whose verb it was.
    pub actor: Option<String>,
    /// The W3C trace context of that verb's request.
    pub traceparent: Option<String>,
}

/// The principal whose verb started what the node does now, and its
/// trace; both none when no verb did.
pub async fn node_actor_in_txn(tx: &mut Tx<'_>, node_id: &str) -> Result<NodeActor, DbError> {
    Ok(sqlx::query_as::<_, NodeActor>(
        "SELECT actor, traceparent FROM node_actors WHERE node_id = $1",
    )
    .bind(node_id)
    .fetch_optional(&mut **tx)
    .await?
    .unwrap_or_default())
}
