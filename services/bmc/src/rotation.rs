//! Two-phase BMC password rotation (`bmc.rotateCredentials`). The command
//! carries the current credentials and the pending password, both sealed;
//! the control plane recorded the pending one before sending, so a crash at
//! any point loses nothing:
//!
//! 1. Find which password the BMC takes now: the current one (normal case,
//!    tried first so a healthy rotation never sends a failed login that
//!    could lock the account), else the pending one (phase 1 already ran
//!    before a crash: skip to phase 2).
//! 2. Phase 1: write the pending password to the BMC (Redfish
//!    `AccountService`, IPMI Set User Password).
//! 3. Phase 2: log in with it (a few tries: BMCs apply it asynchronously).
//!    Success: the result carries the new credentials sealed for the node,
//!    and the control plane makes them the only ones on record. Failure
//!    while the current one still works: rolled back.
//!
//! Neither password logging in, or a BMC that does not answer, leaves the
//! rotation unresolved (an error result); the record keeps both.

use base64::Engine as _;
use bcm_contracts::commands::{RotateParams, SealedValue};
use bcm_contracts::outputs::{RotationReport, RotationStep};
use bcm_contracts::{CommandEnvelope, Output};
use secrecy::SecretString;
use std::time::Duration;

use crate::driver::Driver;
use crate::error::BmcError;
use crate::service::{open_sealed, open_target, Ctx};

/// Set to any value, the process aborts right after phase 1 (a test hook
/// for the crash-between-phases recovery; logged loudly at start-up).
pub const CRASH_AFTER_PHASE1_ENV: &str = "BCM_TEST_HOOK_BMC_CRASH_AFTER_ROTATE_PHASE1";

/// Tries of the phase-2 login, and the pause between them.
const CONFIRM_TRIES: usize = 5;
const CONFIRM_PAUSE: Duration = Duration::from_millis(500);

/// Whether `driver` logs in: `Ok(false)` when the BMC refuses the
/// credentials, an error when it cannot tell (unreachable, timeout).
async fn logs_in(driver: &Driver) -> Result<bool, BmcError> {
    let out = driver.verify().await;
    driver.close().await;
    match out {
        Ok(_) => Ok(true),
        Err(BmcError::Unauthorized { .. }) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Runs the rotation; the output on success is the committed report with
/// the new credentials sealed for the node.
pub async fn rotate(
    ctx: &Ctx,
    cmd: &CommandEnvelope,
    params: &RotateParams,
) -> Result<Output, BmcError> {
    let (bmc, node, current) = open_target(ctx, cmd)?;
    let new_password = open_sealed(ctx, cmd.kind(), &params.pending_credentials, &node)?.password;
    let username = current.username.clone();
    let open = |password: SecretString| {
        Driver::open(
            bmc.driver,
            &bmc.address,
            username.clone(),
            password,
            &ctx.drivers,
            bmc.tls.as_ref(),
        )
    };

    let with_current = open(current.password.clone())?;
    let recovered = if logs_in(&with_current).await? {
        // Phase 1.
        let written = with_current.set_password(&new_password).await;
        with_current.close().await;
        if let Err(e) = written {
            return Err(if logs_in(&open(current.password.clone())?).await? {
                BmcError::RotationRolledBack(format!("the BMC did not take the new password: {e}"))
            } else {
                e
            });
        }
        tracing::info!(node = %node, command = %cmd.command_id, "rotation phase 1 done: the BMC has the new password");
        if std::env::var_os(CRASH_AFTER_PHASE1_ENV).is_some() {
            tracing::error!("{CRASH_AFTER_PHASE1_ENV} is set: aborting between the phases");
            std::process::abort();
        }
        false
    } else if logs_in(&open(new_password.clone())?).await? {
        tracing::info!(node = %node, command = %cmd.command_id, "the BMC already takes the pending password (phase 1 ran before); finishing");
        true
    } else {
        return Err(BmcError::Unauthorized {
            driver: bmc.driver,
            address: bmc.address.clone(),
            message: "neither the current nor the pending password logs in".into(),
        });
    };

    // Phase 2.
    let mut confirmed = false;
    for attempt in 0..CONFIRM_TRIES {
        if attempt > 0 {
            tokio::time::sleep(CONFIRM_PAUSE).await;
        }
        match logs_in(&open(new_password.clone())?).await {
            Ok(true) => {
                confirmed = true;
                break;
            }
            Ok(false) => {}
            Err(e) if attempt + 1 == CONFIRM_TRIES => return Err(e),
            Err(_) => {}
        }
    }
    if !confirmed {
        return Err(if logs_in(&open(current.password.clone())?).await? {
            BmcError::RotationRolledBack(
                "the BMC accepted the new password but does not log in with it; the current one still works".into(),
            )
        } else {
            BmcError::Unauthorized {
                driver: bmc.driver,
                address: bmc.address.clone(),
                message: "after phase 1 neither the current nor the new password logs in".into(),
            }
        });
    }
    tracing::info!(node = %node, command = %cmd.command_id, recovered, "rotation phase 2 done: the new password logs in");
    let sealed = ctx
        .sealer
        .seal_credentials(
            &bcm_seal::BmcCredentials {
                username: current.username,
                password: new_password,
            },
            &node,
        )
        .map_err(|e| BmcError::Invalid(format!("sealing the new credentials: {e}")))?;
    let b64 = base64::engine::general_purpose::STANDARD;
    Ok(Output::BmcRotateCredentials(RotationReport {
        outcome: RotationStep::Committed,
        recovered,
        sealed_credentials: Some(SealedValue {
            key_id: sealed.key_id,
            nonce: b64.encode(&sealed.nonce),
            ciphertext: b64.encode(&sealed.ciphertext),
            owner: node,
        }),
    }))
}
