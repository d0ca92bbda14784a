//! The driver plugin protocol at its edges: a driver the site hosts no
//! plugin for answers `unsupported-driver`; a plugin that exits non-zero,
//! answers garbage or outlives its time-out is a failed operation that
//! names the plugin (never a hang, never a crash); a plugin still open for
//! writing for a moment (being installed) runs once it is closed;
//! `bcx-ipmi` answers a request it cannot read with `invalid` and exits 0.

use bcm_bmc::driver::{Driver, DriverSettings};
use bcm_bmc::error::BmcError;
use bcm_bmc::plugin::PluginSettings;
use bcm_contracts::plugin::{PluginErrorKind, PluginResponse};
use bcm_core::BmcDriver;
use std::io::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::PathBuf;
use std::time::Duration;

fn script(dir: &std::path::Path, name: &str, body: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, format!("#!/bin/sh\ncat >/dev/null\n{body}\n")).expect("write");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    p
}

fn open(settings: &DriverSettings) -> Result<Driver, BmcError> {
    Driver::open(
        BmcDriver::Ipmi,
        "ipmi://127.0.0.1:1",
        "admin".to_owned().into(),
        "pw-never-shown".to_owned().into(),
        settings,
        None,
    )
}

fn with_plugin(exe: PathBuf, timeout: Duration) -> DriverSettings {
    let mut s = DriverSettings::default();
    s.plugins.insert(
        BmcDriver::Ipmi,
        PluginSettings {
            executable: exe,
            timeout,
            env: vec![],
        },
    );
    s
}

#[tokio::test]
async fn a_driver_without_a_plugin_is_unsupported_driver() {
    let e = open(&DriverSettings::default()).expect_err("no plugin");
    assert!(e.to_string().contains("unsupported-driver: ipmi"), "{e}");
}

#[tokio::test]
async fn a_misbehaving_plugin_fails_the_operation_and_names_itself() {
    let dir = std::env::temp_dir().join(format!("bcm-plugins-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let cases = [
        (
            script(&dir, "exits", "echo 'boom' >&2; exit 3"),
            "exited with",
        ),
        (
            script(&dir, "garbage", "echo 'not json'"),
            "answered what the protocol does not allow",
        ),
        (
            script(
                &dir,
                "wrong-op",
                r#"echo '{"ok":{"op":"verify","output":{"systemId":"x","power":"on"}}}'"#,
            ),
            "answered an operation it was not asked",
        ),
        (
            script(&dir, "silent", ""),
            "answered what the protocol does not allow",
        ),
    ];
    for (exe, says) in cases {
        let d = open(&with_plugin(exe.clone(), Duration::from_secs(10))).expect("driver");
        let e = d.power_state().await.expect_err("fails");
        let text = e.to_string();
        assert!(
            text.contains(says) && text.contains(&exe.display().to_string()),
            "{text}"
        );
        assert!(!text.contains("pw-never-shown"), "{text}");
    }
    let slow = script(&dir, "slow", "sleep 30");
    let d = open(&with_plugin(slow, Duration::from_millis(500))).expect("driver");
    let started = std::time::Instant::now();
    let e = d.power_state().await.expect_err("times out");
    assert!(matches!(e, BmcError::Timeout { .. }), "{e:?}");
    assert!(e.retryable());
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "stopped, not waited out"
    );
    // A plugin's typed error keeps its kind.
    let refused = script(
        &dir,
        "refused",
        r#"echo '{"error":{"kind":"unauthorized","message":"RAKP 2 HMAC is invalid"}}'"#,
    );
    let d = open(&with_plugin(refused, Duration::from_secs(10))).expect("driver");
    let e = d.verify().await.expect_err("unauthorized");
    assert!(matches!(e, BmcError::Unauthorized { .. }), "{e:?}");
    assert!(!e.retryable());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bcx_ipmi_answers_garbage_with_invalid() {
    for input in [&b"not json"[..], b"{}", br#"{"protocol":99,"bmc":{"address":"x","username":"u","password":"p"},"operation":{"op":"verify"}}"#, &[0xff, 0xfe, 0x00]] {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_bcx-ipmi"))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(input)
            .expect("write");
        let out = child.wait_with_output().expect("wait");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let answer: PluginResponse = serde_json::from_slice(&out.stdout).expect("an answer");
        match answer {
            PluginResponse::Error(e) => assert_eq!(e.kind, PluginErrorKind::Invalid, "{e:?}"),
            other => panic!("{other:?}"),
        }
    }
}

/// A driver no build of ours knows: a shell script that keeps the power
/// state in a file, hosted as `plugins.acme`, drives `plugin:acme` nodes
/// through the same protocol as IPMI. A plugin driver the site does not
/// host answers `unsupported-driver` naming the key to set.
#[tokio::test]
async fn a_new_driver_is_added_as_a_plugin_without_a_rebuild() {
    let dir = std::env::temp_dir().join(format!("bcm-plugin-acme-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let state = dir.join("power");
    std::fs::write(&state, "off").expect("state");
    let exe = dir.join("bcx-acme");
    std::fs::write(
        &exe,
        format!(
            r#"#!/bin/sh
req=$(cat)
case "$req" in
  *'"op":"powerState"'*) echo "{{\"ok\":{{\"op\":\"powerState\",\"output\":\"$(cat {state})\"}}}}" ;;
  *'"action":"on"'*) echo on > {state}; echo '{{"ok":{{"op":"power","output":"on"}}}}' ;;
  *) echo '{{"error":{{"kind":"unsupported","message":"acme does only power"}}}}' ;;
esac
"#,
            state = state.display()
        ),
    )
    .expect("write");
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).expect("chmod");

    let acme = BmcDriver::parse("plugin:acme").expect("a plugin driver's name");
    assert_eq!(acme.plugin_name(), Some("acme"));
    assert_eq!(BmcDriver::hosted_as("acme"), Ok(acme));
    let mut settings = DriverSettings::default();
    settings.plugins.insert(
        acme,
        PluginSettings {
            executable: exe,
            timeout: Duration::from_secs(10),
            env: vec![],
        },
    );
    let open_as = |driver: BmcDriver| {
        Driver::open(
            driver,
            "acme-bmc-7",
            "admin".to_owned().into(),
            "pw-never-shown".to_owned().into(),
            &settings,
            None,
        )
    };
    let d = open_as(acme).expect("hosted");
    assert_eq!(
        d.power_state().await.expect("read"),
        bcm_core::PowerState::Off
    );
    assert_eq!(
        d.power(bcm_core::PowerAction::On).await.expect("on"),
        bcm_core::PowerState::On
    );
    assert_eq!(
        d.power_state().await.expect("read"),
        bcm_core::PowerState::On
    );
    let e = d.verify().await.expect_err("acme does only power");
    assert!(matches!(e, BmcError::Unsupported(_)), "{e:?}");

    let other = BmcDriver::parse("plugin:other-vendor").expect("name");
    let e = open_as(other).expect_err("not hosted");
    assert!(
        e.to_string()
            .contains("unsupported-driver: plugin:other-vendor")
            && e.to_string().contains("plugins.other-vendor"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A plugin executable still open for writing cannot be run (ETXTBSY):
/// one being installed, or, in a test process, one whose writer's
/// descriptor a thread's fork holds for a moment (the flake this came
/// from). The operation waits for the writer to close, briefly, instead
/// of failing.
#[tokio::test]
async fn a_plugin_still_being_written_runs_once_its_writer_closes() {
    let dir = std::env::temp_dir().join(format!("bcm-plugin-busy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let exe = dir.join("bcx-busy");
    let mut writer = std::fs::File::create(&exe).expect("create");
    writer
        .write_all(b"#!/bin/sh\ncat >/dev/null\necho '{\"ok\":{\"op\":\"powerState\",\"output\":\"on\"}}'\n")
        .expect("write");
    writer.flush().expect("flush");
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    // Open for writing: running it now is refused by the kernel.
    let refused = std::process::Command::new(&exe)
        .stdin(std::process::Stdio::null())
        .output()
        .expect_err("busy while open for writing");
    assert_eq!(refused.kind(), std::io::ErrorKind::ExecutableFileBusy);
    let d = open(&with_plugin(exe.clone(), Duration::from_secs(10))).expect("driver");
    let closing = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(writer);
    });
    assert_eq!(
        d.power_state().await.expect("runs once closed"),
        bcm_core::PowerState::On
    );
    closing.await.expect("closed");
    let _ = std::fs::remove_dir_all(&dir);
}
