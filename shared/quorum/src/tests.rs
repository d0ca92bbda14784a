//! The edge's check under every way a command's authority can be wrong.

use super::*;

struct Setup {
    keys: Vec<SigningKey>,
    auto: SigningKey,
    anchor: Anchor,
}

fn setup(quorum: usize) -> Setup {
    let mut rng = rand::rngs::OsRng;
    let keys: Vec<SigningKey> = (0..3).map(|_| SigningKey::generate(&mut rng)).collect();
    let auto = SigningKey::generate(&mut rng);
    let anchor = Anchor {
        approvers: keys
            .iter()
            .enumerate()
            .map(|(i, k)| AnchorKey {
                id: format!("approver-{i}"),
                public_key: public_key_b64(k),
                tenants: vec![],
            })
            .collect(),
        quorum,
        auto_approver: Some(AnchorKey {
            id: "policy".into(),
            public_key: public_key_b64(&auto),
            tenants: vec![],
        }),
    };
    Setup { keys, auto, anchor }
}

const NOW: i64 = 1_800_000_000;

fn batch(nodes: &[&str], op: Operation, wipe: Option<WipeMode>) -> (BatchHeader, Built) {
    let ids: Vec<String> = nodes.iter().map(|s| s.to_string()).collect();
    let built = build(&ids, op, wipe).expect("nodes");
    (
        BatchHeader {
            batch_id: "bat_01jd00000000000000000000aa".into(),
            tenant_id: "acme".into(),
            pool_id: "gpu".into(),
            operation: op,
            wipe,
            reason_sha256: reason_sha256("rack 7 goes back"),
            expires_at: NOW + 3600,
            root: built.root.clone(),
            leaf_count: ids.len() as u32,
        },
        built,
    )
}

fn authority(
    h: &BatchHeader,
    built: &Built,
    index: usize,
    signers: &[(&str, &SigningKey)],
) -> BatchAuthority {
    BatchAuthority {
        header: h.clone(),
        leaf_index: index as u32,
        proof: built.proofs[index].clone(),
        approvals: signers
            .iter()
            .map(|(id, k)| ApprovalSignature {
                approver_id: (*id).to_owned(),
                signature: sign(k, h),
            })
            .collect(),
    }
}

const NODES: [&str; 5] = ["node_a", "node_b", "node_c", "node_d", "node_e"];

#[test]
fn a_quorum_of_known_approvers_allows_a_covered_command_on_an_included_node() {
    let s = setup(2);
    let (h, b) = batch(&NODES, Operation::Undeploy, Some(WipeMode::Quick));
    let a = authority(
        &h,
        &b,
        2,
        &[("approver-0", &s.keys[0]), ("approver-2", &s.keys[2])],
    );
    s.anchor
        .check(
            Some(&a),
            Some("node_c"),
            "disk.wipe",
            Some(WipeMode::Quick),
            None,
            NOW,
        )
        .expect("allowed");
    s.anchor
        .check(Some(&a), Some("node_c"), "bmc.power", None, None, NOW)
        .expect("the chain powers the node");
}

#[test]
fn too_few_duplicate_unknown_or_forged_signatures_are_refused() {
    let s = setup(2);
    let (h, b) = batch(&NODES, Operation::Undeploy, Some(WipeMode::Quick));
    let check = |a: &BatchAuthority| {
        s.anchor.check(
            Some(a),
            Some("node_a"),
            "disk.wipe",
            Some(WipeMode::Quick),
            None,
            NOW,
        )
    };
    let one = authority(&h, &b, 0, &[("approver-0", &s.keys[0])]);
    assert_eq!(
        check(&one),
        Err(QuorumError::TooFew {
            valid: 1,
            needed: 2
        })
    );
    // The same approver twice is one approver.
    let twice = authority(
        &h,
        &b,
        0,
        &[("approver-0", &s.keys[0]), ("approver-0", &s.keys[0])],
    );
    assert_eq!(
        check(&twice),
        Err(QuorumError::TooFew {
            valid: 1,
            needed: 2
        })
    );
    // A key the anchor does not name counts for nothing, whatever id it uses.
    let stranger = SigningKey::generate(&mut rand::rngs::OsRng);
    let forged = authority(
        &h,
        &b,
        0,
        &[("approver-0", &s.keys[0]), ("approver-1", &stranger)],
    );
    assert_eq!(
        check(&forged),
        Err(QuorumError::TooFew {
            valid: 1,
            needed: 2
        })
    );
    let unknown = authority(
        &h,
        &b,
        0,
        &[("approver-0", &s.keys[0]), ("mallory", &stranger)],
    );
    assert!(check(&unknown).is_err());
    // The policy key approves one-leaf batches only.
    let auto = authority(&h, &b, 0, &[("policy", &s.auto)]);
    assert_eq!(
        check(&auto),
        Err(QuorumError::TooFew {
            valid: 0,
            needed: 2
        })
    );
    let (h1, b1) = batch(&["node_a"], Operation::Undeploy, Some(WipeMode::Quick));
    let auto1 = authority(&h1, &b1, 0, &[("policy", &s.auto)]);
    assert_eq!(check(&auto1), Ok(()));
    // An edge without a policy key takes no auto-approval at all.
    let strict = Anchor {
        auto_approver: None,
        ..s.anchor.clone()
    };
    assert!(strict
        .check(
            Some(&auto1),
            Some("node_a"),
            "disk.wipe",
            Some(WipeMode::Quick),
            None,
            NOW
        )
        .is_err());
}

#[test]
fn a_tampered_node_set_header_or_proof_is_refused() {
    let s = setup(2);
    let signers = [("approver-0", &s.keys[0]), ("approver-1", &s.keys[1])];
    let (h, b) = batch(&NODES, Operation::Undeploy, Some(WipeMode::Quick));
    let good = authority(&h, &b, 1, &signers);
    let check = |a: &BatchAuthority, node: &str| {
        s.anchor.check(
            Some(a),
            Some(node),
            "disk.wipe",
            Some(WipeMode::Quick),
            None,
            NOW,
        )
    };
    assert_eq!(check(&good, "node_b"), Ok(()));
    // Another node under node_b's proof.
    assert!(matches!(
        check(&good, "node_x"),
        Err(QuorumError::NotIncluded { .. })
    ));
    // A node set with one more node: a new root the approvers never signed.
    let (h2, b2) = batch(
        &["node_a", "node_b", "node_c", "node_d", "node_e", "node_x"],
        Operation::Undeploy,
        Some(WipeMode::Quick),
    );
    let mut swapped = authority(&h2, &b2, 5, &[]);
    swapped.approvals = good.approvals.clone();
    assert_eq!(
        check(&swapped, "node_x"),
        Err(QuorumError::TooFew {
            valid: 0,
            needed: 2
        })
    );
    // A header changed after signing (a later expiry, another wipe).
    let mut later = good.clone();
    later.header.expires_at += 86_400;
    assert!(check(&later, "node_b").is_err());
    // A missing proof.
    let mut bare = good.clone();
    bare.proof.clear();
    assert!(matches!(
        check(&bare, "node_b"),
        Err(QuorumError::NotIncluded { .. })
    ));
    let mut garbage = good.clone();
    garbage.proof[0] = "zz".into();
    assert!(matches!(
        check(&garbage, "node_b"),
        Err(QuorumError::BadProof(_))
    ));
    // No authority at all, no node.
    assert_eq!(
        s.anchor
            .check(None, Some("node_b"), "disk.wipe", None, None, NOW),
        Err(QuorumError::Missing)
    );
    assert_eq!(
        s.anchor
            .check(Some(&good), None, "disk.wipe", None, None, NOW),
        Err(QuorumError::NoNode)
    );
}

#[test]
fn an_expired_batch_or_an_uncovered_kind_is_refused() {
    let s = setup(1);
    let (h, b) = batch(&NODES, Operation::Inspect, None);
    let a = authority(&h, &b, 0, &[("approver-0", &s.keys[0])]);
    assert!(matches!(
        s.anchor.check(
            Some(&a),
            Some("node_a"),
            "bmc.power",
            None,
            None,
            h.expires_at
        ),
        Err(QuorumError::Expired { .. })
    ));
    assert!(matches!(
        s.anchor
            .check(Some(&a), Some("node_a"), "deploy.image", None, None, NOW),
        Err(QuorumError::NotCovered(_))
    ));
    let (h, b) = batch(&NODES, Operation::Undeploy, Some(WipeMode::Quick));
    let a = authority(&h, &b, 0, &[("approver-0", &s.keys[0])]);
    assert!(matches!(
        s.anchor.check(
            Some(&a),
            Some("node_a"),
            "disk.wipe",
            Some(WipeMode::None),
            None,
            NOW
        ),
        Err(QuorumError::NotCovered(_))
    ));
}

#[test]
fn approvals_arriving_at_the_control_plane_are_checked_one_by_one() {
    let s = setup(2);
    let (h, _) = batch(&NODES, Operation::Retire, None);
    let key0 = public_key_b64(&s.keys[0]);
    let sig = |k: &SigningKey| ApprovalSignature {
        approver_id: "approver-0".into(),
        signature: sign(k, &h),
    };
    assert_eq!(
        verify_approval(&h, &key0, &sig(&s.keys[0]), &[], NOW),
        Ok(())
    );
    assert_eq!(
        verify_approval(&h, &key0, &sig(&s.keys[0]), &["approver-0".into()], NOW),
        Err(QuorumError::Duplicate("approver-0".into()))
    );
    assert_eq!(
        verify_approval(&h, &key0, &sig(&s.keys[1]), &[], NOW),
        Err(QuorumError::BadSignature("approver-0".into()))
    );
    assert!(matches!(
        verify_approval(&h, &key0, &sig(&s.keys[0]), &[], h.expires_at + 1),
        Err(QuorumError::Expired { .. })
    ));
    // Signed over another digest (another reason).
    let mut other = h.clone();
    other.reason_sha256 = reason_sha256("something else");
    let wrong = ApprovalSignature {
        approver_id: "approver-0".into(),
        signature: sign(&s.keys[0], &other),
    };
    assert_eq!(
        verify_approval(&h, &key0, &wrong, &[], NOW),
        Err(QuorumError::BadSignature("approver-0".into()))
    );
    let garbage = ApprovalSignature {
        approver_id: "approver-0".into(),
        signature: "%%%".into(),
    };
    assert!(verify_approval(&h, &key0, &garbage, &[], NOW).is_err());
    assert!(verify_approval(&h, "not a key", &sig(&s.keys[0]), &[], NOW).is_err());
}

#[test]
fn anchors_and_keys_read_from_text_refuse_garbage() {
    let s = setup(2);
    let text = serde_json::to_string(&s.anchor).expect("json");
    assert_eq!(Anchor::from_json(&text), Ok(s.anchor.clone()));
    assert!(Anchor::from_json("{").is_err());
    assert!(Anchor::from_json(r#"{"approvers":[],"quorum":0}"#).is_err());
    assert!(
        Anchor::from_json(r#"{"approvers":[{"id":"a","publicKey":"AAAA"}],"quorum":1}"#).is_err()
    );
    let seed = hex::encode(s.keys[0].to_bytes());
    assert_eq!(
        signing_key(&seed).map(|k| public_key_b64(&k)),
        Ok(public_key_b64(&s.keys[0]))
    );
    assert!(signing_key("nope").is_err());
}

#[test]
fn an_approved_power_action_runs_that_action_only() {
    use bcm_contracts::commands::{BmcTarget, PowerParams};
    use bcm_contracts::{Command, CommandKind};
    use bcm_core::PowerAction;
    let s = setup(2);
    let (h, b) = batch(&["node_a"], Operation::for_power(PowerAction::On), None);
    let a = authority(
        &h,
        &b,
        0,
        &[("approver-0", &s.keys[0]), ("approver-1", &s.keys[1])],
    );
    let power = |action| {
        Command::BmcPower(PowerParams {
            bmc: BmcTarget {
                driver: bcm_core::BmcDriver::Redfish,
                address: "https://10.0.0.1".into(),
                tls: None,
                sealed_credentials: None,
            },
            action,
        })
    };
    let check = |action| {
        check_command(
            Some(&s.anchor),
            CommandKind::BmcPower,
            Some(&power(action)),
            Some("node_a"),
            Some(&a),
            NOW,
        )
    };
    assert_eq!(check(PowerAction::On), Ok(()));
    for other in [PowerAction::Off, PowerAction::Cycle, PowerAction::Reset] {
        assert!(
            matches!(check(other), Err(QuorumError::NotCovered(ref why)) if why.contains("power on")),
            "an approved power-on ran {other}"
        );
    }
    // The leaf itself names the action: the same signatures over a
    // power-on batch do not prove a power-off leaf.
    let mut forged = a.clone();
    forged.header.operation = Operation::for_power(PowerAction::Off);
    assert!(check_command(
        Some(&s.anchor),
        CommandKind::BmcPower,
        Some(&power(PowerAction::Off)),
        Some("node_a"),
        Some(&forged),
        NOW,
    )
    .is_err());
}

#[test]
fn an_approver_of_another_tenant_does_not_count() {
    let mut s = setup(2);
    let (h, b) = batch(&NODES, Operation::Retire, None);
    let a = authority(
        &h,
        &b,
        0,
        &[("approver-0", &s.keys[0]), ("approver-1", &s.keys[1])],
    );
    let check =
        |anchor: &Anchor| anchor.check(Some(&a), Some("node_a"), "disk.wipe", None, None, NOW);
    assert_eq!(check(&s.anchor), Ok(()));
    // approver-1 approves for tenant `globex` only; the batch is acme's.
    s.anchor.approvers[1].tenants = vec!["globex".into()];
    assert_eq!(
        check(&s.anchor),
        Err(QuorumError::TooFew {
            valid: 1,
            needed: 2
        })
    );
    s.anchor.approvers[1].tenants.push("acme".into());
    assert_eq!(check(&s.anchor), Ok(()));
    // The anchor's file says so, and one without tenants still reads.
    let text = serde_json::to_string(&s.anchor).expect("json");
    assert!(text.contains(r#""tenants":["globex","acme"]"#), "{text}");
    assert_eq!(Anchor::from_json(&text).expect("reads"), s.anchor);
    s.anchor.approvers[1].tenants.clear();
    let text = serde_json::to_string(&s.anchor).expect("json");
    assert!(!text.contains("tenants"), "{text}");
}
