//! The metal API group: every verb, each one transaction that locks the
//! node, checks the move against the state table, applies it as a guarded
//! update, refreshes the authorization projection and inserts the outbox
//! rows (the event and a reconcile request).

use axum::extract::State;
use axum::Json;
use bcm_contracts::commands::{Command, PowerParams, RotateParams};
use bcm_core::authz::{Action, Placement};
use bcm_core::batch::Operation;
use bcm_core::{
    apply, BmcDriver, ErrorCode, Move, NodeId, PoolId, PowerAction, ProvisionState, TenantId, Verb,
    WipeMode,
};
use bcm_db::nodes::{self, Node};
use bcm_db::outbox::NewOutboxMessage;
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

use crate::auth::Principal;
use crate::error::ApiError;
use crate::extract::Body;
use crate::views::NodeView;
use crate::AppState;
use bcm_metal::outbox;

/// The longest `abort` reason.
pub const MAX_REASON: usize = 512;

bcm_core::wire_enum! {
    /// The BMC driver of a machine to enroll (an adopted machine, driver
    /// `none`, joins with a token instead).
    pub enum EnrollDriver "BMC driver" {
        Redfish = "redfish",
        Ipmi = "ipmi",
        Sim = "sim",
    }
}

impl From<EnrollDriver> for BmcDriver {
    fn from(d: EnrollDriver) -> Self {
        match d {
            EnrollDriver::Redfish => BmcDriver::Redfish,
            EnrollDriver::Ipmi => BmcDriver::Ipmi,
            EnrollDriver::Sim => BmcDriver::Sim,
        }
    }
}

/// BMC address and credentials of a node to enroll.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EnrollBmc {
    /// Default: the `management` driver of the node's effective hardware
    /// profile; one that contradicts it is `INVALID_CONFIG`.
    #[serde(default)]
    pub driver: Option<EnrollDriver>,
    /// e.g. `https://10.0.0.10` (Redfish) or `10.0.0.10:623` (IPMI). Stored
    /// in its one spelling (scheme and host lower-cased, the default port
    /// and a trailing `/` dropped; IPMI as `ipmi://host:port`), so a BMC is
    /// enrolled once per site however it is written; one the driver cannot
    /// use (credentials, a query or a fragment in it, not a URL for
    /// Redfish) is `INVALID_CONFIG`.
    #[schema(
        min_length = 1,
        max_length = 255,
        pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]*[^\\u0000-\\u0020\\u007f-\\u009f][^\\u0000-\\u001f\\u007f-\\u009f]*$"
    )]
    pub address: String,
    #[schema(value_type = String, min_length = 1, max_length = 255, pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]*[^\\u0000-\\u0020\\u007f-\\u009f][^\\u0000-\\u001f\\u007f-\\u009f]*$")]
    pub username: SecretString,
    #[schema(value_type = String, format = Password, min_length = 1, max_length = 1024, pattern = "^[^\\u0000-\\u001f\\u007f]*$")]
    pub password: SecretString,
    /// How to check the Redfish BMC's TLS certificate (driver `redfish`
    /// only: with another driver it is INVALID_CONFIG); default: the bmc
    /// service's setting.
    #[serde(default)]
    pub tls: Option<bcm_core::BmcTls>,
}

/// `metal.enroll`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EnrollRequest {
    pub tenant_id: TenantId,
    pub pool_id: PoolId,
    pub bmc: EnrollBmc,
    /// Overrides the pool's `policy.hardwareProfile` for this node: a
    /// configured hardware profile (another is `INVALID_CONFIG`).
    #[serde(default)]
    #[schema(min_length = 1, max_length = 64, pattern = "^[a-z0-9._-]{1,64}$")]
    pub hardware_profile: Option<String>,
    /// PXE MACs, when known before out-of-band inspection (at most 64).
    #[serde(default)]
    #[schema(max_items = 64, inline, value_type = Vec<MacAddress>)]
    pub macs: Vec<String>,
}

/// A MAC address, `aa:bb:cc:dd:ee:ff`.
#[derive(utoipa::ToSchema)]
#[schema(pattern = "^[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){5}$")]
pub struct MacAddress(#[allow(dead_code)] String);

/// A verb on one node.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeRequest {
    pub tenant_id: TenantId,
    pub node_id: NodeId,
}

/// `metal.deploy`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeployRequest {
    pub tenant_id: TenantId,
    pub node_id: NodeId,
    /// A profile of the tenant's catalog (NOT_FOUND when it has no such
    /// version).
    #[schema(pattern = "^[a-z0-9._-]{1,64}$")]
    pub profile_id: String,
    #[serde(deserialize_with = "crate::whole_number::required")]
    #[schema(minimum = 1, maximum = 2147483647)]
    pub profile_version: u32,
}

/// `metal.undeploy`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UndeployRequest {
    pub tenant_id: TenantId,
    pub node_id: NodeId,
    /// Default: the pool's `releaseWipe` (`quick` unless it says
    /// otherwise). `none` is refused (`INVALID_ARGUMENT`): a released node
    /// reaches `ready` only through a verified wipe.
    #[serde(default)]
    #[schema(schema_with = crate::openapi::release_wipe_schema)]
    pub wipe: Option<WipeMode>,
}

/// `metal.rescue`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RescueRequest {
    pub tenant_id: TenantId,
    pub node_id: NodeId,
    /// The operator's SSH public key, one `authorized_keys` line (`<type>
    /// <base64> [comment]`; ed25519, ECDSA or RSA of at least 2,048 bits).
    /// The rescue ramdisk lets root in over SSH with this key only, until
    /// the node leaves `rescue`. Without it the rescue ramdisk is entered
    /// through the BMC's serial console. A private key, options or a key
    /// whose data names another type: `INVALID_ARGUMENT`.
    #[serde(default)]
    #[schema(min_length = 1, max_length = 1600)]
    pub ssh_public_key: Option<String>,
}

/// `metal.abort`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AbortRequest {
    pub tenant_id: TenantId,
    pub node_id: NodeId,
    /// Why, for the node's `lastError`.
    #[serde(default)]
    #[schema(max_length = 512, pattern = "^[^\\u0000-\\u001f\\u007f]*$")]
    pub reason: Option<String>,
}

/// A new BMC password: 12-64 letters, digits and `-_.!@%+=,^~`, with a
/// lowercase letter, an uppercase letter and a digit. (An IPMI BMC takes at
/// most 20 characters: a longer one for an IPMI node is INVALID_CONFIG.)
pub struct NewPassword;

impl utoipa::PartialSchema for NewPassword {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{AllOfBuilder, ObjectBuilder, Type};
        let has = |pattern: &str| {
            ObjectBuilder::new()
                .schema_type(Type::String)
                .pattern(Some(pattern))
        };
        AllOfBuilder::new()
            .item(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .format(Some(utoipa::openapi::SchemaFormat::KnownFormat(
                        utoipa::openapi::KnownFormat::Password,
                    )))
                    .pattern(Some(format!(
                        "^[A-Za-z0-9{}]{{{},{}}}$",
                        bcm_core::bmc::PASSWORD_SYMBOLS_CLASS,
                        bcm_core::bmc::MIN_PASSWORD,
                        bcm_core::bmc::MAX_PASSWORD
                    ))),
            )
            .item(has("[a-z]"))
            .item(has("[A-Z]"))
            .item(has("[0-9]"))
            .description(Some(
                "12-64 letters, digits and `-_.!@%+=,^~`, with a lowercase letter, an uppercase letter and a digit",
            ))
            .into()
    }
}

impl utoipa::ToSchema for NewPassword {}

/// `metal.rotateCredentials`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RotateCredentialsRequest {
    pub tenant_id: TenantId,
    pub node_id: NodeId,
    /// The new password; default: a random one nobody sees.
    #[serde(default)]
    #[schema(value_type = Option<NewPassword>)]
    pub password: Option<SecretString>,
}

/// `metal.power`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PowerRequest {
    pub tenant_id: TenantId,
    pub node_id: NodeId,
    pub action: PowerAction,
}

fn check_mac(mac: &str) -> Result<String, ApiError> {
    if bcm_core::text::is_mac(mac) {
        Ok(mac.to_ascii_lowercase())
    } else {
        Err(ApiError::invalid(format!(
            "{mac:?} is not a MAC address (aa:bb:cc:dd:ee:ff)"
        )))
    }
}

/// The pool `pool_id` of `tenant`, if the caller may enroll (or adopt)
/// machines into it; another tenant's pool is NOT_FOUND.
pub(crate) async fn pool_to_enroll_into(
    a: &crate::Inner,
    who: &Principal,
    tenant: &TenantId,
    pool_id: &PoolId,
) -> Result<bcm_db::tenancy::Pool, ApiError> {
    let pool = match bcm_db::tenancy::pool_fetch(&a.db, pool_id).await {
        Ok(p) if p.tenant_id == *tenant => p,
        Ok(_) | Err(bcm_db::DbError::NotFound) => {
            return Err(ApiError::new(
                ErrorCode::NotFound,
                format!("pool {pool_id} not found in tenant {tenant}"),
            ))
        }
        Err(e) => return Err(e.into()),
    };
    who.require(
        Action::PoolsEnroll,
        &Placement {
            tenant: pool.tenant_id.clone(),
            pool: pool.id.clone(),
        },
        || format!("pool {}", pool.id),
    )?;
    Ok(pool)
}

/// A profile id or name (`bcm_core::text::is_profile_id`: the schema's
/// `^[a-z0-9._-]{1,64}$`).
pub(crate) fn check_profile_id(field: &str, v: &str) -> Result<(), ApiError> {
    if !bcm_core::text::is_profile_id(v) {
        return Err(ApiError::invalid(format!(
            "{field} must be 1-64 characters of a-z, 0-9, '.', '-' or '_'"
        )));
    }
    Ok(())
}

/// A printable text of 1 to `max` characters (`bcm_core::text`, the rule
/// the schema's pattern states).
pub(crate) fn check_text(field: &str, v: &str, max: usize) -> Result<(), ApiError> {
    if !bcm_core::text::is_printable(v, max) {
        return Err(ApiError::invalid(format!(
            "{field} must be 1-{max} printable characters, not only spaces"
        )));
    }
    Ok(())
}

/// `POST /api/compute/metal/enroll`: creates the node in `enrolling`.
#[utoipa::path(post, path = "/api/compute/metal/enroll", request_body = EnrollRequest, tag = "metal",
    responses((status = 200, body = NodeView), crate::error::ErrorResponses),
    security(("bearer" = [])))]
pub async fn enroll(
    State(app): State<AppState>,
    who: Principal,
    Body(req): Body<EnrollRequest>,
) -> Result<Json<NodeView>, ApiError> {
    let a = &app.inner;
    // What the schema states first (400), then who may enroll where (404,
    // 403), then what this configuration can serve (422).
    check_text("bmc.address", &req.bmc.address, 255)?;
    check_text("bmc.username", req.bmc.username.expose_secret(), 255)?;
    if !bcm_core::text::is_free_text(req.bmc.password.expose_secret(), 1, 1024) {
        return Err(ApiError::invalid(
            "bmc.password must be 1-1024 characters without control characters",
        ));
    }
    let bmc_tls = req
        .bmc
        .tls
        .map(bcm_core::BmcTls::normalized)
        .transpose()
        .map_err(ApiError::invalid)?;
    if let Some(p) = &req.hardware_profile {
        check_profile_id("hardwareProfile", p)?;
    }
    if req.macs.len() > 64 {
        return Err(ApiError::invalid("macs must name at most 64 MACs"));
    }
    let macs = req
        .macs
        .iter()
        .map(|m| check_mac(m))
        .collect::<Result<Vec<_>, _>>()?;
    let pool = pool_to_enroll_into(a, &who, &req.tenant_id, &req.pool_id).await?;
    // The node's effective hardware profile: its override, else its
    // pool's, else the default; the BMC driver is what it binds to
    // `management`, and the node keeps every concern's driver.
    let (hardware_profile, profile) = a
        .hardware
        .effective(
            req.hardware_profile.as_deref(),
            Some(pool.hardware_profile.as_str()),
            &a.default_hardware_profile,
        )
        .map_err(|e| ApiError::new(ErrorCode::InvalidConfig, e.to_string()))?;
    let drivers = profile.drivers;
    let hardware_profile = hardware_profile.to_owned();
    let driver = drivers.management;
    if let Some(given) = req.bmc.driver.map(BmcDriver::from) {
        if given != driver {
            return Err(ApiError::new(
                ErrorCode::InvalidConfig,
                format!("bmc.driver {given} contradicts hardware profile {hardware_profile}, whose management driver is {driver}"),
            ));
        }
    }
    if matches!(driver, BmcDriver::None) || matches!(drivers.power, BmcDriver::None) {
        return Err(ApiError::new(
            ErrorCode::InvalidConfig,
            format!("hardware profile {hardware_profile} binds no BMC driver; a machine without one joins with a token (adopt)"),
        ));
    }
    let agent = bcm_core::agentless::AgentMode::parse(&pool.agent_mode).unwrap_or_default();
    if let Some(concern) = bcm_core::hardware::unserved_by_chain(&drivers, Operation::Enroll, agent)
    {
        return Err(ApiError::new(
            ErrorCode::InvalidConfig,
            format!("hardware profile {hardware_profile} binds no {concern} driver, which enrollment needs"),
        ));
    }
    if bmc_tls.is_some() && !bcm_core::BmcTls::applies_to(driver) {
        return Err(ApiError::new(
            ErrorCode::InvalidConfig,
            format!("bmc.tls applies to the redfish driver only, not {driver}"),
        ));
    }
    // One spelling per BMC, so the site's uniqueness holds across
    // spellings; an address the driver cannot use (its schema is any
    // text) is a configuration this driver cannot serve.
    let address = bcm_core::bmc::canonical_address(driver, &req.bmc.address)
        .map_err(|e| ApiError::new(ErrorCode::InvalidConfig, e))?;

    let id = NodeId::generate();
    let creds = bcm_seal::BmcCredentials {
        username: req.bmc.username,
        password: req.bmc.password,
    };
    let sealed = a.sealer.seal_credentials(&creds, &id.to_string())?;
    let secret = bcm_db::secrets::SealedSecretRow {
        id: format!("sec_{}", ulid::Ulid::new().to_string().to_lowercase()),
        owner: id.to_string(),
        purpose: "bmc-credentials".to_owned(),
        key_id: sealed.key_id,
        nonce: sealed.nonce,
        ciphertext: sealed.ciphertext,
    };
    let mut node = Node {
        bmc_secret_id: Some(secret.id.clone()),
        bmc_tls,
        macs,
        drivers: Some(drivers),
        ..Node::first(
            id,
            pool.tenant_id.clone(),
            pool.id.clone(),
            pool.site_id.clone(),
            ProvisionState::Enrolling,
            driver,
            address,
            hardware_profile,
        )
    };
    let mut tx = a.db.begin().await?;
    // Enrollment's chain (verify, inspect, commission) runs under a
    // one-node batch of its own.
    let batch = bcm_metal::batches::node_batch_in_txn(
        &mut tx,
        &node,
        Operation::Enroll,
        None,
        &who.name,
        &format!("enroll of node {} by {}", node.id, who.name),
        chrono::Duration::seconds(a.quorum.node_batch_ttl_secs as i64),
        a.policy_signer.as_ref(),
        a.edge_quorum,
        None,
    )
    .await?;
    node.batch_id = Some(batch.id);
    let rows = outbox::created(a.bus.subjects(), &node, "enroll", Some(&who.name));
    bcm_db::secrets::secret_insert_in_txn(&mut tx, &secret).await?;
    nodes::node_insert_in_txn(&mut tx, &node).await?;
    // Its enrollment's workflow and commands are done in this name.
    nodes::node_actor_set_in_txn(
        &mut tx,
        &node.id.to_string(),
        &who.name,
        bcm_bus::current_traceparent().as_deref(),
    )
    .await?;
    bcm_metal::outbox::write_in_txn(&mut tx, rows).await?;
    tx.commit().await.map_err(bcm_db::DbError::from)?;
    metrics::counter!("bcm_api_verbs_total", "verb" => "enroll", "outcome" => "ok").increment(1);
    tracing::info!(node = %node.id, pool = %node.pool_id, "enrolled");
    Ok(Json(NodeView::from(&node)))
}

/// What a verb carries beyond the node.
#[derive(Debug, Clone)]
enum Extra {
    None,
    Deploy {
        profile_id: String,
        profile_version: u32,
    },
    Release {
        /// `None`: the pool's default.
        wipe: Option<WipeMode>,
    },
    Abort {
        reason: Option<String>,
    },
    Power {
        action: PowerAction,
    },
    Rotate {
        password: Option<SecretString>,
    },
    Rescue {
        ssh_public_key: Option<bcm_core::rescue::SshPublicKey>,
    },
}

/// Runs `verb` on a node in one transaction and returns its view.
async fn run_verb(
    app: &AppState,
    who: &Principal,
    tenant: &TenantId,
    node_id: &NodeId,
    verb: Verb,
    extra: Extra,
) -> Result<NodeView, ApiError> {
    let a = &app.inner;
    let placement = match nodes::placement_fetch(&a.db, node_id).await {
        Ok((t, p)) if t == *tenant => Placement { tenant: t, pool: p },
        Ok(_) | Err(bcm_db::DbError::NotFound) => return Err(ApiError::node_not_found(node_id)),
        Err(e) => return Err(e.into()),
    };
    who.require(Action::for_verb(verb), &placement, || {
        format!("node {node_id}")
    })?;

    let mut tx = a.db.begin_with_lock_timeout(a.lock_timeout_ms).await?;
    // The pool's agent policy is read before the node is locked (the lock
    // does not cover the pool's row): one statement fewer under the lock.
    let agent = bcm_db::tenancy::pool_agent_policy_in_txn(&mut tx, placement.pool.as_str())
        .await?
        .agent;
    let node = nodes::node_fetch_for_update_in_txn(&mut tx, node_id).await?;
    let facts = bcm_metal::moves::facts_in_txn(&mut tx, &node).await?;
    let t = apply(facts, Move::Verb(verb))?;
    // A chain whose workflows need a concern the node's hardware profile
    // leaves unbound cannot be served (nodes enrolled with a profile).
    if let Some(why) =
        Operation::for_verb(verb).and_then(|op| bcm_core::agentless::refuses(agent, op))
    {
        return Err(ApiError::new(
            ErrorCode::InvalidConfig,
            format!("node {} is in pool {}: {why}", node.id, node.pool_id),
        ));
    }
    if let (Some(drivers), Some(op)) = (node.drivers, Operation::for_verb(verb)) {
        if let Some(concern) = bcm_core::hardware::unserved_by_chain(&drivers, op, agent) {
            return Err(ApiError::new(
                ErrorCode::InvalidConfig,
                format!(
                    "node {}'s hardware profile {} binds no {concern} driver, which {op} needs",
                    node.id, node.hardware_profile
                ),
            ));
        }
    }
    if node.is_adopted() && matches!(extra, Extra::Power { .. } | Extra::Rotate { .. }) {
        return Err(ApiError::new(
            ErrorCode::InvalidConfig,
            format!("node {} was adopted and has no BMC", node.id),
        ));
    }
    let s = a.bus.subjects();
    let mut rows: Vec<NewOutboxMessage> = vec![];
    let result = if let Extra::Rotate { password } = extra {
        let (next, cmd_rows) = begin_rotation(a, &mut tx, node, password, Some(&who.name)).await?;
        rows.extend(cmd_rows);
        next
    } else if let Extra::Power { action } = extra {
        let (cmd, row) = bcm_metal::bmc::leaf_command_in_txn(
            &mut tx,
            s,
            &node,
            bcm_core::hardware::Concern::Power,
            "power",
            Some(&who.name),
            None,
            |bmc| Command::BmcPower(PowerParams { bmc, action }),
        )
        .await?;
        rows.extend(
            leaf_batch(
                a,
                &mut tx,
                &node,
                Operation::for_power(action),
                &who.name,
                row,
            )
            .await?,
        );
        rows.push(outbox::event(
            s,
            &node,
            bcm_contracts::events::NodePowerRequested {
                node_id: node.id,
                tenant_id: node.tenant_id.clone(),
                action,
                command_id: cmd.command_id.clone(),
                version: node.version,
            },
        ));
        node
    } else if !t.changed {
        // A repeated unrescue: nothing changes, nothing is published.
        tx.rollback().await.map_err(bcm_db::DbError::from)?;
        return Ok(NodeView::from(&node));
    } else {
        let mut next = bcm_metal::moves::next_node(&node, &t);
        match extra {
            Extra::Deploy {
                profile_id,
                profile_version,
            } => {
                // The node keeps a snapshot of the (immutable) version it
                // deploys; the workflow and the role come from it.
                let definition = bcm_db::deploy_profiles::deploy_profile_fetch_in_txn(
                    &mut tx,
                    node.tenant_id.as_str(),
                    &profile_id,
                    profile_version as i32,
                )
                .await?
                .ok_or_else(|| {
                    ApiError::new(ErrorCode::NotFound, format!(
                        "deploy profile {profile_id} v{profile_version} is not in tenant {}'s catalog",
                        node.tenant_id
                    ))
                })?;
                let policy =
                    bcm_db::tenancy::pool_verb_policy_in_txn(&mut tx, node.pool_id.as_str())
                        .await?;
                if let Some(accepted) = policy.deploy_profiles {
                    if !accepted.contains(&profile_id) {
                        return Err(ApiError::new(
                            ErrorCode::InvalidConfig,
                            format!(
                                "pool {} does not accept deploy profile {profile_id} (its policy accepts {accepted:?})",
                                node.pool_id
                            ),
                        ));
                    }
                }
                bcm_core::agentless::deploy_fits(agent, definition.image.format).map_err(
                    |why| {
                        ApiError::new(
                            ErrorCode::InvalidConfig,
                            format!(
                                "deploy profile {profile_id} v{profile_version} on pool {}: {why}",
                                node.pool_id
                            ),
                        )
                    },
                )?;
                let (bcd, os, arch) = bcm_contracts::downloads::INSTALLED_OS_BCD;
                if definition.needs_bcd()
                    && bcm_db::downloads::download_latest_in_txn(&mut tx, bcd, os, arch)
                        .await?
                        .is_none()
                {
                    return Err(ApiError::new(
                        ErrorCode::InvalidConfig,
                        format!(
                            "deploy profile {profile_id} v{profile_version} installs bcd from the control plane, and no {bcd} for {os}-{arch} is published (api.downloads.bcd)"
                        ),
                    ));
                }
                if definition.role == bcm_core::deploy::DeployRole::Dedicated {
                    // A dedicated-root lease is asked for: the pool's policy
                    // and capacity decide; a refusal is recorded (and
                    // announced) with its reason, and the node is left as
                    // it was.
                    let (held, max) = bcm_db::tenant_leases::pool_open_leases_in_txn(
                        &mut tx,
                        node.pool_id.as_str(),
                    )
                    .await?;
                    if let Err((code, why)) =
                        bcm_core::dedicated::admit(node.pool_id.as_str(), max, held)
                    {
                        bcm_metal::tenant_root::refuse_in_txn(
                            &mut tx,
                            s,
                            &node,
                            &format!("{profile_id}@{profile_version}"),
                            &why,
                            Some(&who.name),
                        )
                        .await?;
                        tx.commit().await.map_err(bcm_db::DbError::from)?;
                        return Err(ApiError::new(
                            code,
                            format!(
                                "the dedicated-root lease of node {} is refused: {why}",
                                node.id
                            ),
                        ));
                    }
                }
                next.deploy_profile = Some(definition);
            }
            Extra::Release { wipe } => {
                let policy =
                    bcm_db::tenancy::pool_verb_policy_in_txn(&mut tx, node.pool_id.as_str())
                        .await?;
                let pool_wipe = WipeMode::parse(&policy.release_wipe).ok_or_else(|| {
                    ApiError::internal(format!("pool {} has a bad release wipe", node.pool_id))
                })?;
                // A dedicated node's tenant was root: never a quick wipe.
                let role = node.deploy_profile.as_ref().map(|p| p.role);
                let wipe = bcm_core::dedicated::release_wipe(role, wipe, pool_wipe)
                    .map_err(|why| ApiError::new(ErrorCode::InvalidArgument, why))?;
                next.release_wipe = Some(wipe);
            }
            Extra::Abort { reason } => {
                next.last_error = Some(match reason {
                    Some(r) => format!("aborted by {}: {r}", who.name),
                    None => format!("aborted by {}", who.name),
                });
            }
            Extra::Rescue { ssh_public_key } => {
                bcm_metal::rescue::record_access_in_txn(
                    &mut tx,
                    &node.id.to_string(),
                    ssh_public_key.as_ref(),
                    &who.name,
                )
                .await?;
                tracing::info!(node = %node.id, by = %who.name, key = ?ssh_public_key.as_ref().map(|k| k.fingerprint()), "rescue access recorded");
            }
            Extra::None | Extra::Power { .. } | Extra::Rotate { .. } => {}
        }
        // A verb that leaves the state of the node's workflow (abort,
        // undeploy from rescue, retire from enrolling) cancels it: the
        // running step stops and the cleanup steps still run; the new
        // state's workflow waits for them.
        if t.leaves_workflow() {
            if let Some(wf) = node.workflow_id {
                if bcm_db::workflows::workflow_request_cancel_in_txn(&mut tx, &wf.to_string())
                    .await?
                {
                    tracing::info!(node = %node.id, workflow = %wf, verb = verb.as_str(), "the verb cancels the workflow of the state it leaves");
                }
            }
        }
        // A dedicated node's teardown rotates its BMC password: the new one
        // is recorded (sealed) now, before anything is sent; one recorded
        // by an earlier attempt is kept (the BMC may hold it already).
        if t.to == bcm_core::ProvisionState::Releasing
            && bcm_metal::tenant_root::is_dedicated(&next)
            && next.bmc_secret_id.is_some()
        {
            record_teardown_password(a, &mut tx, &next).await?;
        }
        // The chain the verb starts runs under a one-node batch of its own
        // (abort's cleanup runs under the batch it stops).
        if let Some(op) = Operation::for_verb(verb).filter(|op| !op.chain().is_empty()) {
            let batch = bcm_metal::batches::node_batch_in_txn(
                &mut tx,
                &next,
                op,
                next.release_wipe,
                &who.name,
                &format!("{op} of node {} by {}", next.id, who.name),
                chrono::Duration::seconds(a.quorum.node_batch_ttl_secs as i64),
                a.policy_signer.as_ref(),
                a.edge_quorum,
                None,
            )
            .await?;
            next.batch_id = Some(batch.id);
        }
        bcm_metal::moves::commit_in_txn(
            &mut tx,
            s,
            next,
            &t,
            verb.as_str(),
            bcm_metal::moves::FollowUp::Reconcile,
            Some(&who.name),
        )
        .await?
    };
    bcm_metal::outbox::write_in_txn(&mut tx, rows).await?;
    tx.commit().await.map_err(bcm_db::DbError::from)?;
    tracing::info!(node = %result.id, verb = verb.as_str(), from = %t.from, to = %t.to, "verb applied");
    Ok(NodeView::from(&result))
}

/// Phase 0 of a two-phase BMC password rotation, in the verb's
/// transaction: the new password is sealed for the node and recorded as
/// pending beside the current one, and a `bmc.rotateCredentials` command
/// carrying both (sealed) is queued. An unresolved earlier rotation is
/// resumed with its pending password instead.
/// Records a dedicated node's teardown password, sealed for the node,
/// unless one is recorded already.
async fn record_teardown_password(
    a: &crate::Inner,
    tx: &mut bcm_db::Tx<'_>,
    node: &Node,
) -> Result<(), ApiError> {
    let owner = node.id.to_string();
    let purpose = bcm_core::dedicated::TEARDOWN_PASSWORD_PURPOSE;
    if bcm_db::secrets::secret_of_owner_in_txn(tx, &owner, purpose)
        .await?
        .is_some()
    {
        return Ok(());
    }
    // Only the password is new; the bmc service keeps the username.
    let creds = bcm_seal::BmcCredentials {
        username: SecretString::from(String::new()),
        password: bcm_seal::generate_password(16),
    };
    let sealed = a.sealer.seal_credentials(&creds, &owner)?;
    bcm_db::secrets::secret_insert_in_txn(
        tx,
        &bcm_db::secrets::SealedSecretRow {
            id: format!("sec_{}", ulid::Ulid::new().to_string().to_lowercase()),
            owner,
            purpose: purpose.to_owned(),
            key_id: sealed.key_id,
            nonce: sealed.nonce,
            ciphertext: sealed.ciphertext,
        },
    )
    .await?;
    Ok(())
}

async fn begin_rotation(
    a: &crate::Inner,
    tx: &mut bcm_db::Tx<'_>,
    node: Node,
    password: Option<SecretString>,
    actor: Option<&str>,
) -> Result<(Node, Vec<NewOutboxMessage>), ApiError> {
    if node.bmc_driver == BmcDriver::Sim {
        return Err(ApiError::new(
            ErrorCode::InvalidConfig,
            "the sim driver has no BMC accounts to rotate",
        ));
    }
    if node.bmc_secret_id.is_none() {
        return Err(ApiError::new(
            ErrorCode::InvalidState,
            format!("node {} has no BMC credentials on record", node.id),
        ));
    }
    if let Some(cmd) = &node.bmc_rotation_command_id {
        return Err(ApiError::new(
            ErrorCode::Conflict,
            format!(
                "node {} is already rotating its BMC password (command {cmd})",
                node.id
            ),
        ));
    }
    let pending_id = match (&node.bmc_pending_secret_id, password) {
        (Some(_), Some(_)) => {
            return Err(ApiError::new(
                ErrorCode::Conflict,
                format!(
                    "node {} holds the pending password of an unresolved rotation; rotate without a password to resume it",
                    node.id
                ),
            ))
        }
        (Some(pending), None) => pending.clone(),
        (None, password) => {
            let password = match password {
                Some(p) => {
                    bcm_core::bmc::check_password(node.bmc_driver, p.expose_secret())
                        .map_err(|e| match e {
                            bcm_core::bmc::PasswordError::Shape(why) => ApiError::invalid(why),
                            too_long => ApiError::new(ErrorCode::InvalidConfig, too_long.to_string()),
                        })?;
                    p
                }
                None => bcm_seal::generate_password(16),
            };
            // Only the password is new; the bmc service keeps the username.
            let creds = bcm_seal::BmcCredentials {
                username: SecretString::from(String::new()),
                password,
            };
            let sealed = a.sealer.seal_credentials(&creds, &node.id.to_string())?;
            let secret = bcm_db::secrets::SealedSecretRow {
                id: format!("sec_{}", ulid::Ulid::new().to_string().to_lowercase()),
                owner: node.id.to_string(),
                purpose: "bmc-pending-password".to_owned(),
                key_id: sealed.key_id,
                nonce: sealed.nonce,
                ciphertext: sealed.ciphertext,
            };
            bcm_db::secrets::secret_insert_in_txn(tx, &secret).await?;
            secret.id
        }
    };
    let s = a.bus.subjects();
    let pending_credentials = bcm_metal::bmc::sealed_in_txn(tx, &pending_id).await?;
    let (cmd, cmd_row) = bcm_metal::bmc::leaf_command_in_txn(
        tx,
        s,
        &node,
        bcm_core::hardware::Concern::Management,
        "rotate-credentials",
        actor,
        None,
        |bmc| {
            Command::BmcRotateCredentials(RotateParams {
                bmc,
                pending_credentials,
            })
        },
    )
    .await?;
    let mut rows = leaf_batch(
        a,
        tx,
        &node,
        Operation::RotateCredentials,
        actor.unwrap_or("control-plane"),
        cmd_row,
    )
    .await?;
    let mut next = node;
    next.bmc_pending_secret_id = Some(pending_id);
    next.bmc_rotation_command_id = Some(cmd.command_id.clone());
    next.version = nodes::node_update_guarded_in_txn(tx, &next).await?;
    let started = outbox::event(
        s,
        &next,
        bcm_contracts::events::NodeCredentialsRotation {
            node_id: next.id,
            tenant_id: next.tenant_id.clone(),
            outcome: bcm_contracts::events::RotationOutcome::Started,
            command_id: cmd.command_id,
            error: None,
            version: next.version,
        },
    );
    rows.push(started);
    Ok((next, rows))
}

/// The one-leaf batch of a BMC command outside workflows (`metal.power`, a
/// rotation): the command's message goes out now, carrying the batch's
/// authority, when the pool's policy approves the batch as it is made;
/// otherwise the batch holds it until the approval that completes its
/// quorum releases it.
async fn leaf_batch(
    a: &crate::Inner,
    tx: &mut bcm_db::Tx<'_>,
    node: &Node,
    op: Operation,
    requested_by: &str,
    row: NewOutboxMessage,
) -> Result<Vec<NewOutboxMessage>, ApiError> {
    let batch = bcm_metal::batches::node_batch_in_txn(
        tx,
        node,
        op,
        None,
        requested_by,
        &format!("{op} of node {} by {requested_by}", node.id),
        bcm_metal::bmc::LEAF_COMMAND_TTL,
        a.policy_signer.as_ref(),
        a.edge_quorum,
        Some(row),
    )
    .await?;
    // Approved as it was made: the command goes out now, not held.
    if batch.send_now.is_none() {
        tracing::info!(node = %node.id, batch = %batch.id, %op, "the command waits for its batch's approvers");
    }
    Ok(batch.send_now.into_iter().collect())
}

/// A verb's request body: the node it names, and what else it carries once
/// checked.
trait VerbRequest {
    fn into_parts(self) -> Result<(TenantId, NodeId, Extra), ApiError>;
}

impl VerbRequest for NodeRequest {
    fn into_parts(self) -> Result<(TenantId, NodeId, Extra), ApiError> {
        Ok((self.tenant_id, self.node_id, Extra::None))
    }
}

impl VerbRequest for DeployRequest {
    fn into_parts(self) -> Result<(TenantId, NodeId, Extra), ApiError> {
        check_profile_id("profileId", &self.profile_id)?;
        if self.profile_version == 0 || i32::try_from(self.profile_version).is_err() {
            return Err(ApiError::invalid("profileVersion must be 1 to 2147483647"));
        }
        let extra = Extra::Deploy {
            profile_id: self.profile_id,
            profile_version: self.profile_version,
        };
        Ok((self.tenant_id, self.node_id, extra))
    }
}

impl VerbRequest for UndeployRequest {
    fn into_parts(self) -> Result<(TenantId, NodeId, Extra), ApiError> {
        Ok((
            self.tenant_id,
            self.node_id,
            Extra::Release {
                wipe: match self.wipe {
                    Some(w) if !w.can_reach_ready() => {
                        return Err(ApiError::invalid(bcm_core::node::WIPE_NONE_REFUSED))
                    }
                    w => w,
                },
            },
        ))
    }
}

impl VerbRequest for RescueRequest {
    fn into_parts(self) -> Result<(TenantId, NodeId, Extra), ApiError> {
        let ssh_public_key = self
            .ssh_public_key
            .as_deref()
            .map(bcm_core::rescue::check_ssh_public_key)
            .transpose()
            .map_err(|e| ApiError::invalid(e.to_string()))?;
        Ok((
            self.tenant_id,
            self.node_id,
            Extra::Rescue { ssh_public_key },
        ))
    }
}

impl VerbRequest for AbortRequest {
    fn into_parts(self) -> Result<(TenantId, NodeId, Extra), ApiError> {
        if self
            .reason
            .as_ref()
            .is_some_and(|r| !bcm_core::text::is_free_text(r, 0, MAX_REASON))
        {
            return Err(ApiError::invalid(format!(
                "reason must be at most {MAX_REASON} characters without control characters"
            )));
        }
        Ok((
            self.tenant_id,
            self.node_id,
            Extra::Abort {
                reason: self.reason,
            },
        ))
    }
}

impl VerbRequest for PowerRequest {
    fn into_parts(self) -> Result<(TenantId, NodeId, Extra), ApiError> {
        Ok((
            self.tenant_id,
            self.node_id,
            Extra::Power {
                action: self.action,
            },
        ))
    }
}

impl VerbRequest for RotateCredentialsRequest {
    fn into_parts(self) -> Result<(TenantId, NodeId, Extra), ApiError> {
        if let Some(p) = &self.password {
            bcm_core::bmc::check_password_rule(p.expose_secret())
                .map_err(|e| ApiError::invalid(e.to_string()))?;
        }
        let extra = Extra::Rotate {
            password: self.password,
        };
        Ok((self.tenant_id, self.node_id, extra))
    }
}

/// Runs `verb` for a request, counting and timing it.
async fn verb_endpoint(
    app: AppState,
    who: Principal,
    verb: Verb,
    req: impl VerbRequest,
) -> Result<Json<NodeView>, ApiError> {
    let started = std::time::Instant::now();
    let out = match req.into_parts() {
        Ok((tenant, node, extra)) => run_verb(&app, &who, &tenant, &node, verb, extra).await,
        Err(e) => Err(e),
    };
    let outcome = match &out {
        Ok(_) => "ok".to_owned(),
        Err(e) => format!("{:?}", e.code),
    };
    metrics::counter!("bcm_api_verbs_total", "verb" => verb.as_str(), "outcome" => outcome)
        .increment(1);
    metrics::histogram!("bcm_api_verb_seconds", "verb" => verb.as_str())
        .record(started.elapsed().as_secs_f64());
    out.map(Json)
}

macro_rules! node_verb {
    ($name:ident, $path:literal, $verb:expr, $doc:literal) => {
        #[doc = $doc]
        #[utoipa::path(post, path = $path, request_body = NodeRequest, tag = "metal",
                    responses((status = 200, body = NodeView), crate::error::ErrorResponses),
                    security(("bearer" = [])))]
        pub async fn $name(
            State(app): State<AppState>,
            who: Principal,
            Body(req): Body<NodeRequest>,
        ) -> Result<Json<NodeView>, ApiError> {
            verb_endpoint(app, who, $verb, req).await
        }
    };
}

node_verb!(
    manage,
    "/api/compute/metal/manage",
    Verb::Manage,
    "`metal.manage`: `ready` → `enrolling` (re-verifies the BMC)."
);
node_verb!(
    inspect,
    "/api/compute/metal/inspect",
    Verb::Inspect,
    "`metal.inspect`: `ready` → `inspecting`."
);
node_verb!(
    provide,
    "/api/compute/metal/provide",
    Verb::Provide,
    "`metal.provide`: `ready` → `commissioning`."
);
/// `metal.rescue`: `deployed` → `rescue`, booting the rescue ramdisk that
/// lets the operator in (SSH with the request's key, or the serial
/// console).
#[utoipa::path(post, path = "/api/compute/metal/rescue", request_body = RescueRequest, tag = "metal",
    responses((status = 200, body = NodeView), crate::error::ErrorResponses), security(("bearer" = [])))]
pub async fn rescue(
    State(app): State<AppState>,
    who: Principal,
    Body(req): Body<RescueRequest>,
) -> Result<Json<NodeView>, ApiError> {
    verb_endpoint(app, who, Verb::Rescue, req).await
}
node_verb!(
    unrescue,
    "/api/compute/metal/unrescue",
    Verb::Unrescue,
    "`metal.unrescue`: starts `metal-unrescue`; the node stays in `rescue` until it succeeds."
);
node_verb!(
    recover,
    "/api/compute/metal/recover",
    Verb::Recover,
    "`metal.recover`: `failed` → the recover target of `failedFrom`."
);
node_verb!(
    retire,
    "/api/compute/metal/retire",
    Verb::Retire,
    "`metal.retire`: → `retiring`."
);

/// `metal.deploy`: `ready` → `deploying` with a profile.
#[utoipa::path(post, path = "/api/compute/metal/deploy", request_body = DeployRequest, tag = "metal",
    responses((status = 200, body = NodeView), crate::error::ErrorResponses), security(("bearer" = [])))]
pub async fn deploy(
    State(app): State<AppState>,
    who: Principal,
    Body(req): Body<DeployRequest>,
) -> Result<Json<NodeView>, ApiError> {
    verb_endpoint(app, who, Verb::Deploy, req).await
}

/// `metal.undeploy` (verb `release`): `deployed`/`rescue` → `releasing`.
#[utoipa::path(post, path = "/api/compute/metal/undeploy", request_body = UndeployRequest, tag = "metal",
    responses((status = 200, body = NodeView), crate::error::ErrorResponses), security(("bearer" = [])))]
pub async fn undeploy(
    State(app): State<AppState>,
    who: Principal,
    Body(req): Body<UndeployRequest>,
) -> Result<Json<NodeView>, ApiError> {
    verb_endpoint(app, who, Verb::Release, req).await
}

/// `metal.abort`: a running workflow's state → `failed`.
#[utoipa::path(post, path = "/api/compute/metal/abort", request_body = AbortRequest, tag = "metal",
    responses((status = 200, body = NodeView), crate::error::ErrorResponses), security(("bearer" = [])))]
pub async fn abort(
    State(app): State<AppState>,
    who: Principal,
    Body(req): Body<AbortRequest>,
) -> Result<Json<NodeView>, ApiError> {
    verb_endpoint(app, who, Verb::Abort, req).await
}

/// `metal.power`: queues a BMC power command; the provision state is unchanged.
#[utoipa::path(post, path = "/api/compute/metal/power", request_body = PowerRequest, tag = "metal",
    responses((status = 200, body = NodeView), crate::error::ErrorResponses), security(("bearer" = [])))]
pub async fn power(
    State(app): State<AppState>,
    who: Principal,
    Body(req): Body<PowerRequest>,
) -> Result<Json<NodeView>, ApiError> {
    verb_endpoint(app, who, Verb::Power, req).await
}

/// `metal.rotateCredentials`: a two-phase BMC password rotation. The new
/// password is recorded (sealed) as pending beside the current one; the bmc
/// service sets it on the BMC, logs in with it, and only then is it the one
/// on record. Returns at once; `bmc.rotationPending` clears when it ends
/// (`node.credentials.rotation` says how).
#[utoipa::path(post, path = "/api/compute/metal/rotateCredentials", request_body = RotateCredentialsRequest, tag = "metal",
    responses((status = 200, body = NodeView), crate::error::ErrorResponses), security(("bearer" = [])))]
pub async fn rotate_credentials(
    State(app): State<AppState>,
    who: Principal,
    Body(req): Body<RotateCredentialsRequest>,
) -> Result<Json<NodeView>, ApiError> {
    verb_endpoint(app, who, Verb::RotateCredentials, req).await
}
