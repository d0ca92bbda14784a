//! What each step kind sends and how its result is judged: command
//! parameters (the BMC's sealed credentials travel sealed; join tokens are
//! minted here and only their hashes are stored), and the verdict on a
//! result (a wipe counts only when node-signed and every disk passed
//! read-back, and the attestation service verified the signature).

use bcm_core::deploy::{DeployProfile, UserDataVars};
use bcm_core::workflow::{StepKind, StepOutcome};
use bcm_db::nodes::Node;
use bcm_db::{DbError, Tx};
use serde_json::{json, Value};

use crate::EngineConfig;

/// Mints a one-time join token for `node` and stores its hash.
pub async fn mint_join_token(
    tx: &mut Tx<'_>,
    cfg: &EngineConfig,
    node: &Node,
    purpose: &str,
) -> Result<String, DbError> {
    let expires = chrono::Utc::now() + chrono::Duration::seconds(cfg.join_token_ttl_secs as i64);
    bcm_attestation::tokens::mint_in_txn(
        tx,
        purpose,
        &bcm_db::agents::TokenScope::Node(node.id.to_string()),
        expires,
    )
    .await
}

async fn bmc(tx: &mut Tx<'_>, node: &Node) -> Result<Value, DbError> {
    bcm_metal::bmc::params_in_txn(tx, node).await
}

async fn boot_entry(tx: &mut Tx<'_>, cfg: &EngineConfig, node: &Node) -> Result<Value, DbError> {
    let token = mint_join_token(tx, cfg, node, "discovery").await?;
    Ok(json!({
        "macs": node.macs,
        "kernel": "ramdisk/vmlinuz",
        "initrd": "ramdisk/initrd.img",
        "cmdline": format!("console=ttyS0 bcm.node={} bcm.api={} bcm.join={}", node.id, cfg.control_plane_url, token),
        "expiresInSecs": cfg.join_token_ttl_secs,
    }))
}

/// Why a step's command cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum ParamsError {
    #[error(transparent)]
    Db(#[from] DbError),
    /// The node's data cannot make this command; the step fails for good.
    #[error("{0}")]
    Invalid(String),
}

/// The parameters of the command a step sends.
pub async fn params(
    tx: &mut Tx<'_>,
    cfg: &EngineConfig,
    node: &Node,
    kind: &StepKind,
) -> Result<Value, ParamsError> {
    Ok(match kind {
        StepKind::BmcVerify | StepKind::BmcInspect => json!({ "bmc": bmc(tx, node).await? }),
        StepKind::BmcPowerOff => json!({ "bmc": bmc(tx, node).await?, "action": "off" }),
        StepKind::BmcPower { action } => json!({ "bmc": bmc(tx, node).await?, "action": action }),
        StepKind::BmcBootPxe { persistent } => {
            json!({ "bmc": bmc(tx, node).await?, "device": "pxe", "persistent": persistent })
        }
        StepKind::BmcBootDisk { persistent } => {
            json!({ "bmc": bmc(tx, node).await?, "device": "disk", "persistent": persistent })
        }
        StepKind::BootEntrySet => json!({ "bootEntry": boot_entry(tx, cfg, node).await? }),
        StepKind::BootEntryClear => json!({ "macs": node.macs }),
        StepKind::DiagDcgm { level } => json!({
            "level": level,
            "acceptUnsupported": bcm_db::tenancy::pool_accepts_unsupported_diag_in_txn(tx, node.pool_id.as_str()).await?,
        }),
        StepKind::DiskWipe { mode } => json!({ "mode": mode, "verify": true }),
        StepKind::Inventory => json!({}),
        StepKind::DeployImage => {
            let profile: DeployProfile = node
                .deploy_profile
                .clone()
                .and_then(|p| serde_json::from_value(p).ok())
                .ok_or_else(|| {
                    ParamsError::Invalid("the node carries no valid deploy profile".into())
                })?;
            let token = mint_join_token(tx, cfg, node, "provisioned").await?;
            let user_data = profile
                .render_user_data(&UserDataVars {
                    node_id: &node.id.to_string(),
                    join_token: &token,
                    control_plane_url: &cfg.control_plane_url,
                })
                .map_err(|e| ParamsError::Invalid(format!("deploy profile {}: {e}", profile.id)))?;
            json!({
                "profileId": profile.id,
                "profileVersion": profile.version,
                "image": profile.image,
                "userData": user_data,
            })
        }
        StepKind::StoreMacs
        | StepKind::RevokeIdentity
        | StepKind::ForgetBmcCredentials
        | StepKind::WaitRamdiskJoin
        | StepKind::WaitOsJoin { .. }
        | StepKind::RetiredEnsureRamdisk => json!({}),
    })
}

/// The verdict on a finished command: its outcome, its output to keep, and
/// whether it proved a verified wipe.
pub struct Verdict {
    pub outcome: StepOutcome,
    pub output: Option<Value>,
    pub wipe_verified: bool,
}

/// Judges a command row's result for a step of `kind`.
pub fn judge(kind: &StepKind, cmd: &bcm_db::commands::CommandRow) -> Verdict {
    let result = cmd.result.clone().unwrap_or(Value::Null);
    let output = result.get("output").cloned();
    if cmd.status != "succeeded" {
        let message = result
            .get("error")
            .and_then(Value::as_str)
            .map(|e| format!("{}: {e}", cmd.kind))
            .unwrap_or_else(|| format!("{} failed", cmd.kind));
        let retryable = result
            .get("retryable")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        return Verdict {
            outcome: StepOutcome::Failed { retryable, message },
            output,
            wipe_verified: false,
        };
    }
    match kind {
        StepKind::DiskWipe { .. } => {
            let disks = output
                .as_ref()
                .and_then(|o| o.get("disks"))
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let outcomes: Vec<&str> = disks
                .iter()
                .map(|d| d.get("outcome").and_then(Value::as_str).unwrap_or(""))
                .collect();
            match bcm_core::workflow::wipe_verdict(cmd.attested_by.is_some(), &outcomes) {
                Ok(()) => Verdict {
                    outcome: StepOutcome::Succeeded,
                    output,
                    wipe_verified: true,
                },
                Err(why) => Verdict {
                    outcome: StepOutcome::Failed {
                        retryable: false,
                        message: format!("UNVERIFIED_WIPE: {why}"),
                    },
                    output,
                    wipe_verified: false,
                },
            }
        }
        StepKind::DiagDcgm { .. } => {
            let status = output
                .as_ref()
                .and_then(|o| o.get("status"))
                .and_then(Value::as_str)
                .unwrap_or("");
            if cmd.attested_by.is_none() {
                Verdict {
                    outcome: StepOutcome::Failed {
                        retryable: false,
                        message: "diag.dcgm: the result is not node-signed".into(),
                    },
                    output,
                    wipe_verified: false,
                }
            } else if status == "pass"
                || (status == "unsupported"
                    && cmd.params.get("acceptUnsupported") == Some(&Value::Bool(true)))
            {
                Verdict {
                    outcome: StepOutcome::Succeeded,
                    output,
                    wipe_verified: false,
                }
            } else {
                let message = format!("diag.dcgm reported {status:?}; the pool does not accept it");
                let message = match output
                    .as_ref()
                    .and_then(|o| o.get("reason"))
                    .and_then(Value::as_str)
                {
                    Some(reason) => format!("{message} ({reason})"),
                    None => message,
                };
                Verdict {
                    outcome: StepOutcome::Failed {
                        retryable: false,
                        message,
                    },
                    output,
                    wipe_verified: false,
                }
            }
        }
        _ => Verdict {
            outcome: StepOutcome::Succeeded,
            output,
            wipe_verified: false,
        },
    }
}
