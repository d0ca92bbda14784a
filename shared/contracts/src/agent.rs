//! What the agents (`bcd ramdisk`, `bcd node`, the simulated site's agents)
//! and the API's agent endpoints exchange over HTTP: join, heartbeat, the
//! commands a long-poll hands out and the signed results posted back.

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::commands::{Command, CommandKind};
use crate::ContractError;

/// How long an agent waits before its `attempt`-th retry of a join, poll or
/// result post that got no answer or a 5xx: a ceiling of 250 ms doubling to
/// 8 s — far inside the engine's agent-silence limit (60 s by default), so
/// an agent that lost the control plane is heard again within seconds of
/// its return instead of sleeping through the limit — of which the wait is
/// a random point of the upper half (`draw` in 0..=1, "equal jitter"):
/// agents turned away together (a pool wait that ran out for all of them
/// at once) come back spread out, not as the same wave again. Every agent
/// (`bcd`, the simulated site's) retries by this one policy; a 4xx other
/// than 401 is final (retrying cannot change it), a 401 ends the session.
pub fn retry_backoff(attempt: u32, draw: f64) -> std::time::Duration {
    let ceiling = 250u64 << attempt.min(5);
    let draw = if draw.is_finite() {
        draw.clamp(0.0, 1.0)
    } else {
        1.0
    };
    std::time::Duration::from_millis(ceiling / 2 + (draw * (ceiling / 2) as f64) as u64)
}

/// The longest an agent honours a `Retry-After`: the ceiling of
/// [`retry_backoff`], so a server that asks for longer (or a garbled
/// header) cannot make an agent sleep through its silence limit.
pub const RETRY_AFTER_CAP: std::time::Duration = std::time::Duration::from_secs(8);

/// How long an agent waits before its `attempt`-th retry when the answer
/// carried `retry_after` (the `Retry-After` header's value, if any; the API
/// sends one with every `503` and `429`): [`retry_backoff`], but never less
/// than what the server asked for, and that floor at most
/// [`RETRY_AFTER_CAP`]. Only delta-seconds are read; an HTTP date or
/// garbage is ignored (the backoff alone applies).
pub fn retry_wait(attempt: u32, draw: f64, retry_after: Option<&str>) -> std::time::Duration {
    let backoff = retry_backoff(attempt, draw);
    let asked = retry_after
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|secs| std::time::Duration::from_secs(secs).min(RETRY_AFTER_CAP));
    asked.map_or(backoff, |floor| backoff.max(floor))
}

/// How an agent treats the answer to one of its requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// 2xx: done.
    Done,
    /// 401: the session is over.
    SessionEnded,
    /// Another 4xx: refused for good.
    Refused,
    /// 5xx, or no answer: ask again after [`retry_wait`].
    Retry,
}

impl Answer {
    /// The class of an HTTP status.
    pub fn of_status(status: u16) -> Self {
        match status {
            200..=299 => Answer::Done,
            401 => Answer::SessionEnded,
            400..=499 => Answer::Refused,
            _ => Answer::Retry,
        }
    }
}

/// What an agent is: the ramdisk's or the installed OS's.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema, utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum AgentRole {
    /// The inspection ramdisk's agent (`bcd ramdisk`), joined with a
    /// `discovery` token.
    Ramdisk,
    /// The installed or adopted OS's agent (`bcd node`), joined with a
    /// `provisioned` or a pool's `node` token.
    Node,
}

impl AgentRole {
    /// The wire name.
    pub const fn as_str(self) -> &'static str {
        match self {
            AgentRole::Ramdisk => "ramdisk",
            AgentRole::Node => "node",
        }
    }
}

/// Why an agent identity exists: what its join token was minted for and
/// what its certificate names (OU). A command is answered only by an
/// identity of a purpose it is for ([`CommandKind::run_by`]), and a
/// transition ends the purposes it ends (`bcm_core::identity`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum AgentPurpose {
    /// A ramdisk session, for one workflow's commands.
    Discovery,
    /// The installed OS a deploy wrote.
    Provisioned,
    /// An adopted machine's OS (a pool's `node` token).
    Node,
}

impl AgentPurpose {
    /// Every purpose.
    pub const ALL: [AgentPurpose; 3] = [
        AgentPurpose::Discovery,
        AgentPurpose::Provisioned,
        AgentPurpose::Node,
    ];

    /// The wire name (a certificate's OU, a join token's purpose).
    pub const fn as_str(self) -> &'static str {
        match self {
            AgentPurpose::Discovery => "discovery",
            AgentPurpose::Provisioned => "provisioned",
            AgentPurpose::Node => "node",
        }
    }

    /// Parses the wire name.
    pub fn parse(s: &str) -> Result<Self, ContractError> {
        Self::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| ContractError::Undecodable {
                what: "agent purpose",
                why: format!(
                    "unknown purpose {:?}",
                    s.chars().take(32).collect::<String>()
                ),
            })
    }

    /// The agent role an identity of this purpose joins as.
    pub const fn role(self) -> AgentRole {
        match self {
            AgentPurpose::Discovery => AgentRole::Ramdisk,
            AgentPurpose::Provisioned | AgentPurpose::Node => AgentRole::Node,
        }
    }
}

impl std::fmt::Display for AgentPurpose {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Display for AgentRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An agent's join request (`POST /api/agent/join`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JoinRequest {
    /// The one-time join token from the kernel command line or user data.
    #[schema(min_length = 1, max_length = 256)]
    pub token: String,
    /// A PKCS#10 certificate signing request (PEM) for the agent's ed25519
    /// key, which never leaves the agent's memory.
    #[schema(
        min_length = 1,
        max_length = 16384,
        pattern = "-----BEGIN CERTIFICATE REQUEST-----[\\s\\S]*-----END CERTIFICATE REQUEST-----"
    )]
    pub csr: String,
    pub role: AgentRole,
    /// For an adopt (`node` token of a pool): what the machine calls itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[A-Za-z0-9._-]{1,253}$")]
    pub hostname: Option<String>,
    /// For an adopt: the machine as the agent sees it (the `inventory`
    /// output's shape), which the pool's acceptance checks read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub inventory: Option<crate::outputs::Inventory>,
}

/// The most disks or NICs a join's inventory lists.
pub const MAX_JOIN_INVENTORY_ITEMS: usize = 1024;

const CSR_BEGIN: &str = "-----BEGIN CERTIFICATE REQUEST-----";
const CSR_END: &str = "-----END CERTIFICATE REQUEST-----";

/// Whether `csr` is shaped as the schema says: a PEM certificate signing
/// request of 1-16384 characters (whether it parses is the CA's to say).
fn is_csr_pem(csr: &str) -> bool {
    let begin = csr.find(CSR_BEGIN);
    let end = csr.rfind(CSR_END);
    let ordered = matches!((begin, end), (Some(b), Some(e)) if b + CSR_BEGIN.len() <= e);
    (1..=16384).contains(&csr.chars().count()) && ordered
}

impl JoinRequest {
    /// What the schema states beyond the types: lengths and the host name's
    /// characters.
    pub fn check(&self) -> Result<(), ContractError> {
        let bad = |why: &str| ContractError::Undecodable {
            what: "join request",
            why: why.to_owned(),
        };
        if !(1..=256).contains(&self.token.chars().count()) {
            return Err(bad("token must be 1-256 characters"));
        }
        if !is_csr_pem(&self.csr) {
            return Err(bad(
                "csr must be a PEM certificate signing request of at most 16384 characters",
            ));
        }
        if self
            .hostname
            .as_deref()
            .is_some_and(|h| !bcm_core::text::is_hostname(h))
        {
            return Err(bad(
                "hostname must be 1-253 letters, digits, '.', '_' or '-'",
            ));
        }
        if let Some(inv) = &self.inventory {
            if self.role != AgentRole::Node {
                return Err(bad(
                    "only an adopting node (role node) reports an inventory at join",
                ));
            }
            if inv.disks.len() > MAX_JOIN_INVENTORY_ITEMS
                || inv.nics.len() > MAX_JOIN_INVENTORY_ITEMS
            {
                return Err(bad("an inventory lists at most 1024 disks and 1024 NICs"));
            }
        }
        Ok(())
    }
}

/// An installed OS's agent rejoining with the identity it kept (`POST
/// /api/agent/rejoin`): no token; the key of a certificate in force signs
/// [`RejoinRequest::signing_input`]. With a CSR it renews: a new
/// certificate for the CSR's key. The answer is a [`JoinResponse`]; the
/// same signed request asked again gets the same one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RejoinRequest {
    #[schema(pattern = "^node_[0-9A-HJKMNP-TV-Z]{26}$")]
    pub node_id: String,
    /// The serial (hex) of the certificate whose key signs.
    #[schema(pattern = "^[0-9a-f]{2,64}$")]
    pub cert_serial: String,
    /// When the agent signed (RFC 3339, UTC): within 300 s of the control
    /// plane's clock, and newer than every rejoin this certificate signed.
    #[schema(min_length = 20, max_length = 40)]
    pub signed_at: String,
    /// To renew: a PKCS#10 request (PEM) for the agent's next key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(
        min_length = 1,
        max_length = 16384,
        pattern = "-----BEGIN CERTIFICATE REQUEST-----[\\s\\S]*-----END CERTIFICATE REQUEST-----"
    )]
    pub csr: Option<String>,
    /// The ed25519 signature (standard base64) of the signing input.
    #[schema(pattern = "^[A-Za-z0-9+/]{86}==$")]
    pub signature: String,
}

impl RejoinRequest {
    /// The bytes the certificate's key signs: a domain tag, then the node,
    /// the serial, the time and the CSR (empty without), NUL-separated.
    pub fn signing_input(
        node_id: &str,
        cert_serial: &str,
        signed_at: &str,
        csr: Option<&str>,
    ) -> Vec<u8> {
        let mut out = b"bcm-agent-rejoin-v1".to_vec();
        for part in [node_id, cert_serial, signed_at, csr.unwrap_or("")] {
            out.push(0);
            out.extend_from_slice(part.as_bytes());
        }
        out
    }

    /// What the schema states beyond the types.
    pub fn check(&self) -> Result<(), ContractError> {
        let bad = |why: &str| ContractError::Undecodable {
            what: "rejoin request",
            why: why.to_owned(),
        };
        if self.node_id.parse::<bcm_core::NodeId>().is_err() {
            return Err(bad("nodeId is not a node id"));
        }
        if !(2..=64).contains(&self.cert_serial.len())
            || !self
                .cert_serial
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(bad("certSerial must be 2-64 lowercase hex digits"));
        }
        if !(20..=40).contains(&self.signed_at.len())
            || chrono::DateTime::parse_from_rfc3339(&self.signed_at).is_err()
        {
            return Err(bad("signedAt must be an RFC 3339 time"));
        }
        if let Some(csr) = &self.csr {
            if !is_csr_pem(csr) {
                return Err(bad(
                    "csr must be a PEM certificate signing request of at most 16384 characters",
                ));
            }
        }
        if self.signature.len() != 88 {
            return Err(bad("signature must be a base64 ed25519 signature"));
        }
        Ok(())
    }
}

/// The answer to a join.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JoinResponse {
    pub node_id: String,
    /// Bearer token of the agent's session.
    pub session_token: String,
    pub cert_serial: String,
    /// The node certificate (PEM) issued for the CSR's key.
    pub certificate: String,
    /// The CA certificate (PEM) that issued it.
    pub ca_certificate: String,
    /// ed25519 public keys (base64) whose signature on an image manifest
    /// the agent trusts.
    #[serde(default)]
    pub image_keys: Vec<String>,
}

/// A heartbeat (`POST /api/agent/heartbeat`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Heartbeat {
    pub role: AgentRole,
}

/// The answer to a heartbeat: when the control plane wants the next one.
///
/// The control plane sets the cadence, not the agent: an agent whose node
/// runs a workflow (a step may be waiting on it) is asked every few
/// seconds, an idle installed OS about once a minute with jitter (less
/// often in a large fleet, up to [`HeartbeatAck::MAX_SECS`]), so a
/// deployed fleet's heartbeats do not crowd out the agents that are at
/// work. Read by agents that may be older or newer than the control plane:
/// unknown fields are ignored, and an agent that gets no answer (or a
/// `204` from an older control plane) keeps its own default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct HeartbeatAck {
    /// Seconds until the next heartbeat (1 to [`HeartbeatAck::MAX_SECS`]).
    #[schema(minimum = 1, maximum = 3600)]
    pub next_heartbeat_secs: u32,
    /// Whether an installed OS's agent holds a poll for commands open until
    /// its next heartbeat: its node runs a workflow that may send it one
    /// (a rescue's `node.powerOff`), or it is an adopted machine's. An idle
    /// deployed fleet holds no polls, only heartbeats. Absent: false. A
    /// ramdisk always polls.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub poll_commands: bool,
}

impl HeartbeatAck {
    /// The longest cadence an agent accepts; a larger value is taken as this.
    pub const MAX_SECS: u32 = 3600;

    /// How long the agent waits before its next heartbeat: the control
    /// plane's cadence, bounded to 1 s..[`Self::MAX_SECS`].
    pub fn next(&self) -> std::time::Duration {
        std::time::Duration::from_secs(u64::from(self.next_heartbeat_secs.clamp(1, Self::MAX_SECS)))
    }
}

/// A command handed to an agent. `params` is kept as the control plane
/// stored it: the agent signs over exactly these bytes' JSON, and reads
/// them through [`AgentCommand::command`].
///
/// Read by agents that may be older than the control plane (a ramdisk built
/// before): unknown fields are ignored, not refused, so a field added here
/// (as `traceparent` was) never stops an agent from taking its commands.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentCommand {
    pub command_id: String,
    pub kind: CommandKind,
    #[schema(value_type = Object)]
    pub params: serde_json::Value,
    /// When the control plane issued it; part of the signing input.
    pub issued_at: DateTime<Utc>,
    /// The join tokens the parameters' references (`bcmjref_<id>`) stand
    /// for, by reference. The parameters as stored and signed keep the
    /// references (no command row, event or stream holds a token); the
    /// agent puts each token in place of its reference only where it uses
    /// the value (the user data it writes), and never logs or reports it.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub join_tokens: std::collections::BTreeMap<String, String>,
    /// The W3C trace context of the workflow step that issued it; the
    /// agent sends it back as the `traceparent` header of its result, so
    /// the verb's trace goes on through the agent. Not signed: it only
    /// links spans.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// For a destructive kind: the approved batch that allows it; the
    /// agent verifies it against its own trust anchor before it acts.
    /// Not part of the signed result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub authority: Option<crate::batch::BatchAuthority>,
}

impl AgentCommand {
    /// The typed command; parameters that are not the kind's are an error
    /// (the agent then fails the command, it never guesses).
    pub fn command(&self) -> Result<Command, ContractError> {
        Command::from_parts(self.kind.as_str(), self.params.clone())
    }
}

/// A result an agent posts (`POST /api/agent/results`), signed over
/// `bcm_pki::signing_input` with its key. `output` is the command kind's
/// [`crate::Output`] as JSON; the attestation service decodes it with the
/// stored command's kind before it records anything.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentResult {
    #[schema(pattern = "^cmd_[0-7][0-9a-hjkmnp-tv-z]{25}$")]
    pub command_id: String,
    pub ok: bool,
    #[serde(default)]
    pub retryable: bool,
    /// The kind's output (an object); a failed command may send `null`.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub output: serde_json::Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 4096, pattern = "^[^\\u0000]*$")]
    pub error: Option<String>,
    /// When the agent finished; part of the signing input.
    pub finished_at: DateTime<Utc>,
    /// ed25519 signature (64 bytes), base64; absent when the agent cannot
    /// sign.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[A-Za-z0-9+/]{85}[AQgw]==$")]
    pub signature: Option<String>,
}

impl AgentResult {
    /// What the schema states beyond the types: the command id's form, the
    /// error's length and characters, the signature's form.
    pub fn check(&self) -> Result<(), ContractError> {
        let bad = |why: &str| ContractError::Undecodable {
            what: "agent result",
            why: why.to_owned(),
        };
        if self.command_id.parse::<bcm_core::CommandId>().is_err() {
            return Err(bad("commandId is not a command id"));
        }
        if !(self.output.is_object() || self.output.is_null()) {
            return Err(bad("output must be an object or null"));
        }
        if self
            .error
            .as_deref()
            .is_some_and(|e| e.chars().count() > 4096 || e.contains('\0'))
        {
            return Err(bad("error must be at most 4096 characters without NUL"));
        }
        // 64 bytes are 85 full characters and one holding 4 bits (so one
        // of A, Q, g, w), then the padding.
        let sig_ok = |s: &str| {
            s.len() == 88
                && s.ends_with("==")
                && s.as_bytes()[..85]
                    .iter()
                    .all(|b| b.is_ascii_alphanumeric() || *b == b'+' || *b == b'/')
                && matches!(s.as_bytes()[85], b'A' | b'Q' | b'g' | b'w')
        };
        if self.signature.as_deref().is_some_and(|s| !sig_ok(s)) {
            return Err(bad(
                "signature must be an ed25519 signature in base64 (88 characters)",
            ));
        }
        Ok(())
    }
}

/// What made an agent's presence record change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum PresenceEvent {
    Join,
    Heartbeat,
}

/// An agent's join as the record keeps it (the `node_facts` row
/// `agent:<purpose>`), written by the attestation service at a join and
/// read by the engine (a step waiting for a join) and the reconciler (an
/// adoption's acceptance check), which run in other processes. The API
/// keeps heartbeats apart (`heartbeat:<purpose>`): a heartbeat is never a
/// join.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentPresence {
    pub role: AgentRole,
    pub event: PresenceEvent,
    /// The certificate the join issued.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_serial: Option<String>,
    /// What an adopted machine calls itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
}

impl AgentPresence {
    /// Whether this is a join (never a heartbeat), of `role` when one is
    /// asked for.
    pub fn is_join_of(&self, role: Option<&str>) -> bool {
        self.event == PresenceEvent::Join && role.is_none_or(|r| self.role.as_str() == r)
    }

    /// Reads a stored presence (`None` when there is none).
    pub fn from_stored(v: Option<serde_json::Value>) -> Result<Option<Self>, ContractError> {
        v.map(|v| {
            serde_json::from_value(v).map_err(|e| ContractError::Undecodable {
                what: "agent presence",
                why: e.to_string(),
            })
        })
        .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CSR: &str =
        "-----BEGIN CERTIFICATE REQUEST-----\nMIGV\n-----END CERTIFICATE REQUEST-----\n";

    /// The agents' retries double from 250 ms and never wait past 8 s, so
    /// within the engine's default silence limit (60 s) an agent asks at
    /// least ten times.
    #[test]
    fn a_heartbeat_is_never_a_join() {
        let p = |event| AgentPresence {
            role: AgentRole::Node,
            event,
            cert_serial: None,
            hostname: None,
        };
        assert!(p(PresenceEvent::Join).is_join_of(Some("node")));
        assert!(p(PresenceEvent::Join).is_join_of(None));
        assert!(!p(PresenceEvent::Join).is_join_of(Some("ramdisk")));
        assert!(!p(PresenceEvent::Heartbeat).is_join_of(Some("node")));
        assert!(!p(PresenceEvent::Heartbeat).is_join_of(None));
    }

    #[test]
    fn a_ramdisk_runs_agent_commands_and_an_adopted_os_its_own() {
        use crate::commands::Family;
        for k in CommandKind::ALL {
            let by = k.run_by();
            assert_eq!(!by.is_empty(), k.family() == Family::Agent, "{k}");
        }
        // A deployed OS is only ever asked to power off (a rescue's clean
        // shutdown); it never wipes.
        assert_eq!(
            CommandKind::run_by_purpose(AgentPurpose::Provisioned),
            vec![CommandKind::NodePowerOff]
        );
        assert_eq!(
            CommandKind::run_by_purpose(AgentPurpose::Node),
            vec![CommandKind::NodeWipe, CommandKind::NodePowerOff]
        );
        assert!(
            !CommandKind::run_by_purpose(AgentPurpose::Discovery).contains(&CommandKind::NodeWipe)
        );
        assert!(
            CommandKind::run_by_purpose(AgentPurpose::Discovery).contains(&CommandKind::DiskWipe)
        );
        for p in AgentPurpose::ALL {
            assert_eq!(AgentPurpose::parse(p.as_str()).ok(), Some(p));
        }
        assert!(AgentPurpose::parse("ramdisk").is_err());
    }

    #[test]
    fn a_heartbeat_answer_is_bounded_and_tolerant() {
        let ack: HeartbeatAck =
            serde_json::from_str(r#"{"nextHeartbeatSecs":0,"fromANewerPlane":true}"#)
                .expect("unknown fields are ignored");
        assert_eq!(ack.next().as_secs(), 1, "never a busy loop");
        assert!(!ack.poll_commands, "absent: no poll");
        let ack = HeartbeatAck {
            next_heartbeat_secs: u32::MAX,
            poll_commands: false,
        };
        assert_eq!(ack.next().as_secs(), 3600, "never silent for hours");
        assert_eq!(
            serde_json::to_value(&ack).expect("json"),
            serde_json::json!({"nextHeartbeatSecs": u32::MAX}),
            "written only when true"
        );
        assert!(serde_json::from_str::<HeartbeatAck>(r#"{"nextHeartbeatSecs":-5}"#).is_err());
        assert!(serde_json::from_str::<HeartbeatAck>("{}").is_err());
    }

    #[test]
    fn agents_retry_often_enough_to_be_heard_within_the_silence_limit() {
        assert_eq!(retry_backoff(0, 1.0).as_millis(), 250);
        assert_eq!(retry_backoff(1, 1.0).as_millis(), 500);
        assert_eq!(retry_backoff(1, 0.0).as_millis(), 250, "half the ceiling");
        for (draw, ms) in [(0.5, 375), (f64::NAN, 500), (-3.0, 250), (7.0, 500)] {
            assert_eq!(retry_backoff(1, draw).as_millis(), ms, "{draw}");
        }
        assert!((0..1000).all(|a| retry_backoff(a, 1.0).as_millis() <= 8_000));
        assert!((0..1000).all(|a| retry_backoff(a, 0.0).as_millis() >= 125));
        // Even drawing the longest wait every time.
        let mut waited = 0u128;
        let mut asks = 0;
        while waited + retry_backoff(asks, 1.0).as_millis() <= 60_000 {
            waited += retry_backoff(asks, 1.0).as_millis();
            asks += 1;
        }
        assert!(asks >= 10, "{asks} asks in 60 s");
        // Agents turned away at once come back spread over the upper half.
        let draws: Vec<u128> = (0..=10)
            .map(|i| retry_backoff(3, f64::from(i) / 10.0).as_millis())
            .collect();
        assert_eq!(draws.first(), Some(&1_000));
        assert_eq!(draws.last(), Some(&2_000));
        assert!(draws.windows(2).all(|w| w[0] < w[1]), "{draws:?}");
    }

    #[test]
    fn a_retry_after_is_a_floor_under_the_backoff_and_capped() {
        let b = |a| retry_backoff(a, 1.0);
        assert_eq!(retry_wait(1, 1.0, None), b(1));
        assert_eq!(
            retry_wait(1, 1.0, Some("2")).as_millis(),
            2_000,
            "the floor"
        );
        assert_eq!(
            retry_wait(5, 1.0, Some("1")),
            b(5),
            "a longer backoff stays"
        );
        assert_eq!(retry_wait(1, 1.0, Some(" 3 ")).as_millis(), 3_000);
        assert_eq!(retry_wait(1, 1.0, Some("3600")), RETRY_AFTER_CAP);
        assert_eq!(retry_wait(1, 1.0, Some("99999999999999999999")), b(1));
        for garbage in [
            "",
            "-1",
            "1.5",
            "soon",
            "Wed, 21 Oct 2015 07:28:00 GMT",
            "\u{0}",
        ] {
            assert_eq!(retry_wait(1, 1.0, Some(garbage)), b(1), "{garbage:?}");
        }
    }

    fn join() -> JoinRequest {
        JoinRequest {
            token: "t".into(),
            csr: CSR.into(),
            role: AgentRole::Node,
            hostname: Some("rack1-u3".into()),
            inventory: None,
        }
    }

    fn result() -> AgentResult {
        AgentResult {
            command_id: bcm_core::CommandId::generate().to_string(),
            ok: true,
            retryable: false,
            output: serde_json::json!({}),
            error: None,
            finished_at: Utc::now(),
            signature: Some(format!("{}w==", "A".repeat(85))),
        }
    }

    #[test]
    fn a_join_request_is_checked_beyond_its_types() {
        assert!(join().check().is_ok());
        let bad = [
            JoinRequest {
                token: String::new(),
                ..join()
            },
            JoinRequest {
                token: "t".repeat(257),
                ..join()
            },
            JoinRequest {
                csr: "]".into(),
                ..join()
            },
            JoinRequest {
                csr: "-----END CERTIFICATE REQUEST----------BEGIN CERTIFICATE REQUEST-----".into(),
                ..join()
            },
            JoinRequest {
                csr: format!("{CSR}{}", "x".repeat(16384)),
                ..join()
            },
            JoinRequest {
                hostname: Some("a b".into()),
                ..join()
            },
            JoinRequest {
                role: AgentRole::Ramdisk,
                inventory: Some(crate::outputs::Inventory {
                    system: Default::default(),
                    cpus: 1,
                    cpu_model: String::new(),
                    memory_mib: 1,
                    disks: vec![],
                    nics: vec![],
                    kernel: None,
                    sim: false,
                }),
                ..join()
            },
            JoinRequest {
                hostname: Some(String::new()),
                ..join()
            },
            JoinRequest {
                hostname: Some("é".into()),
                ..join()
            },
        ];
        for req in bad {
            assert!(req.check().is_err(), "{req:?}");
        }
    }

    #[test]
    fn an_agent_result_is_checked_beyond_its_types() {
        assert!(result().check().is_ok());
        assert!(AgentResult {
            output: serde_json::Value::Null,
            signature: None,
            ..result()
        }
        .check()
        .is_ok());
        let bad = [
            AgentResult {
                command_id: "cmd_x".into(),
                ..result()
            },
            AgentResult {
                output: serde_json::json!([1]),
                ..result()
            },
            AgentResult {
                output: serde_json::json!("x"),
                ..result()
            },
            AgentResult {
                error: Some("a\0b".into()),
                ..result()
            },
            AgentResult {
                error: Some("e".repeat(4097)),
                ..result()
            },
            // Padding bits set: not the base64 of 64 bytes.
            AgentResult {
                signature: Some(format!("{}B==", "A".repeat(85))),
                ..result()
            },
            AgentResult {
                signature: Some(format!("{}w=", "A".repeat(85))),
                ..result()
            },
            // 88 bytes, a multi-byte character where a slice would split it.
            AgentResult {
                signature: Some(format!("{}é==", "A".repeat(84))),
                ..result()
            },
        ];
        for r in bad {
            assert!(r.check().is_err(), "{r:?}");
        }
    }
}
