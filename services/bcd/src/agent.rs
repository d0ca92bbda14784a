//! The agent protocol, the same for `bcd ramdisk` and `bcd node`: join with
//! a one-time token and a CSR for a key generated in memory (`bcd node`
//! then keeps its identity on disk, rejoins with it after a reboot and
//! renews its certificate), heartbeat,
//! long-poll for commands, run each at most once (by command id), and post
//! results signed over `bcm_pki::signing_input`, retrying until the control
//! plane answers.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use bcm_contracts::agent::{
    AgentCommand, AgentResult, AgentRole, Heartbeat, HeartbeatAck, JoinRequest, JoinResponse,
    RejoinRequest,
};
use bcm_contracts::commands::{Command, DeployImageParams, WipeParams};
use bcm_contracts::outputs::{KexecLoaded, PoweringOff, WipeReport};
use bcm_contracts::{CommandKind, Output};
use ed25519_dalek::{Signer, SigningKey, VerifyingKey};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use crate::disks;
use crate::state::AgentState;

/// What an agent needs.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub api: String,
    pub node: Option<String>,
    pub join_token: String,
    pub role: AgentRole,
    pub hostname: Option<String>,
    /// Disks to see (tests); empty: every disk in `/sys/block`.
    pub disks: Vec<PathBuf>,
    /// The image-signing keys this agent trusts: pinned in its build (the
    /// ramdisk's `/etc/bcd/trust/image-keys`), never taken from a network
    /// answer.
    pub image_keys: Vec<VerifyingKey>,
    /// The control plane's CA (PEM), pinned in the build: an `https` API
    /// is trusted through it alone. Plain `http` (tests on loopback) needs
    /// none.
    pub ca_pem: Option<String>,
    /// The site's forward proxy (`bcm.proxy=`).
    pub proxy: Option<String>,
    /// The boot server's image cache (`bcm.cache=`): catalog images are
    /// fetched from it first.
    pub cache: Option<String>,
    pub heartbeat: Duration,
    /// Random stripes read back after a device erase.
    pub wipe_stripes: usize,
    /// Where the agent keeps its key, session and command records across a
    /// restart of its process (`crate::state`); none: nowhere.
    pub state_dir: Option<PathBuf>,
    /// The quorum trust anchor (pinned in the build, or the site's on the
    /// kernel command line): a destructive command runs only under an
    /// approved batch verified against it.
    pub quorum_anchor: Option<bcm_quorum::Anchor>,
    /// What `node.powerOff` does once its result is posted.
    pub power_off: PowerOff,
}

/// What `node.powerOff` does once its result is posted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum PowerOff {
    /// Sync and power the machine off (its job on a real machine).
    #[default]
    Machine,
    /// Only stop bcd (tests, on a host that must stay up).
    Exit,
}

/// Why the agent stopped.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("join refused: {0}")]
    JoinRefused(String),
    #[error("the session ended (revoked or expired)")]
    SessionEnded,
}

/// A joined session.
pub struct Session {
    pub joined: JoinResponse,
    pub key: SigningKey,
    pub image_keys: Vec<VerifyingKey>,
}

use bcm_contracts::agent::retry_wait;

/// Joins, retrying while the control plane is unreachable or unavailable;
/// a refused token is final (it is single use).
pub async fn join(
    http: &reqwest::Client,
    cfg: &AgentConfig,
    state: &AgentState,
    stop: &CancellationToken,
) -> Result<Session, AgentError> {
    if let (Some(key), Some(joined)) = (state.key(), state.session()) {
        tracing::info!(node = %joined.node_id, serial = %joined.cert_serial, "carrying on with the kept session");
        let image_keys = image_keys_of(cfg, &joined);
        return Ok(Session {
            joined,
            key,
            image_keys,
        });
    }
    let key = match state.key() {
        Some(k) => k,
        None => {
            let k = SigningKey::generate(&mut rand::rngs::OsRng);
            if let Err(e) = state.save_key(&k) {
                tracing::warn!(error = %e, "the key was not kept: a restart joins afresh");
            }
            k
        }
    };
    let csr = bcm_pki::csr_pem(&key, cfg.node.as_deref().unwrap_or(cfg.role.as_str()))
        .map_err(|e| AgentError::JoinRefused(e.to_string()))?;
    // An adopting machine says what it is, for the pool's acceptance
    // checks; a ramdisk reports its inventory as a command's result.
    let inventory = (cfg.role == AgentRole::Node).then(|| crate::inventory::collect(&cfg.disks));
    let req = JoinRequest {
        token: cfg.join_token.clone(),
        csr,
        role: cfg.role,
        hostname: cfg.hostname.clone(),
        inventory,
    };
    let joined = ask_identity(
        http,
        &format!("{}/api/agent/join", cfg.api),
        "join",
        None,
        stop,
        || req.clone(),
    )
    .await?;
    let image_keys = image_keys_of(cfg, &joined);
    if let Err(e) = state.save_session(&joined) {
        tracing::warn!(error = %e, "the session was not kept: a restart joins afresh");
    }
    tracing::info!(node = %joined.node_id, serial = %joined.cert_serial, "joined");
    Ok(Session {
        joined,
        key,
        image_keys,
    })
}

/// Asks for an identity (a join or a rejoin, `what`) until the control
/// plane answers: retried while it is unreachable, unavailable or asks to
/// slow down (429), with `body()` asked for the request each time; any
/// other refusal is final. The certificate handed back must check against
/// `ca_pem` (a rejoin: the CA the kept identity was issued by) or, for a
/// first join, the CA the answer names.
async fn ask_identity<B: serde::Serialize>(
    http: &reqwest::Client,
    url: &str,
    what: &str,
    ca_pem: Option<&str>,
    stop: &CancellationToken,
    mut body: impl FnMut() -> B,
) -> Result<JoinResponse, AgentError> {
    let mut attempt = 0;
    loop {
        let mut asked_wait = None;
        match http.post(url).json(&body()).send().await {
            Ok(r) if r.status().is_success() => {
                let joined: JoinResponse = r
                    .json()
                    .await
                    .map_err(|e| AgentError::JoinRefused(format!("malformed answer: {e}")))?;
                let ca = ca_pem.unwrap_or(&joined.ca_certificate);
                if let Err(e) =
                    bcm_pki::ca::check_against(ca, &joined.certificate, chrono::Utc::now())
                {
                    return Err(AgentError::JoinRefused(format!(
                        "the certificate handed back does not check: {e}"
                    )));
                }
                return Ok(joined);
            }
            Ok(r) if r.status().is_client_error() && r.status().as_u16() != 429 => {
                let text = r.text().await.unwrap_or_default();
                return Err(AgentError::JoinRefused(text));
            }
            Ok(r) => {
                tracing::warn!(what, status = %r.status(), "control plane unavailable; retrying");
                asked_wait = retry_after(&r);
            }
            Err(e) => tracing::warn!(what, error = %e, "control plane unreachable; retrying"),
        }
        attempt += 1;
        tokio::select! {
            _ = stop.cancelled() => return Err(AgentError::SessionEnded),
            _ = tokio::time::sleep(retry_wait(attempt, rand::random(), asked_wait.as_deref())) => {}
        }
    }
}

/// The image keys an image must be signed by: the pinned ones alone. What
/// the join answer lists is only compared: a network answer never adds a
/// key.
fn image_keys_of(cfg: &AgentConfig, joined: &JoinResponse) -> Vec<VerifyingKey> {
    let unpinned = joined
        .image_keys
        .iter()
        .filter_map(|k| bcm_pki::image::parse_public_key(k))
        .filter(|k| !cfg.image_keys.contains(k))
        .count();
    if unpinned > 0 {
        tracing::warn!(
            unpinned,
            "the control plane names image keys this build does not pin; they are not trusted"
        );
    }
    cfg.image_keys.clone()
}

/// The HTTP client of the agent. A build that pins a CA speaks only
/// `https`, trusted through that CA alone (no system roots): the control
/// plane's URL comes from the network (the kernel command line, the seed),
/// so an `http` one is refused, never followed. Only a build that pins
/// nothing (loopback tests) speaks plain `http`.
pub fn http_client(cfg: &AgentConfig) -> Result<reqwest::Client, AgentError> {
    let https = cfg
        .api
        .get(..8)
        .is_some_and(|s| s.eq_ignore_ascii_case("https://"));
    let builder = match (&cfg.ca_pem, https) {
        (Some(ca), true) => {
            bcm_pki::tls::pinned_client(ca).map_err(|e| AgentError::JoinRefused(e.to_string()))?
        }
        (Some(_), false) => {
            return Err(AgentError::JoinRefused(format!(
                "this build pins the control plane's CA; {:?} is not https",
                cfg.api
            )))
        }
        (None, true) => {
            return Err(AgentError::JoinRefused(
                "the control plane is https but this build pins no CA (--ca-file)".into(),
            ))
        }
        (None, false) => reqwest::Client::builder(),
    };
    builder
        .timeout(Duration::from_secs(60))
        .build()
        .map_err(|e| AgentError::JoinRefused(e.to_string()))
}

/// Heartbeats until `stop`, every `default` until the control plane's
/// answer names another cadence (then at that one, until an answer says
/// otherwise; an unanswered or unreadable heartbeat keeps the last), and
/// at once when `nudge` is notified (a command begins: the agent polls no
/// more until it is answered, and an idle cadence must not leave the
/// engine thinking it silent). Each answer's `pollCommands` goes to
/// `polls`, when given (an installed OS polls only while asked to).
#[allow(clippy::too_many_arguments)]
pub async fn heartbeat(
    http: reqwest::Client,
    api: String,
    session: String,
    role: AgentRole,
    default: Duration,
    nudge: Arc<tokio::sync::Notify>,
    polls: Option<tokio::sync::watch::Sender<bool>>,
    stop: CancellationToken,
) {
    let mut every = default;
    loop {
        let sent = http
            .post(format!("{api}/api/agent/heartbeat"))
            .bearer_auth(&session)
            .json(&Heartbeat { role })
            .send()
            .await;
        if let Ok(r) = sent {
            if r.status().as_u16() == 401 {
                tracing::warn!("heartbeat: session ended");
                stop.cancel();
                return;
            }
            if r.status().is_success() {
                if let Ok(ack) = r.json::<HeartbeatAck>().await {
                    every = ack.next();
                    if let Some(p) = &polls {
                        p.send_replace(ack.poll_commands);
                    }
                }
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = nudge.notified() => {}
            _ = tokio::time::sleep(every) => {}
        }
    }
}

/// What a command produced, and what to do after its result is posted.
pub struct Outcome {
    pub ok: bool,
    /// The kind's output as JSON (`{}` when it failed without one).
    pub output: Value,
    pub error: Option<String>,
    pub then_kexec: bool,
    pub then_power_off: bool,
}

impl Outcome {
    fn ok(output: Output) -> Self {
        Self {
            ok: true,
            output: output.to_json(),
            error: None,
            then_kexec: false,
            then_power_off: false,
        }
    }

    fn failed(error: String) -> Self {
        Self {
            ok: false,
            output: json!({}),
            error: Some(error),
            then_kexec: false,
            then_power_off: false,
        }
    }

    /// A command begun before bcd restarted, with no result kept.
    fn interrupted() -> Self {
        Self::failed(
            "bcd restarted while this command ran; what it did is unknown and it is not run again"
                .to_owned(),
        )
    }
}

/// Runs one ramdisk command (blocking: disk and network I/O). Parameters
/// that are not the kind's fail the command; nothing is guessed.
pub fn execute(cfg: &AgentConfig, image_keys: &[VerifyingKey], cmd: &AgentCommand) -> Outcome {
    let command = match cmd.command() {
        Ok(c) => c,
        Err(e) => return Outcome::failed(format!("the command breaks its contract: {e}")),
    };
    // The control plane is not trusted to say a wipe or an image is
    // approved: the batch's signatures and this node's inclusion proof are
    // checked here, against the anchor this agent was given.
    if let Err(e) = bcm_quorum::check_command(
        cfg.quorum_anchor.as_ref(),
        cmd.kind,
        Some(&command),
        cfg.node.as_deref(),
        cmd.authority.as_ref(),
        chrono::Utc::now().timestamp(),
    ) {
        tracing::warn!(command = %cmd.command_id, kind = %cmd.kind, error = %e, "refused a destructive command");
        return Outcome::failed(e.refusal());
    }
    match command {
        Command::Inventory(_) => {
            Outcome::ok(Output::Inventory(crate::inventory::collect(&cfg.disks)))
        }
        Command::DiskWipe(p) => match wipe(cfg, &p, false) {
            Ok(report) => Outcome::ok(Output::DiskWipe(report)),
            Err(e) => Outcome::failed(e),
        },
        // The machine's own OS wipes the disks it runs on: their file
        // systems go read-only first.
        Command::NodeWipe(p) => {
            // What this process runs on stays in memory: its pages are
            // never read back from a disk being erased.
            lock_memory();
            match wipe(cfg, &p, true) {
                Ok(report) => Outcome::ok(Output::NodeWipe(report)),
                Err(e) => Outcome::failed(e),
            }
        }
        Command::NodePowerOff(_) => Outcome {
            then_power_off: true,
            ..Outcome::ok(Output::NodePowerOff(PoweringOff { powering_off: true }))
        },
        Command::DeployImage(p) => deploy(cfg, image_keys, &p, &cmd.join_tokens),
        Command::DiagDcgm(p) => match crate::dcgm::run(p.level) {
            Ok(report) => Outcome::ok(Output::DiagDcgm(report)),
            Err(e) => Outcome::failed(e),
        },
        Command::BootKexec(k) => match crate::kexec::load(&k) {
            Ok(()) => Outcome {
                then_kexec: true,
                ..Outcome::ok(Output::BootKexec(KexecLoaded {
                    loaded: k.kernel.clone(),
                }))
            },
            Err(e) => Outcome::failed(e),
        },
        other => Outcome::failed(format!("unsupported command {}", other.kind())),
    }
}

/// `disk.wipe` (`node.wipe` from the running OS, `from_os`: each disk's
/// file systems remounted read-only first): every disk, each read back;
/// the report lists them all.
fn wipe(cfg: &AgentConfig, p: &WipeParams, from_os: bool) -> Result<WipeReport, String> {
    let Some(method) = crate::wipe::Method::of(p.mode) else {
        return Err("a wipe with mode none erases nothing".into());
    };
    let found = match disks::discover(&cfg.disks) {
        Ok(d) if !d.is_empty() => d,
        Ok(_) => return Err("no disks found".into()),
        Err(e) => return Err(format!("finding disks: {e}")),
    };
    let reports = found
        .iter()
        .map(|d| {
            if from_os && d.is_block {
                crate::mounts::remount_read_only(&d.name);
            }
            tracing::info!(disk = %d.name, size = d.size_bytes, ?method, "wiping");
            let r = crate::wipe::wipe_disk(d, method, &p.methods, cfg.wipe_stripes);
            tracing::info!(disk = %d.name, outcome = ?r.outcome, erase = ?r.erase, reason = ?r.reason, millis = r.millis, "wiped");
            r
        })
        .collect();
    Ok(WipeReport {
        disks: reports,
        sim: false,
    })
}

/// `deploy.image`: the signed image to the target disk, then the user data
/// as a NoCloud seed.
fn deploy(
    cfg: &AgentConfig,
    image_keys: &[VerifyingKey],
    p: &DeployImageParams,
    join_tokens: &std::collections::BTreeMap<String, String>,
) -> Outcome {
    let disk = match disks::discover(&cfg.disks) {
        Ok(d) => match &p.disk {
            Some(name) => d.into_iter().find(|x| x.name == *name),
            None => d.into_iter().next(),
        },
        Err(e) => return Outcome::failed(format!("finding disks: {e}")),
    };
    let Some(disk) = disk else {
        return Outcome::failed("no target disk".into());
    };
    let opts = crate::image::DeployOptions {
        proxy: cfg.proxy.clone(),
        max_held_bytes: None,
        cached_url: cfg
            .cache
            .as_deref()
            .zip(p.cache_path.as_deref())
            .map(|(base, path)| format!("{}/{}", base.trim_end_matches('/'), path)),
    };
    let mut last = 0u64;
    let mut progress = |done: u64, total: u64| {
        let pct = done * 100 / total.max(1);
        if pct >= last + 10 {
            last = pct;
            tracing::info!(done, total, "deploy.image {pct}%");
        }
    };
    let mut report = match crate::image::deploy(&p.image, image_keys, &disk, &opts, &mut progress) {
        Ok(r) => r,
        Err(e) => return Outcome::failed(format!("{}: {e}", disk.name)),
    };
    if let Some(user_data) = &p.user_data {
        let node = cfg.node.as_deref().unwrap_or_default();
        // The installed OS joins with the tokens handed beside the command,
        // written in place of their references; the signed parameters keep
        // the references.
        let user_data = bcm_pki::join_key::substitute(user_data, join_tokens);
        match crate::seed::write_nocloud(&disk, &user_data, node, cfg.quorum_anchor.as_ref()) {
            Ok(seed) => report.user_data = Some(seed),
            Err(e) => {
                return Outcome {
                    ok: false,
                    error: Some(format!(
                        "the image was written and verified, but its user data was not: {e}"
                    )),
                    ..Outcome::ok(Output::DeployImage(report))
                }
            }
        }
    }
    Outcome::ok(Output::DeployImage(report))
}

/// Signs and builds the result of `cmd`.
pub fn signed_result(key: &SigningKey, node: &str, cmd: &AgentCommand, o: &Outcome) -> AgentResult {
    bcm_pki::signed_result(key, node, cmd, o.ok, o.output.clone(), o.error.clone())
}

/// The `Retry-After` an answer carried (a floor under the backoff,
/// `retry_wait`).
fn retry_after(r: &reqwest::Response) -> Option<String> {
    r.headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

async fn post_result(
    http: &reqwest::Client,
    api: &str,
    session: &str,
    result: &AgentResult,
    traceparent: Option<&str>,
    stop: &CancellationToken,
) -> Result<(), AgentError> {
    let mut attempt = 0;
    loop {
        let mut req = http
            .post(format!("{api}/api/agent/results"))
            .bearer_auth(session)
            .json(result);
        // The verb's trace goes on through bcd: the result carries the
        // context its command came with (bcd exports no spans of its own).
        if let Some(tp) = traceparent {
            req = req.header("traceparent", tp);
        }
        let sent = req.send().await;
        let mut asked_wait = None;
        match sent {
            Ok(r) if r.status().is_success() => return Ok(()),
            Ok(r) if r.status().as_u16() == 401 => return Err(AgentError::SessionEnded),
            Ok(r) if r.status().is_client_error() => {
                // Refused for good (a signature the control plane rejects,
                // an unknown command): retrying cannot change that.
                let status = r.status();
                let text = r.text().await.unwrap_or_default();
                tracing::error!(command = %result.command_id, %status, %text, "result refused");
                return Ok(());
            }
            Ok(r) => {
                tracing::warn!(status = %r.status(), "posting a result: retrying");
                asked_wait = retry_after(&r);
            }
            Err(e) => tracing::warn!(error = %e, "posting a result: retrying"),
        }
        attempt += 1;
        tokio::select! {
            _ = stop.cancelled() => return Err(AgentError::SessionEnded),
            _ = tokio::time::sleep(retry_wait(attempt, rand::random(), asked_wait.as_deref())) => {}
        }
    }
}

/// Runs the ramdisk agent until `stop` or the session ends.
pub async fn run_ramdisk(cfg: AgentConfig, stop: CancellationToken) -> Result<(), AgentError> {
    let http = http_client(&cfg)?;
    // One boot's state: keyed by its join token, so a new boot (a new
    // token) starts afresh and two agents on one host never share one.
    let boot_dir = cfg.state_dir.as_ref().map(|d| {
        use sha2::Digest as _;
        let digest = sha2::Sha256::digest(cfg.join_token.as_bytes());
        d.join(&hex::encode(digest)[..16])
    });
    let state = AgentState::open(boot_dir).unwrap_or_else(|e| {
        tracing::warn!(error = %e, "no state directory: a restart of bcd starts afresh");
        AgentState::default()
    });
    let session = join(&http, &cfg, &state, &stop).await?;
    let hb_stop = stop.child_token();
    let nudge = Arc::new(tokio::sync::Notify::new());
    tokio::spawn(heartbeat(
        http.clone(),
        cfg.api.clone(),
        session.joined.session_token.clone(),
        cfg.role,
        cfg.heartbeat,
        nudge.clone(),
        None,
        hb_stop.clone(),
    ));
    let mut served = Served {
        cfg: Arc::new(cfg),
        keys: Arc::new(session.image_keys.clone()),
        http,
        state,
        done: HashMap::new(),
        wiped: false,
        nudge,
    };
    let ran = served
        .serve(&session.key, &session.joined, None, &hb_stop, &stop)
        .await;
    hb_stop.cancel();
    ran
}

/// What serves an agent's commands across its sessions: the results of the
/// commands already run, by id (a command is never run twice), and where
/// they are kept.
struct Served {
    cfg: Arc<AgentConfig>,
    keys: Arc<Vec<VerifyingKey>>,
    http: reqwest::Client,
    state: AgentState,
    done: HashMap<String, AgentResult>,
    /// A `node.wipe` ran: the state directory's disk is erased.
    wiped: bool,
    /// Wakes the heartbeat when a command begins.
    nudge: Arc<tokio::sync::Notify>,
}

impl Served {
    /// Long-polls the session's commands and runs each at most once, until
    /// `end` (looked at between polls only: the commands a poll handed are
    /// all run and answered, each result posted until `stop`) or the
    /// session ends. A result is signed with `key`.
    async fn serve(
        &mut self,
        key: &SigningKey,
        joined: &JoinResponse,
        gate: Option<&mut tokio::sync::watch::Receiver<bool>>,
        end: &CancellationToken,
        stop: &CancellationToken,
    ) -> Result<(), AgentError> {
        let (cfg, http, state) = (self.cfg.clone(), self.http.clone(), &self.state);
        let (node, token) = (&joined.node_id, &joined.session_token);
        let mut attempt = 0;
        let mut gate = gate;
        while !end.is_cancelled() {
            // An installed OS polls only while its heartbeat's answer asks
            // it to (a workflow runs, or it is an adopted machine).
            if let Some(g) = gate.as_deref_mut() {
                tokio::select! {
                    _ = end.cancelled() => break,
                    open = g.wait_for(|poll| *poll) => {
                        if open.is_err() {
                            // The heartbeat ended (the session with it).
                            end.cancelled().await;
                            break;
                        }
                    }
                }
            }
            let polled = tokio::select! {
                _ = end.cancelled() => break,
                r = http.get(format!("{}/api/agent/commands?waitMs=25000", cfg.api)).bearer_auth(token).send() => r,
            };
            let cmds: Vec<AgentCommand> = match polled {
                Ok(r) if r.status().is_success() => {
                    attempt = 0;
                    match r.json().await {
                        Ok(cmds) => cmds,
                        Err(e) => {
                            // Leased to this session and not taken: they time
                            // out and their steps retry; say why.
                            tracing::error!(error = %e, "the control plane's commands could not be read");
                            vec![]
                        }
                    }
                }
                Ok(r) if r.status().as_u16() == 401 => {
                    state.forget_session();
                    return Err(AgentError::SessionEnded);
                }
                other => {
                    let asked_wait = match &other {
                        Err(e) => {
                            tracing::warn!(error = %e, "polling: retrying");
                            None
                        }
                        Ok(r) => retry_after(r),
                    };
                    attempt += 1;
                    tokio::select! {
                        _ = end.cancelled() => break,
                        _ = tokio::time::sleep(retry_wait(attempt, rand::random(), asked_wait.as_deref())) => {}
                    }
                    continue;
                }
            };
            for cmd in cmds {
                if let Some(r) = state.result(&cmd.command_id) {
                    self.done.entry(cmd.command_id.clone()).or_insert(r);
                }
                let (result, then) = match self.done.get(&cmd.command_id) {
                    Some(r) => (r.clone(), None),
                    None if !self.wiped && !state.begin(&cmd.command_id).unwrap_or(true) => {
                        // Begun by this machine before bcd restarted, with no
                        // result kept: what it did is unknown, and it is not
                        // run again (the step retries with a new command).
                        tracing::warn!(command = %cmd.command_id, "interrupted by a restart of bcd; not run again");
                        let r = signed_result(key, node, &cmd, &Outcome::interrupted());
                        let r = AgentResult {
                            retryable: true,
                            ..r
                        };
                        let _ = state.save_result(&r);
                        self.done.insert(cmd.command_id.clone(), r.clone());
                        (r, None)
                    }
                    None => {
                        tracing::info!(command = %cmd.command_id, kind = %cmd.kind, "running");
                        self.nudge.notify_one();
                        let (c, k, command) = (cfg.clone(), self.keys.clone(), cmd.clone());
                        let outcome =
                            match tokio::task::spawn_blocking(move || execute(&c, &k, &command))
                                .await
                            {
                                Ok(o) => o,
                                Err(e) => Outcome::failed(format!("the command panicked: {e}")),
                            };
                        let r = signed_result(key, node, &cmd, &outcome);
                        if cmd.kind == CommandKind::NodeWipe {
                            // The state directory is on a disk just erased
                            // (its file systems read-only, or written back
                            // over the read-back): nothing more is kept
                            // there; this process answers a repeat from
                            // memory.
                            self.wiped = true;
                        }
                        if self.wiped {
                            tracing::info!(command = %cmd.command_id, "the disks are erased: the result is kept in memory only");
                        } else if let Err(e) = state.save_result(&r) {
                            tracing::warn!(command = %cmd.command_id, error = %e, "the result was not kept");
                        }
                        self.done.insert(cmd.command_id.clone(), r.clone());
                        (r, Some(outcome))
                    }
                };
                post_result(
                    &http,
                    &cfg.api,
                    token,
                    &result,
                    cmd.traceparent.as_deref(),
                    stop,
                )
                .await?;
                match then {
                    Some(o) if o.then_kexec => {
                        tracing::info!("rebooting into the installed kernel");
                        let why = crate::kexec::exec();
                        tracing::error!(%why, "kexec failed");
                    }
                    Some(o) if o.then_power_off => {
                        println!("powering off (node.powerOff {})", cmd.command_id);
                        if cfg.power_off == PowerOff::Machine {
                            let down = if self.wiped {
                                Err(power_off())
                            } else {
                                shut_down()
                            };
                            if let Err(why) = down {
                                tracing::error!(%why, "power-off failed");
                            }
                        }
                        stop.cancel();
                        return Ok(());
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }
}

/// Locks the process's pages in memory (best effort, logged): `bcd node`
/// is about to erase the disk its binary may have been read from.
fn lock_memory() {
    // SAFETY: mlockall takes flags only.
    if unsafe { libc::mlockall(libc::MCL_CURRENT) } != 0 {
        tracing::warn!(error = %std::io::Error::last_os_error(), "could not lock bcd in memory; wiping anyway");
    }
}

/// Syncs and powers the machine off straight through the kernel. Not
/// through the init system: `node.powerOff` follows the erase of the disks
/// the OS runs from, so nothing on them (units, shutdown binaries) can be
/// relied on. Returns only on failure.
fn power_off() -> String {
    // SAFETY: syncs, then asks the kernel to power off.
    unsafe {
        libc::sync();
        libc::reboot(libc::LINUX_REBOOT_CMD_POWER_OFF);
    }
    format!("reboot(POWER_OFF): {}", std::io::Error::last_os_error())
}

/// Shuts the machine down cleanly through its init system (its services
/// stopped, its file systems unmounted), as a rescue asks of a deployed
/// OS before the BMC boots the ramdisk; where no systemd runs (a small
/// OS's busybox init), syncs and powers off through the kernel. Ok once
/// systemd took the job (bcd exits; the machine goes down after it).
fn shut_down() -> Result<(), String> {
    if std::path::Path::new("/run/systemd/system").is_dir() {
        match std::process::Command::new("systemctl")
            .args(["poweroff", "--no-block"])
            .status()
        {
            Ok(s) if s.success() => return Ok(()),
            Ok(s) => {
                tracing::warn!(status = %s, "systemctl poweroff failed; powering off through the kernel")
            }
            Err(e) => {
                tracing::warn!(error = %e, "systemctl poweroff failed; powering off through the kernel")
            }
        }
    }
    Err(power_off())
}

/// Rejoins with a kept identity (`key` holds the certificate of `kept`):
/// signs the node, the serial, the time and, to renew, a CSR for `next`;
/// retried while the control plane is unreachable or unavailable (the same
/// signed request: its answer may have been lost, and it gets the same
/// one), signed afresh once it nears the control plane's clock window. A
/// refusal is final: the identity is not in force any more.
pub async fn rejoin(
    http: &reqwest::Client,
    cfg: &AgentConfig,
    key: &SigningKey,
    kept: &JoinResponse,
    next: Option<&SigningKey>,
    stop: &CancellationToken,
) -> Result<JoinResponse, AgentError> {
    let csr = next
        .map(|k| bcm_pki::csr_pem(k, &kept.node_id))
        .transpose()
        .map_err(|e| AgentError::JoinRefused(e.to_string()))?;
    let sign = || {
        let signed_at = bcm_pki::format_ts(chrono::Utc::now());
        let input = RejoinRequest::signing_input(
            &kept.node_id,
            &kept.cert_serial,
            &signed_at,
            csr.as_deref(),
        );
        let signature =
            base64::engine::general_purpose::STANDARD.encode(key.sign(&input).to_bytes());
        (
            std::time::Instant::now(),
            RejoinRequest {
                node_id: kept.node_id.clone(),
                cert_serial: kept.cert_serial.clone(),
                signed_at,
                csr: csr.clone(),
                signature,
            },
        )
    };
    let (mut signed, mut req) = sign();
    let url = format!("{}/api/agent/rejoin", cfg.api);
    ask_identity(
        http,
        &url,
        "rejoin",
        Some(&kept.ca_certificate),
        stop,
        || {
            if signed.elapsed() > Duration::from_secs(240) {
                (signed, req) = sign();
            }
            req.clone()
        },
    )
    .await
}

/// How long until a certificate just obtained is renewed: two thirds of
/// what is left of its life (its `notBefore` is set back for clock skew,
/// so the time it was obtained counts as its start).
fn renew_in(joined: &JoinResponse) -> Duration {
    let now = chrono::Utc::now();
    match bcm_pki::ca::check_against(&joined.ca_certificate, &joined.certificate, now) {
        Ok(c) => ((c.not_after - now) * 2 / 3).to_std().unwrap_or_default(),
        Err(e) => {
            tracing::warn!(error = %e, "the certificate does not check; renewing it now");
            Duration::ZERO
        }
    }
}

/// The installed OS's (or an adopted machine's) agent. Its identity is kept
/// in the state directory (`/var/lib/bcd`, root only): after every boot it
/// rejoins with it — no token —, and renews its certificate before it
/// expires; only a machine without a kept identity in force joins with the
/// one-time token of its user data. It heartbeats in between and runs the
/// commands an installed OS is sent (an adopted machine's `node.wipe`;
/// `node.powerOff`, which a rescue also asks of a deployed OS), each at
/// most once (recorded in the same directory).
pub async fn run_node(cfg: AgentConfig, stop: CancellationToken) -> Result<(), AgentError> {
    let http = http_client(&cfg)?;
    let state = AgentState::open(cfg.state_dir.clone())
        .map_err(|e| AgentError::JoinRefused(format!("the state directory: {e}")))?;
    let mut kept = None;
    if let Some((key, old)) = state.identity() {
        match rejoin(&http, &cfg, &key, &old, None, &stop).await {
            Ok(joined) => {
                kept = Some((key, joined));
            }
            Err(AgentError::JoinRefused(why)) => {
                tracing::warn!(node = %old.node_id, serial = %old.cert_serial, why, "the kept identity is refused; joining with the user data's token");
            }
            Err(e) => return Err(e),
        }
    }
    let rejoined = kept.is_some();
    let (mut key, mut joined) = match kept {
        Some(k) => k,
        None if cfg.join_token.is_empty() => {
            return Err(AgentError::JoinRefused(
                "no identity in force is kept and no join token was given".into(),
            ))
        }
        None => {
            let session = join(&http, &cfg, &AgentState::default(), &stop).await?;
            (session.key, session.joined)
        }
    };
    // Destructive commands are checked against the node they are for.
    let nudge = Arc::new(tokio::sync::Notify::new());
    let mut served = Served {
        cfg: Arc::new(AgentConfig {
            node: Some(joined.node_id.clone()),
            ..cfg.clone()
        }),
        keys: Arc::new(vec![]),
        http: http.clone(),
        state: state.clone(),
        done: HashMap::new(),
        wiped: false,
        nudge: nudge.clone(),
    };
    let mut announce = Some(if rejoined {
        format!(
            "rejoined as node {} with its identity (certificate {})",
            joined.node_id, joined.cert_serial
        )
    } else {
        format!("joined as node {}", joined.node_id)
    });
    loop {
        if let Err(e) = state.save_identity(&key, &joined) {
            tracing::warn!(error = %e, "the identity was not kept: the next boot needs a token");
        }
        // Said once what it holds is kept.
        if let Some(line) = announce.take() {
            println!("{line}");
        }
        let beat = stop.child_token();
        let (polls, mut polls_rx) = tokio::sync::watch::channel(false);
        let beating = tokio::spawn(heartbeat(
            http.clone(),
            cfg.api.clone(),
            joined.session_token.clone(),
            AgentRole::Node,
            cfg.heartbeat,
            nudge.clone(),
            Some(polls),
            beat.clone(),
        ));
        let until = renew_in(&joined);
        // Until the renewal is due (`period`, also ended with the heartbeat:
        // the process stops or the session ends), the machine's commands
        // are served (the control plane hands each identity only its own:
        // an adopted machine's `node.wipe` and `node.powerOff`, a deployed
        // OS's `node.powerOff`); a command that began is finished and
        // answered first, with the heartbeat going on meanwhile.
        let period = beat.child_token();
        let renewal = {
            let period = period.clone();
            tokio::spawn(async move {
                tokio::select! {
                    _ = tokio::time::sleep(until) => { period.cancel(); true }
                    _ = period.cancelled() => false,
                }
            })
        };
        let served_until = served
            .serve(&key, &joined, Some(&mut polls_rx), &period, &stop)
            .await;
        // The heartbeat ended the period (a revoked identity) or goes on
        // until the served command was answered.
        let session_over = beat.is_cancelled();
        period.cancel();
        beat.cancel();
        let _ = beating.await;
        let renew_due = renewal.await.unwrap_or(false);
        match served_until {
            _ if stop.is_cancelled() => return Ok(()),
            Err(e) => return Err(e),
            // The session ended (its identity revoked): nothing to rejoin
            // with.
            Ok(()) if session_over || !renew_due => return Err(AgentError::SessionEnded),
            Ok(()) => {}
        }
        let next = SigningKey::generate(&mut rand::rngs::OsRng);
        match rejoin(&http, &cfg, &key, &joined, Some(&next), &stop).await {
            Ok(renewed) => {
                tracing::info!(node = %renewed.node_id, old = %joined.cert_serial, new = %renewed.cert_serial, "certificate renewed");
                announce = Some(format!("renewed certificate {}", renewed.cert_serial));
                (key, joined) = (next, renewed);
            }
            Err(AgentError::JoinRefused(why)) => {
                tracing::error!(
                    why,
                    "the renewal is refused: the identity is no longer in force"
                );
                return Err(AgentError::JoinRefused(why));
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(api: &str, ca_pem: Option<String>) -> AgentConfig {
        AgentConfig {
            api: api.to_owned(),
            node: None,
            join_token: "t".into(),
            role: AgentRole::Ramdisk,
            hostname: None,
            disks: vec![],
            image_keys: vec![],
            ca_pem,
            proxy: None,
            cache: None,
            heartbeat: Duration::from_secs(10),
            wipe_stripes: 0,
            state_dir: None,
            quorum_anchor: None,
            power_off: PowerOff::Exit,
        }
    }

    /// The control plane's URL comes from the network: a build that pins a
    /// CA never follows it to plain HTTP, in any spelling.
    #[test]
    fn a_build_that_pins_a_ca_speaks_only_https_through_it() {
        let ca = bcm_pki::tls::LocalTls::generate(&["127.0.0.1".into()])
            .expect("ca")
            .ca_pem;
        assert!(http_client(&cfg("https://10.0.0.1:8080", Some(ca.clone()))).is_ok());
        assert!(http_client(&cfg("HTTPS://10.0.0.1:8080", Some(ca.clone()))).is_ok());
        for api in ["http://10.0.0.1:8080", "HTTP://x", "ftp://x", ""] {
            assert!(http_client(&cfg(api, Some(ca.clone()))).is_err(), "{api}");
        }
        // Nothing pinned: plain HTTP only (loopback tests), never https
        // through the system's roots.
        assert!(http_client(&cfg("http://127.0.0.1:1", None)).is_ok());
        assert!(http_client(&cfg("https://10.0.0.1:8080", None)).is_err());
    }
}
