//! The wire forms of the contracts: what decodes, what does not, and that
//! every typed value survives a round trip unchanged.

use bcm_contracts::commands::*;
use bcm_contracts::outputs::*;
use bcm_contracts::{CloudEvent, CommandEnvelope, CommandResult, ContractError, Output};
use bcm_core::{BmcDriver, PowerAction, PowerState, WipeMode};
use serde_json::json;

fn envelope(kind: &str, params: serde_json::Value) -> serde_json::Value {
    json!({
        "commandId": "cmd_01jd0000000000000000000000",
        "kind": kind,
        "siteId": "lab",
        "nodeId": "node_01jd0000000000000000000000",
        "params": params,
        "issuedAt": "2026-12-01T00:00:00Z",
    })
}

fn bmc() -> serde_json::Value {
    json!({ "driver": "redfish", "address": "https://10.0.0.1" })
}

#[test]
fn a_command_envelope_is_kind_and_params_side_by_side() {
    let wire = envelope("bmc.power", json!({ "bmc": bmc(), "action": "cycle" }));
    let cmd: CommandEnvelope = serde_json::from_value(wire.clone()).expect("decodes");
    let Command::BmcPower(p) = &cmd.command else {
        panic!("not a power command: {cmd:?}");
    };
    assert_eq!(p.action, PowerAction::Cycle);
    assert_eq!(p.bmc.driver, BmcDriver::Redfish);
    assert_eq!(cmd.kind(), CommandKind::BmcPower);
    assert_eq!(serde_json::to_value(&cmd).expect("encodes"), wire);
}

#[test]
fn an_unknown_kind_or_foreign_params_do_not_decode() {
    let cases = [
        envelope("bmc.powr", json!({ "bmc": bmc(), "action": "on" })),
        envelope("bmc.power", json!({ "bmc": bmc(), "action": "On" })),
        envelope("bmc.power", json!({ "bmc": bmc() })),
        envelope(
            "bmc.power",
            json!({ "bmc": bmc(), "action": "on", "extra": 1 }),
        ),
        envelope("disk.wipe", json!({ "mode": "shred", "verify": true })),
        envelope("inventory", json!({ "anything": true })),
        envelope("inventory", json!(null)),
    ];
    for wire in cases {
        let r = serde_json::from_value::<CommandEnvelope>(wire.clone());
        assert!(r.is_err(), "{wire} decoded as {r:?}");
    }
    let mut extra = envelope("inventory", json!({}));
    extra["priority"] = json!(1);
    assert!(serde_json::from_value::<CommandEnvelope>(extra).is_err());
    assert!(matches!(
        Command::from_parts("bmc.reboot", json!({})),
        Err(ContractError::UnknownKind(_))
    ));
    assert!(matches!(
        Command::from_parts("disk.wipe", json!({ "mode": "quick" })),
        Err(ContractError::Params {
            kind: CommandKind::DiskWipe,
            ..
        })
    ));
}

#[test]
fn every_kind_parses_its_own_name_and_no_other() {
    for k in CommandKind::ALL {
        assert_eq!(CommandKind::parse(k.as_str()), Ok(*k));
        assert_eq!(serde_json::to_value(k).expect("encodes"), json!(k.as_str()));
    }
    assert!(CommandKind::parse("BMC.VERIFY").is_err());
}

#[test]
fn a_result_carries_its_kinds_output() {
    let wire = json!({
        "commandId": "cmd_1", "kind": "bmc.powerStatus", "ok": true, "retryable": false,
        "output": { "power": "on" }
    });
    let r: CommandResult = serde_json::from_value(wire.clone()).expect("decodes");
    assert_eq!(
        r.output.as_ref().and_then(Output::power),
        Some(PowerState::On)
    );
    assert_eq!(serde_json::to_value(&r).expect("encodes"), wire);

    // Another kind's output, an unknown field, or no output for a success.
    for output in [
        json!({ "action": "on", "power": "on" , "x": 1 }),
        json!({ "power": "On" }),
        json!({}),
    ] {
        let wire =
            json!({ "commandId": "c", "kind": "bmc.powerStatus", "ok": true, "output": output });
        assert!(
            serde_json::from_value::<CommandResult>(wire.clone()).is_err(),
            "{wire}"
        );
    }
    // A failure carries nothing, or its kind's report.
    let failed: CommandResult = serde_json::from_value(json!({
        "commandId": "c", "kind": "bmc.power", "ok": false, "retryable": true, "error": "503"
    }))
    .expect("a failure without output");
    assert_eq!(failed.output, None);
    let rolled: CommandResult = serde_json::from_value(json!({
        "commandId": "c", "kind": "bmc.rotateCredentials", "ok": false,
        "output": { "outcome": "rolled-back" }, "error": "refused"
    }))
    .expect("a rolled-back rotation");
    assert!(matches!(
        rolled.output,
        Some(Output::BmcRotateCredentials(RotationReport {
            outcome: RotationStep::RolledBack,
            ..
        }))
    ));
}

#[test]
fn a_wipe_report_needs_every_disk_field_and_a_known_outcome() {
    let disk = json!({
        "name": "vda", "serial": "S1", "model": "QEMU", "sizeBytes": 1024, "transport": "virtio",
        "method": "quick", "wipedRegions": [{"offset": 0, "len": 512}],
        "verifiedRegions": [{"name": "head", "offset": 0, "len": 512, "ok": true}],
        "outcome": "verified", "millis": 3
    });
    let out = Output::decode(CommandKind::DiskWipe, &json!({ "disks": [disk.clone()] }))
        .expect("decodes");
    let Output::DiskWipe(report) = &out else {
        panic!("{out:?}")
    };
    assert_eq!(report.disks[0].method, WipeMode::Quick);
    assert_eq!(report.disks[0].outcome, WipeOutcome::Verified);
    assert_eq!(out.to_json(), json!({ "disks": [disk.clone()] }));
    let mut unknown = disk.clone();
    unknown["outcome"] = json!("probably");
    assert!(Output::decode(CommandKind::DiskWipe, &json!({ "disks": [unknown] })).is_err());
    let mut missing = disk;
    missing.as_object_mut().expect("object").remove("serial");
    assert!(Output::decode(CommandKind::DiskWipe, &json!({ "disks": [missing] })).is_err());
}

#[test]
fn the_envelope_refuses_fields_it_does_not_define() {
    let ev = json!({
        "specversion": "1.0", "id": "1", "source": "/x", "type": "node.enrolled",
        "time": "2026-12-01T00:00:00Z", "datacontenttype": "application/json", "data": {},
        "surprise": true
    });
    assert!(serde_json::from_value::<CloudEvent<serde_json::Value>>(ev).is_err());
}
