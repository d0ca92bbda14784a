//! Rescue an operator can enter: the rescue request's SSH public key is
//! checked (garbage changes nothing), kept while the node is in `rescue`,
//! handed to the rescue ramdisk on its boot entry's command line (with the
//! rescue mode no other boot entry has), and forgotten when the node leaves
//! `rescue`. Real engine, reconciler, Postgres and JetStream; simulated site.

use bcm_core::workflow::WorkflowPhase;
use bcm_core::{NodeId, ProvisionState};
use bcm_testkit::{eventually, Options, TestEnv};
use serde_json::json;
use std::time::Duration;

const T: Duration = Duration::from_secs(60);

// `ssh-keygen -t ed25519` output (a throwaway key).
const KEY: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKc5y4JN2j9/nyG9CpyH6Qn17rYLAS63UHxenvzq4/EY operator@example";
const BLOB: &str = "AAAAC3NzaC1lZDI1NTE5AAAAIKc5y4JN2j9/nyG9CpyH6Qn17rYLAS63UHxenvzq4/EY";

/// Waits until the node's rescue ramdisk is up (its `metal-rescue`
/// workflow succeeded) and returns the command line of the boot entry it
/// was given: the newest of more than `seen`.
async fn rescue_ramdisk_up(env: &TestEnv, id: &NodeId, seen: usize) -> String {
    eventually(T, || async {
        let n = env.node(id).await?;
        let Some(wf) = n.workflow_id else {
            return Ok(None);
        };
        let wf = bcm_db::workflows::workflow_fetch(&env.db, &wf.to_string()).await?;
        if wf.profile_id != "metal-rescue" || wf.status != WorkflowPhase::Succeeded {
            return Ok(None);
        }
        let lines = boot_cmdlines(env, id).await;
        Ok((lines.len() > seen).then(|| lines[lines.len() - 1].clone()))
    })
    .await
    .expect("the rescue ramdisk is up")
}

/// Every boot entry's kernel command line the node was given, oldest first.
async fn boot_cmdlines(env: &TestEnv, id: &NodeId) -> Vec<String> {
    bcm_db::commands::commands_of_node(&env.db, &id.to_string())
        .await
        .expect("commands")
        .into_iter()
        .filter(|c| c.kind == "site.bootEntry.set")
        .filter_map(|c| c.params["bootEntry"]["cmdline"].as_str().map(str::to_owned))
        .collect()
}

async fn access(env: &TestEnv, id: &NodeId) -> Option<serde_json::Value> {
    bcm_db::agents::node_fact_fetch(&env.db, &id.to_string(), "rescue-access")
        .await
        .expect("fact")
}

#[tokio::test]
async fn a_rescue_key_reaches_the_rescue_ramdisk_only_and_ends_with_the_rescue() {
    let env = TestEnv::start_with(Options::with_site())
        .await
        .expect("env");
    let id = env.deployed_sim("rescue-ssh").await;
    let deployed = env.node(&id).await.expect("node");

    // Garbage is refused with its reason and changes nothing.
    let long = "A".repeat(1_601);
    for bad in [
        json!({"sshPublicKey": ""}),
        json!({"sshPublicKey": "ssh-ed25519"}),
        json!({"sshPublicKey": "ssh-dss AAAAB3NzaC1kc3M="}),
        json!({"sshPublicKey": "ssh-ed25519 !!!"}),
        json!({"sshPublicKey": format!("ssh-rsa {BLOB}")}),
        json!({"sshPublicKey": format!("{KEY}\nssh-ed25519 {BLOB}")}),
        json!({"sshPublicKey": "-----BEGIN OPENSSH PRIVATE KEY-----"}),
        json!({"sshPublicKey": long}),
        json!({"sshPublicKey": 42}),
        json!({"sshPublicKeys": KEY}),
    ] {
        let (s, b) = env.verb("rescue", &id, bad.clone()).await;
        assert_eq!(s, 400, "{bad}: {b}");
        assert_eq!(b["code"], "INVALID_ARGUMENT", "{bad}: {b}");
    }
    let n = env.node(&id).await.expect("node");
    assert_eq!(
        (n.provision_state, n.version),
        (ProvisionState::Deployed, deployed.version),
        "a refused rescue changes nothing"
    );
    assert_eq!(access(&env, &id).await, None);

    // No ramdisk before (enroll, inspect, commission, deploy) was a rescue
    // ramdisk.
    let before = boot_cmdlines(&env, &id).await;
    assert!(!before.is_empty());
    assert!(
        before.iter().all(|l| !l.contains("bcm.mode=")),
        "{before:?}"
    );

    // A rescue with a key: kept, and on the rescue ramdisk's command line.
    let seen = before.len();
    env.verb_ok("rescue", &id, json!({ "sshPublicKey": KEY }))
        .await;
    let kept = access(&env, &id)
        .await
        .expect("the rescue's access is kept");
    assert_eq!(kept["sshPublicKey"], format!("ssh-ed25519 {BLOB}"));
    assert_eq!(
        kept["fingerprint"],
        "SHA256:3eNqcQ3ybzEs8wfxpsIBLEeiQSijZoXHkt0D84Msu0M"
    );
    assert!(kept["by"].as_str().is_some_and(|b| !b.is_empty()), "{kept}");
    let line = rescue_ramdisk_up(&env, &id, seen).await;
    assert!(line.contains(" bcm.mode=rescue"), "{line}");
    assert!(
        line.split(' ')
            .any(|w| w == format!("bcm.ssh=ssh-ed25519:{BLOB}")),
        "{line}"
    );
    assert!(!line.contains("operator@example"), "no comment: {line}");

    // Unrescue: back to deployed, the key forgotten.
    env.verb_ok("unrescue", &id, json!({})).await;
    env.wait_state(&id, ProvisionState::Deployed, T)
        .await
        .expect("unrescue → deployed");
    assert_eq!(access(&env, &id).await, None, "unrescue forgets the key");

    // A rescue without a key: rescue mode (the serial console), no SSH.
    let seen = boot_cmdlines(&env, &id).await.len();
    env.verb_ok("rescue", &id, json!({})).await;
    let line = rescue_ramdisk_up(&env, &id, seen).await;
    assert!(line.contains(" bcm.mode=rescue"), "{line}");
    assert!(!line.contains("bcm.ssh="), "{line}");
    let kept = access(&env, &id).await.expect("recorded");
    assert!(kept["sshPublicKey"].is_null(), "{kept}");

    // Released from rescue: forgotten as well.
    let (s, _) = env.verb("undeploy", &id, json!({})).await;
    assert_eq!(s, 200);
    env.wait_state(&id, ProvisionState::Ready, T)
        .await
        .expect("undeploy from rescue → ready");
    assert_eq!(access(&env, &id).await, None, "a release forgets the key");
}

/// The steps of the node's newest `metal-rescue` workflow, by name: its
/// status, error and command.
async fn rescue_steps(
    env: &TestEnv,
    id: &NodeId,
) -> Vec<(
    String,
    bcm_core::workflow::StepStatus,
    Option<String>,
    Option<String>,
)> {
    let wfs = bcm_db::workflows::workflows_of_node(&env.db, &id.to_string())
        .await
        .expect("workflows");
    let wf = wfs
        .iter()
        .filter(|w| w.profile_id == "metal-rescue")
        .max_by_key(|w| w.created_at)
        .expect("a rescue workflow");
    bcm_db::workflows::steps_fetch(&env.db, &wf.id)
        .await
        .expect("steps")
        .into_iter()
        .filter(|s| !s.cleanup)
        .map(|s| (s.name, s.status, s.error, s.command_id))
        .collect()
}

/// Rescue asks the installed OS to power the machine off cleanly before
/// the BMC boots the ramdisk: the OS's agent answers `node.powerOff`
/// (checked against the site's anchor) and the BMC reads off. An OS whose
/// agent takes no command is waited for only up to the step's time-out:
/// the ask and the wait are skipped, its BMC powers it off and the rescue
/// goes on,
/// and the unanswered `node.powerOff` is never handed out afterwards — not
/// even to the same OS once it runs again after unrescue.
#[tokio::test]
async fn rescue_shuts_the_installed_os_down_first_and_does_without_an_os_that_does_not_answer() {
    use bcm_core::workflow::StepStatus::{Skipped, Succeeded};
    let mut opts = Options::with_site();
    opts.step_timeouts.insert(
        "os-power-off".into(),
        std::num::NonZeroU32::MIN.saturating_add(1),
    );
    let env = TestEnv::start_with(opts).await.expect("env");

    // An OS that answers: it powers the machine off, the BMC reads it off.
    let id = env.deployed_sim("rescue-clean").await;
    env.verb_ok("rescue", &id, json!({})).await;
    rescue_ramdisk_up(&env, &id, 0).await;
    let steps = rescue_steps(&env, &id).await;
    let status = |steps: &[(String, _, Option<String>, Option<String>)], name: &str| {
        steps
            .iter()
            .find(|s| s.0 == name)
            .map(|s| (s.1, s.2.clone().unwrap_or_default(), s.3.clone()))
            .unwrap_or_else(|| panic!("no step {name}: {steps:?}"))
    };
    assert_eq!(status(&steps, "os-power-off").0, Succeeded, "{steps:?}");
    assert_eq!(status(&steps, "wait-os-off").0, Succeeded, "{steps:?}");
    // The machine was off already: the BMC's power-off found it so.
    assert_eq!(status(&steps, "bmc-power-off").0, Succeeded, "{steps:?}");
    let cmd = status(&steps, "os-power-off").2.expect("a command");
    let row = bcm_db::commands::command_fetch(&env.db, &cmd)
        .await
        .expect("command");
    assert_eq!(
        (row.kind.as_str(), row.target.as_str()),
        ("node.powerOff", "node")
    );
    assert_eq!(row.status, bcm_core::workflow::CommandStatus::Succeeded);
    assert_eq!(
        row.result
            .as_ref()
            .map(|r| r["output"]["poweringOff"] == true),
        Some(true)
    );
    assert!(row.signature.is_some(), "the OS signs its answer");
    env.verb_ok("unrescue", &id, json!({})).await;
    env.wait_state(&id, ProvisionState::Deployed, T)
        .await
        .expect("unrescue → deployed");

    // An OS that takes no command (booted so): the ask times out after the
    // configured 2 s and is skipped with the wait; the rescue goes on.
    env.faults
        .set("sim://rescue-mute", bcm_sim::Fault::OsTakesNoCommands);
    let id = env.deployed_sim("rescue-mute").await;
    env.verb_ok("rescue", &id, json!({})).await;
    rescue_ramdisk_up(&env, &id, 0).await;
    let steps = rescue_steps(&env, &id).await;
    let (s, why, cmd) = status(&steps, "os-power-off");
    assert_eq!(s, Skipped, "{steps:?}");
    assert!(why.contains("os-power-off timed out after 2 s"), "{why}");
    let (s, why, _) = status(&steps, "wait-os-off");
    assert_eq!((s, why.as_str()), (Skipped, "skipped with os-power-off"));
    // Its BMC shut it down instead, before the one-time PXE boot.
    for name in [
        "bmc-power-off",
        "pxe-once",
        "power-cycle",
        "wait-ramdisk-join",
    ] {
        assert_eq!(status(&steps, name).0, Succeeded, "{name}: {steps:?}");
    }
    let n = env.node(&id).await.expect("node");
    assert_eq!(n.last_error, None, "a skipped step is no error: {n:?}");

    // Unrescued, the OS runs again and takes commands. Rescued once more,
    // it polls while that rescue runs: it is handed the new ask and
    // answers it, never the old one its step skipped.
    env.faults
        .clear("sim://rescue-mute", bcm_sim::Fault::OsTakesNoCommands);
    env.verb_ok("unrescue", &id, json!({})).await;
    env.wait_state(&id, ProvisionState::Deployed, T)
        .await
        .expect("unrescue → deployed");
    let stale = cmd.expect("a command");
    env.verb_ok("rescue", &id, json!({})).await;
    eventually(T, || async {
        let steps = rescue_steps(&env, &id).await;
        let (s, _, c) = status(&steps, "os-power-off");
        Ok((c.as_deref() != Some(stale.as_str()) && s == Succeeded).then_some(()))
    })
    .await
    .expect("the new rescue's ask is answered");
    let row = bcm_db::commands::command_fetch(&env.db, &stale)
        .await
        .expect("command");
    assert_eq!(
        row.status,
        bcm_core::workflow::CommandStatus::Pending,
        "the skipped ask is never offered, even to an OS that polls"
    );
}
