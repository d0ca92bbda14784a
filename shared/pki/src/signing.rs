//! The canonical signing input of a node-signed result. The agent signs it;
//! the attestation service rebuilds it from the STORED command row (id,
//! node, kind, params, issue time) and the stored result, so a signature
//! made for another command, another node or other parameters never
//! verifies.

use base64::Engine as _;
use bcm_contracts::agent::{AgentCommand, AgentResult};
use chrono::{DateTime, SecondsFormat, Utc};
use ed25519_dalek::{Signer as _, SigningKey};
use serde_json::Value;

/// Everything a node signs about one command's result.
#[derive(Debug, Clone, Copy)]
pub struct SignedFacts<'a> {
    pub command_id: &'a str,
    pub node_id: &'a str,
    pub kind: &'a str,
    pub params: &'a Value,
    /// When the control plane issued the command (the row's `created_at`).
    pub issued_at: DateTime<Utc>,
    pub ok: bool,
    pub output: &'a Value,
    pub error: Option<&'a str>,
    /// When the agent finished the command.
    pub finished_at: DateTime<Utc>,
}

/// A timestamp as it is signed: RFC 3339, UTC, microseconds (Postgres's
/// precision, so a stored time rebuilds to the same text).
pub fn format_ts(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// JSON with object keys sorted at every level and no whitespace: the same
/// bytes whatever order a value's keys were stored or parsed in.
pub fn canonical_json(v: &Value) -> String {
    let mut out = String::new();
    write_canonical(v, &mut out);
    out
}

fn write_canonical(v: &Value, out: &mut String) {
    match v {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String((*k).clone()).to_string());
                out.push(':');
                if let Some(x) = map.get(*k) {
                    write_canonical(x, out);
                }
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, x) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(x, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// The bytes a node signs: a domain tag, then canonical JSON of the facts.
pub fn signing_input(f: &SignedFacts<'_>) -> Vec<u8> {
    let v = serde_json::json!({
        "commandId": f.command_id,
        "nodeId": f.node_id,
        "kind": f.kind,
        "params": f.params,
        "issuedAt": format_ts(f.issued_at),
        "result": {
            "ok": f.ok,
            "output": f.output,
            "error": f.error,
            "finishedAt": format_ts(f.finished_at),
        },
    });
    let mut input = b"bcm-node-result-v1\n".to_vec();
    input.extend_from_slice(canonical_json(&v).as_bytes());
    input
}

/// The result of `cmd` as an agent posts it, signed with its key over
/// [`signing_input`]: how `bcd` answers, and the simulated site's agents
/// as bcd does.
pub fn signed_result(
    key: &SigningKey,
    node: &str,
    cmd: &AgentCommand,
    ok: bool,
    output: Value,
    error: Option<String>,
) -> AgentResult {
    let finished_at = Utc::now();
    let input = signing_input(&SignedFacts {
        command_id: &cmd.command_id,
        node_id: node,
        kind: cmd.kind.as_str(),
        params: &cmd.params,
        issued_at: cmd.issued_at,
        ok,
        output: &output,
        error: error.as_deref(),
        finished_at,
    });
    AgentResult {
        command_id: cmd.command_id.clone(),
        ok,
        retryable: false,
        output,
        error,
        finished_at,
        signature: Some(
            base64::engine::general_purpose::STANDARD.encode(key.sign(&input).to_bytes()),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn key_order_does_not_change_the_input() {
        let a: Value =
            serde_json::from_str(r#"{"b":1,"a":{"y":[1,{"q":2,"p":1}],"x":"s"}}"#).expect("json");
        let b: Value =
            serde_json::from_str(r#"{"a":{"x":"s","y":[1,{"p":1,"q":2}]},"b":1}"#).expect("json");
        assert_eq!(canonical_json(&a), canonical_json(&b));
        assert_eq!(
            canonical_json(&a),
            r#"{"a":{"x":"s","y":[1,{"p":1,"q":2}]},"b":1}"#
        );
    }

    #[test]
    fn every_fact_is_bound() {
        let t = Utc::now();
        let params = json!({"mode": "quick"});
        let out = json!({"disks": []});
        let base = SignedFacts {
            command_id: "cmd_1",
            node_id: "node_1",
            kind: "disk.wipe",
            params: &params,
            issued_at: t,
            ok: true,
            output: &out,
            error: None,
            finished_at: t,
        };
        let other_params = json!({"mode": "secure-erase"});
        let later = t + chrono::Duration::seconds(1);
        let variants = [
            SignedFacts {
                command_id: "cmd_2",
                ..base
            },
            SignedFacts {
                node_id: "node_2",
                ..base
            },
            SignedFacts {
                kind: "inventory",
                ..base
            },
            SignedFacts {
                params: &other_params,
                ..base
            },
            SignedFacts {
                issued_at: later,
                ..base
            },
            SignedFacts { ok: false, ..base },
            SignedFacts {
                error: Some("x"),
                ..base
            },
            SignedFacts {
                finished_at: later,
                ..base
            },
        ];
        for v in variants {
            assert_ne!(signing_input(&base), signing_input(&v), "{v:?}");
        }
    }

    #[test]
    fn floats_survive_a_trip_through_text() {
        // Stored results come back from Postgres as text and are parsed
        // again; without serde_json's float_roundtrip some floats parse to
        // a neighbour and the rebuilt input no longer matches (seen).
        for x in [
            1.203_208_91_f64,
            0.1 + 0.2,
            1e-7,
            123_456.789_012_345_6,
            f64::MAX,
        ] {
            let v = serde_json::json!({ "x": x });
            let back: Value = serde_json::from_str(&v.to_string()).expect("parse");
            assert_eq!(canonical_json(&v), canonical_json(&back), "{x}");
        }
    }

    #[test]
    fn timestamps_keep_microseconds_only() {
        let t: DateTime<Utc> = "2026-11-30T10:00:00.123456789Z".parse().expect("ts");
        assert_eq!(format_ts(t), "2026-11-30T10:00:00.123456Z");
    }
}
