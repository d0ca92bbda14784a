//! What each step kind sends and how its result is judged: the typed
//! command a step sends (the BMC's sealed credentials travel sealed; join
//! tokens are minted here as references, `bcmjref_<id>`, derived under the
//! node's site's join key: only their hashes are stored, and no command
//! holds a token), and the
//! verdict on a result (a wipe counts only when node-signed and every disk
//! passed read-back, and the attestation service verified the signature).

use bcm_contracts::commands::{
    BmcParams, BmcTarget, BootDevice, BootDeviceParams, BootEntryClearParams, BootEntrySetParams,
    BootEntrySpec, Command, DcgmParams, DeployImageParams, DiskEraseParams, MediaAction, NoParams,
    PowerParams, RotateParams, VirtualMediaParams, WipeParams,
};
use bcm_contracts::outputs::{DcgmStatus, Inventory, OobInventory, WipeOutcome};
use bcm_contracts::{CommandKind, Output};
use bcm_core::agentless::{erase_verdict, ErasedDrive, UnattestedErase};
use bcm_core::deploy::UserDataVars;
use bcm_core::hardware::Concern;
use bcm_core::workflow::{
    disks_unaccounted, wipe_verdict, CommandStatus, DiskId, StepKind, StepOutcome, UnverifiedWipe,
};
use bcm_core::{PowerAction, WipeMode};
use bcm_db::nodes::Node;
use bcm_db::{DbError, Tx};

use crate::EngineConfig;

/// Mints a one-time join token for `node` as a reference (its hash is
/// stored; the site's boot service, or the API handing the command to an
/// agent, reveals it).
pub async fn mint_join_token(
    tx: &mut Tx<'_>,
    cfg: &EngineConfig,
    node: &Node,
    purpose: &str,
) -> Result<String, ParamsError> {
    let master = cfg.join_key.key.as_ref().ok_or_else(|| {
        ParamsError::Invalid(
            "INVALID_CONFIG: the engine holds no join key (engine.join_key.file)".into(),
        )
    })?;
    let expires = chrono::Utc::now() + chrono::Duration::seconds(cfg.join_token_ttl_secs as i64);
    Ok(bcm_metal::identity::mint_join_ref_in_txn(
        tx,
        &master.for_site(node.site_id.as_str()),
        purpose,
        &bcm_db::agents::TokenScope::Node(node.id.to_string()),
        expires,
    )
    .await?)
}

/// The boot entry of the node's ramdisk, with a fresh discovery token (a
/// reference) on its kernel command line. A node in `rescue` boots it in
/// rescue mode (`bcm.mode=rescue`: a root shell on the serial console, and
/// SSH for the rescue's key, `bcm.ssh=`).
async fn boot_entry(
    tx: &mut Tx<'_>,
    cfg: &EngineConfig,
    node: &Node,
) -> Result<BootEntrySpec, ParamsError> {
    let token = mint_join_token(tx, cfg, node, "discovery").await?;
    let mut cmdline = format!(
        "console=ttyS0 bcm.node={} bcm.api={} bcm.join={}",
        node.id, cfg.control_plane_url, token
    );
    if node.provision_state == bcm_core::ProvisionState::Rescue {
        cmdline.push_str(" bcm.mode=rescue");
        if let Some(key) = bcm_metal::rescue::access_key_in_txn(tx, &node.id.to_string()).await? {
            cmdline.push(' ');
            cmdline.push_str(&key.cmdline_word());
        }
    }
    Ok(BootEntrySpec {
        macs: node.macs.clone(),
        kernel: "ramdisk/vmlinuz".to_owned(),
        initrd: "ramdisk/initrd.img".to_owned(),
        cmdline,
        expires_in_secs: cfg.join_token_ttl_secs,
    })
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

/// The node's BMC as the step's concern binds it.
async fn bmc(tx: &mut Tx<'_>, node: &Node, kind: &StepKind) -> Result<BmcTarget, DbError> {
    let concern = kind.concern().unwrap_or(Concern::Management);
    bcm_metal::bmc::target_in_txn(tx, node, concern).await
}

fn boot_device(bmc: BmcTarget, device: BootDevice, persistent: bool) -> Command {
    Command::BmcBootDevice(BootDeviceParams {
        bmc,
        device,
        persistent,
        mode: None,
    })
}

/// The command a step sends, or `None` for a step the engine runs itself.
pub async fn command_for(
    tx: &mut Tx<'_>,
    cfg: &EngineConfig,
    node: &Node,
    kind: &StepKind,
) -> Result<Option<Command>, ParamsError> {
    Ok(Some(match kind {
        StepKind::BmcVerify => Command::BmcVerify(BmcParams {
            bmc: bmc(tx, node, kind).await?,
        }),
        StepKind::BmcInspect | StepKind::BmcFirmware { .. } => Command::BmcInspect(BmcParams {
            bmc: bmc(tx, node, kind).await?,
        }),
        StepKind::BmcPowerOff => Command::BmcPower(PowerParams {
            bmc: bmc(tx, node, kind).await?,
            action: PowerAction::Off,
        }),
        StepKind::BmcPower { action } => Command::BmcPower(PowerParams {
            bmc: bmc(tx, node, kind).await?,
            action: *action,
        }),
        StepKind::BmcBootPxe { persistent } => {
            boot_device(bmc(tx, node, kind).await?, BootDevice::Pxe, *persistent)
        }
        StepKind::BmcBootDisk { persistent } => {
            boot_device(bmc(tx, node, kind).await?, BootDevice::Disk, *persistent)
        }
        StepKind::BootEntrySet => Command::BootEntrySet(BootEntrySetParams {
            boot_entry: boot_entry(tx, cfg, node).await?,
        }),
        StepKind::BootEntryClear => Command::BootEntryClear(BootEntryClearParams {
            macs: node.macs.clone(),
        }),
        StepKind::DiagDcgm { level } => Command::DiagDcgm(DcgmParams {
            level: *level,
            accept_unsupported: bcm_db::tenancy::pool_accepts_unsupported_diag_in_txn(
                tx,
                node.pool_id.as_str(),
            )
            .await?,
        }),
        StepKind::DiskWipe { mode } => Command::DiskWipe(wipe_params(tx, node, *mode).await?),
        StepKind::NodeWipe { mode } => Command::NodeWipe(wipe_params(tx, node, *mode).await?),
        StepKind::NodePowerOff => Command::NodePowerOff(NoParams {}),
        StepKind::BmcBootCd { persistent } => {
            boot_device(bmc(tx, node, kind).await?, BootDevice::Cd, *persistent)
        }
        StepKind::BmcErase { mode, .. } => Command::BmcDiskErase(DiskEraseParams {
            bmc: bmc(tx, node, kind).await?,
            mode: *mode,
        }),
        StepKind::MediaInsert => {
            let profile = node
                .deploy_profile
                .as_ref()
                .ok_or_else(|| ParamsError::Invalid("the node carries no deploy profile".into()))?;
            Command::BmcVirtualMedia(VirtualMediaParams {
                bmc: bmc(tx, node, kind).await?,
                action: MediaAction::Insert,
                image: Some(profile.image.url.clone()),
            })
        }
        StepKind::MediaEject => Command::BmcVirtualMedia(VirtualMediaParams {
            bmc: bmc(tx, node, kind).await?,
            action: MediaAction::Eject,
            image: None,
        }),
        StepKind::RotateBmcPassword => {
            let pending = bcm_db::secrets::secret_of_owner_in_txn(
                tx,
                &node.id.to_string(),
                crate::rotation::TEARDOWN_PURPOSE,
            )
            .await?
            .ok_or_else(|| {
                ParamsError::Invalid(
                    "no teardown password is recorded for this dedicated node (the release verb records one)".into(),
                )
            })?;
            Command::BmcRotateCredentials(RotateParams {
                bmc: bmc(tx, node, kind).await?,
                pending_credentials: bcm_metal::bmc::sealed_in_txn(tx, &pending.id).await?,
            })
        }
        StepKind::WaitPowerOff => Command::BmcPowerStatus(BmcParams {
            bmc: bmc(tx, node, kind).await?,
        }),
        StepKind::Inventory => Command::Inventory(NoParams {}),
        StepKind::DeployImage => Command::DeployImage(deploy_image(tx, cfg, node).await?),
        StepKind::StoreMacs
        | StepKind::StoreInventory
        | StepKind::RevokeIdentity
        | StepKind::ForgetBmcCredentials
        | StepKind::WaitRamdiskJoin
        | StepKind::WaitOsJoin { .. }
        | StepKind::WaitOsBack { .. }
        | StepKind::RetiredEnsureRamdisk => return Ok(None),
    }))
}

/// A wipe of `mode`, read back, by the methods the node's pool admits.
async fn wipe_params(tx: &mut Tx<'_>, node: &Node, mode: WipeMode) -> Result<WipeParams, DbError> {
    Ok(WipeParams {
        mode,
        verify: true,
        methods: bcm_db::tenancy::pool_erase_policy_in_txn(tx, node.pool_id.as_str())
            .await?
            .for_mode(mode),
    })
}

/// `deploy.image` from the node's deploy profile snapshot, its user data
/// rendered with a fresh `provisioned` join token.
async fn deploy_image(
    tx: &mut Tx<'_>,
    cfg: &EngineConfig,
    node: &Node,
) -> Result<DeployImageParams, ParamsError> {
    let profile = node
        .deploy_profile
        .clone()
        .ok_or_else(|| ParamsError::Invalid("the node carries no deploy profile".into()))?;
    // The installed OS downloads the latest published bcd (the API hashed
    // it); machines are amd64 until inventory reports an architecture.
    let bcd = if profile.needs_bcd() {
        let (name, os, arch) = bcm_contracts::downloads::INSTALLED_OS_BCD;
        bcm_db::downloads::download_latest_in_txn(tx, name, os, arch)
            .await
            .map_err(ParamsError::Db)?
    } else {
        None
    };
    let bcd_url = bcd.as_ref().map(|d| {
        format!(
            "{}{}",
            cfg.control_plane_url.trim_end_matches('/'),
            bcm_contracts::downloads::path(&d.name, &d.version, &d.os, &d.arch)
        )
    });
    let token = mint_join_token(tx, cfg, node, "provisioned").await?;
    let user_data = profile
        .render_user_data(&UserDataVars {
            node_id: &node.id.to_string(),
            join_token: &token,
            control_plane_url: &cfg.control_plane_url,
            bcd: bcd.as_ref().zip(bcd_url.as_deref()).map(|(d, url)| {
                bcm_core::deploy::BcdDownload {
                    url,
                    sha256: &d.sha256,
                }
            }),
        })
        .map_err(|e| ParamsError::Invalid(format!("deploy profile {}: {e}", profile.id)))?;
    Ok(DeployImageParams {
        cache_path: profile
            .catalog_image
            .as_deref()
            .map(|name| bcm_contracts::commands::catalog_cache_path(node.tenant_id.as_str(), name)),
        profile_id: profile.id,
        profile_version: profile.version,
        image: profile.image,
        user_data: Some(user_data),
        disk: None,
    })
}

/// The verdict on a finished command: its outcome, its output to keep, and
/// whether it proved a verified wipe.
#[derive(Debug)]
pub struct Verdict {
    pub outcome: StepOutcome,
    pub output: Option<serde_json::Value>,
    pub wipe_verified: bool,
}

impl Verdict {
    fn failed(message: String, output: Option<serde_json::Value>) -> Self {
        Verdict {
            outcome: StepOutcome::Failed {
                retryable: false,
                message,
            },
            output,
            wipe_verified: false,
        }
    }

    fn succeeded(output: Option<serde_json::Value>, wipe_verified: bool) -> Self {
        Verdict {
            outcome: StepOutcome::Succeeded,
            output,
            wipe_verified,
        }
    }
}

/// The stored result of a command row: `{ok, retryable, output, error}`.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredResult {
    #[serde(default)]
    pub retryable: bool,
    #[serde(default)]
    pub output: serde_json::Value,
    #[serde(default)]
    pub error: Option<String>,
}

/// A disk of the node's recorded inventory: by name (the agent's) or the
/// BMC's drive id (out of band), and its serial.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedDisk {
    pub name: String,
    pub serial: String,
}

/// The node fact a wipe of `kind` is judged against: the agent's
/// inventory for `disk.wipe`, the BMC's for `bmc.diskErase`.
pub const fn inventory_fact(kind: CommandKind) -> Option<&'static str> {
    match kind {
        CommandKind::DiskWipe | CommandKind::NodeWipe => Some("inventory"),
        CommandKind::BmcDiskErase => Some(OOB_INVENTORY_FACT),
        _ => None,
    }
}

/// The node fact an agentless node's out-of-band inventory is kept in.
pub const OOB_INVENTORY_FACT: &str = "inventory:oob";

/// Judges a command row's result for a step of `step`. The output is read
/// as its kind's contract says; an output that breaks it fails the step
/// for good (it never counts as a success by default). `recorded` are the
/// disks of the node's recorded inventory, which a `disk.wipe` or
/// `bmc.diskErase` result must account for, every one (`None`: no
/// inventory is recorded).
pub fn judge(
    cmd: &bcm_db::commands::CommandRow,
    step: &StepKind,
    recorded: Option<&[RecordedDisk]>,
) -> Verdict {
    let stored: StoredResult = cmd
        .result
        .clone()
        .and_then(|r| serde_json::from_value(r).ok())
        .unwrap_or_default();
    let raw = (!stored.output.is_null()).then(|| stored.output.clone());
    if cmd.status != CommandStatus::Succeeded {
        let message = stored
            .error
            .map(|e| format!("{}: {e}", cmd.kind))
            .unwrap_or_else(|| format!("{} failed", cmd.kind));
        return Verdict {
            outcome: StepOutcome::Failed {
                retryable: stored.retryable,
                message,
            },
            output: raw,
            wipe_verified: false,
        };
    }
    let recorded: Vec<DiskId<'_>> = recorded
        .unwrap_or_default()
        .iter()
        .map(|d| DiskId {
            name: &d.name,
            serial: &d.serial,
        })
        .collect();
    let output = CommandKind::parse(&cmd.kind).and_then(|k| Output::decode(k, &stored.output));
    match output {
        Err(e) => Verdict::failed(
            format!("{}: the result breaks its contract: {e}", cmd.kind),
            raw,
        ),
        Ok(Output::DiskWipe(report) | Output::NodeWipe(report)) => {
            let verified: Vec<bool> = report
                .disks
                .iter()
                .map(|d| d.outcome == WipeOutcome::Verified)
                .collect();
            let reported: Vec<DiskId<'_>> = report
                .disks
                .iter()
                .map(|d| DiskId {
                    name: &d.name,
                    serial: &d.serial,
                })
                .collect();
            let unaccounted = disks_unaccounted(&recorded, &reported);
            // Each disk's method must be one the pool admitted for the
            // mode (the command carries the list it was given).
            if let Ok(Command::DiskWipe(asked) | Command::NodeWipe(asked)) =
                Command::from_parts(&cmd.kind, cmd.params.clone())
            {
                let refused: Vec<String> = if asked.methods.is_empty() {
                    vec![]
                } else {
                    report
                        .disks
                        .iter()
                        .filter(|d| d.outcome == WipeOutcome::Verified)
                        .filter_map(|d| {
                            bcm_core::erase::judge_method(asked.mode, &asked.methods, d.erase)
                                .err()
                                .map(|why| format!("{}: {why}", d.name))
                        })
                        .collect()
                };
                if !refused.is_empty() {
                    return Verdict::failed(
                        format!("UNVERIFIED_WIPE: {}", refused.join("; ")),
                        raw,
                    );
                }
            }
            match wipe_verdict(cmd.attested_by.is_some(), &verified, &unaccounted) {
                Ok(()) => Verdict::succeeded(raw, true),
                Err(why @ UnverifiedWipe::DiskMissing) => Verdict::failed(
                    format!("UNVERIFIED_WIPE: {why}: {}", unaccounted.join(", ")),
                    raw,
                ),
                Err(why) => Verdict::failed(format!("UNVERIFIED_WIPE: {why}"), raw),
            }
        }
        Ok(Output::BmcDiskErase(report)) => {
            let required = matches!(step, StepKind::BmcErase { required: true, .. });
            let drives: Vec<ErasedDrive<'_>> = report
                .drives
                .iter()
                .map(|d| ErasedDrive {
                    id: &d.id,
                    serial: d.serial.as_deref().unwrap_or_default(),
                    erased: d.erased,
                })
                .collect();
            match erase_verdict(report.offered, &recorded, &drives) {
                Ok(()) => Verdict::succeeded(raw, true),
                // Nothing was erased and nothing was sent: the release is
                // judged unattested (the pool's policy decides), a retire
                // cannot go on.
                Err(UnattestedErase::NotOffered) if !required => Verdict::succeeded(raw, false),
                Err(why) => Verdict::failed(format!("UNVERIFIED_WIPE: {why}"), raw),
            }
        }
        Ok(Output::BmcPowerStatus(read)) if *step == StepKind::WaitPowerOff => {
            if read.power == bcm_core::PowerState::Off {
                Verdict::succeeded(raw, false)
            } else {
                Verdict {
                    outcome: StepOutcome::Failed {
                        retryable: true,
                        message: format!(
                            "the machine is still powered {}: the installer has not handed it back (it powers the machine off when it is done)",
                            read.power
                        ),
                    },
                    output: raw,
                    wipe_verified: false,
                }
            }
        }
        Ok(Output::DiagDcgm(report)) => {
            let accepts_unsupported = matches!(
                Command::from_parts(&cmd.kind, cmd.params.clone()),
                Ok(Command::DiagDcgm(DcgmParams {
                    accept_unsupported: true,
                    ..
                }))
            );
            if cmd.attested_by.is_none() {
                Verdict::failed("diag.dcgm: the result is not node-signed".into(), raw)
            } else if report.status == DcgmStatus::Pass
                || (report.status == DcgmStatus::Unsupported && accepts_unsupported)
            {
                Verdict::succeeded(raw, false)
            } else {
                let status = serde_json::to_value(report.status).unwrap_or_default();
                let message = format!("diag.dcgm reported {status}; the pool does not accept it");
                let message = match &report.reason {
                    Some(reason) => format!("{message} ({reason})"),
                    None => message,
                };
                Verdict::failed(message, raw)
            }
        }
        Ok(_) => Verdict::succeeded(raw, false),
    }
}

/// The disks of a node's recorded inventory that a wipe of `kind` must
/// account for: the agent's (`inventory`) for `disk.wipe`, the BMC's
/// drives (`inventory:oob`) for `bmc.diskErase`. `None` when none is
/// recorded or it does not read (logged): the wipe's own report then
/// decides alone.
pub async fn recorded_disks(
    tx: &mut Tx<'_>,
    node_id: &str,
    kind: CommandKind,
) -> Result<Option<Vec<RecordedDisk>>, DbError> {
    let Some(fact_name) = inventory_fact(kind) else {
        return Ok(None);
    };
    let Some(fact) = bcm_db::agents::node_fact_fetch_in_txn(tx, node_id, fact_name).await? else {
        tracing::warn!(
            node = node_id,
            fact = fact_name,
            "no inventory recorded: the wipe is judged on its own report"
        );
        return Ok(None);
    };
    let disks = if matches!(kind, CommandKind::DiskWipe | CommandKind::NodeWipe) {
        serde_json::from_value::<Inventory>(fact).map(|inv| {
            inv.disks
                .into_iter()
                .map(|d| RecordedDisk {
                    name: d.name,
                    serial: d.serial,
                })
                .collect()
        })
    } else {
        serde_json::from_value::<OobInventory>(fact).map(|inv| {
            inv.drives
                .into_iter()
                .map(|d| RecordedDisk {
                    name: d.id,
                    serial: d.serial.unwrap_or_default(),
                })
                .collect()
        })
    };
    match disks {
        Ok(d) => Ok(Some(d)),
        Err(e) => {
            tracing::warn!(node = node_id, error = %e, "the recorded inventory does not read: the wipe is judged on its own report");
            Ok(None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bcm_core::erase::EraseMethod;
    use serde_json::json;

    /// A succeeded, node-signed `disk.wipe` of one disk erased by `used`,
    /// sent with `admitted` for crypto-erase.
    fn wipe(admitted: &[EraseMethod], used: Option<EraseMethod>) -> bcm_db::commands::CommandRow {
        bcm_db::commands::CommandRow {
            id: "cmd_1".into(),
            node_id: Some("node_1".into()),
            site_id: None,
            kind: "disk.wipe".into(),
            target: "ramdisk".into(),
            params: json!({"mode": "crypto-erase", "verify": true, "methods": admitted}),
            status: CommandStatus::Succeeded,
            result: Some(json!({"ok": true, "output": {"disks": [{
                "name": "vda", "serial": "S1", "model": "QEMU", "sizeBytes": 1u64 << 30,
                "transport": "virtio", "method": "crypto-erase", "erase": used,
                "wipedRegions": [{"offset": 0, "len": 1u64 << 30}],
                "verifiedRegions": [{"name": "head", "offset": 0, "len": 1u64 << 30, "ok": true}],
                "outcome": "verified", "millis": 5}]}})),
            signature: None,
            attested_by: Some("serial-1".into()),
            created_at: chrono::Utc::now(),
            completed_at: None,
            actor: None,
            traceparent: None,
            batch_id: None,
        }
    }

    #[test]
    fn a_wipe_by_a_method_the_pool_does_not_admit_is_unverified() {
        let step = StepKind::DiskWipe {
            mode: bcm_core::WipeMode::CryptoErase,
        };
        let strict = [EraseMethod::NvmeCryptoFormat];
        let v = judge(
            &wipe(&strict, Some(EraseMethod::OverwriteVerified)),
            &step,
            None,
        );
        let StepOutcome::Failed { message, .. } = &v.outcome else {
            panic!("{v:?}")
        };
        assert!(
            message.starts_with(
                "UNVERIFIED_WIPE: vda: overwrite-verified does not satisfy crypto-erase"
            ),
            "{message}"
        );
        assert!(!v.wipe_verified);
        let v = judge(&wipe(&strict, None), &step, None);
        assert!(
            matches!(v.outcome, StepOutcome::Failed { .. }),
            "no method reported: {v:?}"
        );
        let admitted = [
            EraseMethod::NvmeCryptoFormat,
            EraseMethod::OverwriteVerified,
        ];
        let v = judge(
            &wipe(&admitted, Some(EraseMethod::OverwriteVerified)),
            &step,
            None,
        );
        assert_eq!(v.outcome, StepOutcome::Succeeded, "{v:?}");
        assert!(v.wipe_verified);
    }
}
