//! The native Redfish driver: hand-kept serde types for the few resources
//! used (service root, collections, `ComputerSystem`, `EthernetInterface`,
//! sessions, error bodies) and a client that follows links instead of
//! assuming paths.
//!
//! Choice (see ARCHITECTURE.md): hand-kept types rather than a generated
//! crate. They keep every `@odata.id`, accept unknown enum values as
//! strings, and cost nothing at build time.
//!
//! - The system is discovered from the service root's `Systems` collection;
//!   an address whose path names a system (`…/redfish/v1/Systems/<id>`)
//!   selects one of several (an emulator, a blade chassis).
//! - Session auth through `SessionService` (`X-Auth-Token`), falling back
//!   to basic auth when the BMC has no session service; a 401 on a session
//!   logs in again once.
//! - Requests retry with exponential backoff on 5xx, 409, 412, timeouts and
//!   connection errors; errors carry the BMC's `@Message.ExtendedInfo`.
//! - Power changes are asynchronous on real BMCs: after a `Reset` the
//!   driver polls `PowerState` until it matches or the timeout expires.
//! - Credentials go only to the enrolled BMC: a redirect to another origin
//!   (scheme, host, port) is not followed, and a link (`@odata.id`, a
//!   session's `Location`) that names another origin is not requested —
//!   a session login re-posted by a 307, or an `X-Auth-Token` (a header
//!   reqwest does not strip on a cross-host redirect), would hand them over.

use backon::{ExponentialBuilder, Retryable as _};
use reqwest::{Method, StatusCode, Url};
use secrecy::{ExposeSecret as _, SecretString};
use serde::Deserialize;
use serde_json::{json, Value};
use std::time::Duration;
use tokio::sync::Mutex;

use crate::driver::{BootDevice, BootMode, BootOverride, Inventory, Verified};
use crate::error::BmcError;
use bcm_core::{BmcTls, PowerAction, PowerState};

const DRIVER: bcm_core::BmcDriver = bcm_core::BmcDriver::Redfish;

/// Whether two URLs share scheme, host and port.
fn same_origin(a: &Url, b: &Url) -> bool {
    a.scheme() == b.scheme()
        && a.host_str() == b.host_str()
        && a.port_or_known_default() == b.port_or_known_default()
}

/// `scheme://host:port` of a URL, for messages (never its path or query).
fn origin_of(url: &Url) -> String {
    format!(
        "{}://{}:{}",
        url.scheme(),
        url.host_str().unwrap_or(""),
        url.port_or_known_default().unwrap_or(0)
    )
}

use crate::redfish_model::{
    cd_slot, pxe_macs, Chassis, Drive, EthernetInterface, Link, Manager, NetworkAdapter,
    NetworkDeviceFunction, NetworkInterface, NicFunction, Storage, Task, VirtualMedia,
};
use crate::redfish_vendor::Vendor;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ServiceRoot {
    redfish_version: Option<String>,
    vendor: Option<String>,
    oem: Option<serde_json::Map<String, Value>>,
    systems: Option<Link>,
    session_service: Option<Link>,
    account_service: Option<Link>,
    links: Option<RootLinks>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct AccountService {
    accounts: Option<Link>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ManagerAccount {
    #[serde(rename = "@odata.etag")]
    etag: Option<String>,
    user_name: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RootLinks {
    sessions: Option<Link>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Collection {
    #[serde(default)]
    members: Vec<Link>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ComputerSystem {
    #[serde(rename = "@odata.id")]
    odata_id: String,
    #[serde(rename = "@odata.etag")]
    etag: Option<String>,
    id: Option<String>,
    manufacturer: Option<String>,
    model: Option<String>,
    serial_number: Option<String>,
    #[serde(rename = "UUID")]
    uuid: Option<String>,
    power_state: Option<String>,
    boot: Option<Boot>,
    actions: Option<Actions>,
    ethernet_interfaces: Option<Link>,
    network_interfaces: Option<Link>,
    storage: Option<Link>,
    virtual_media: Option<Link>,
    links: Option<SystemLinks>,
    processor_summary: Option<ProcessorSummary>,
    memory_summary: Option<MemorySummary>,
    bios_version: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct SystemLinks {
    #[serde(default)]
    chassis: Vec<Link>,
    #[serde(default)]
    managed_by: Vec<Link>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Boot {
    boot_source_override_target: Option<String>,
    boot_source_override_enabled: Option<String>,
    boot_source_override_mode: Option<String>,
    #[serde(rename = "BootSourceOverrideTarget@Redfish.AllowableValues", default)]
    allowable_targets: Vec<String>,
    #[serde(rename = "BootSourceOverrideMode@Redfish.AllowableValues", default)]
    allowable_modes: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct Actions {
    #[serde(rename = "#ComputerSystem.Reset")]
    reset: Option<ResetAction>,
}

#[derive(Debug, Deserialize)]
struct ResetAction {
    target: String,
    #[serde(rename = "ResetType@Redfish.AllowableValues", default)]
    allowable: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ProcessorSummary {
    count: Option<u64>,
    model: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct MemorySummary {
    #[serde(rename = "TotalSystemMemoryGiB")]
    total_gib: Option<f64>,
}

/// The text of a Redfish error body: the `@Message.ExtendedInfo` messages,
/// else `error.message`.
fn error_text(body: &str) -> Option<String> {
    let v: Value = serde_json::from_str(body).ok()?;
    let err = v.get("error")?;
    let extended: Vec<&str> = err
        .get("@Message.ExtendedInfo")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|i| i.get("Message").and_then(Value::as_str))
                .collect()
        })
        .unwrap_or_default();
    if !extended.is_empty() {
        return Some(extended.join("; "));
    }
    err.get("message")
        .and_then(Value::as_str)
        .map(str::to_owned)
}

/// How the client authenticates.
#[derive(Debug, Clone)]
enum Auth {
    /// Not logged in yet.
    None,
    /// A session: its token and the session's URI (deleted at the end).
    Session { token: SecretString, uri: String },
    /// The BMC has no session service.
    Basic,
}

/// Timeouts and retries of the driver.
#[derive(Debug, Clone)]
pub struct RedfishSettings {
    /// Per request.
    pub request_timeout: Duration,
    /// Tries per request on transient errors.
    pub attempts: usize,
    /// First backoff between tries.
    pub backoff: Duration,
    /// How long to wait for `PowerState` to match after a reset.
    pub power_timeout: Duration,
    /// How long a graceful shutdown may take before a forced off.
    pub graceful_timeout: Duration,
    /// Between `PowerState` reads.
    pub power_poll: Duration,
    /// Accept any TLS certificate (only when configured so).
    pub insecure_tls: bool,
    /// Verify TLS against this CA (PEM) instead of the system roots.
    pub ca_pem: Option<Vec<u8>>,
}

impl Default for RedfishSettings {
    fn default() -> Self {
        Self {
            request_timeout: Duration::from_secs(30),
            attempts: 4,
            backoff: Duration::from_millis(250),
            power_timeout: Duration::from_secs(120),
            graceful_timeout: Duration::from_secs(60),
            power_poll: Duration::from_millis(500),
            insecure_tls: false,
            ca_pem: None,
        }
    }
}

/// Verifies against the CA bundle `pem` instead of the system roots.
fn with_ca(
    builder: reqwest::ClientBuilder,
    pem: &[u8],
) -> Result<reqwest::ClientBuilder, BmcError> {
    let certs = reqwest::Certificate::from_pem_bundle(pem)
        .map_err(|e| BmcError::Invalid(format!("BMC CA certificate: {e}")))?;
    if certs.is_empty() {
        return Err(BmcError::Invalid(
            "BMC CA certificate: no certificate in the PEM".into(),
        ));
    }
    let mut builder = builder.tls_built_in_root_certs(false);
    for c in certs {
        builder = builder.add_root_certificate(c);
    }
    Ok(builder)
}

/// A client for one BMC.
pub struct Redfish {
    http: reqwest::Client,
    /// `scheme://host:port`.
    origin: Url,
    /// The system path the address names, if it names one.
    system_hint: Option<String>,
    address: String,
    username: SecretString,
    password: SecretString,
    auth: Mutex<Auth>,
    /// The system's path once discovered.
    system_path: tokio::sync::OnceCell<String>,
    /// The BMC's vendor (found once per client): its quirks.
    vendor: tokio::sync::OnceCell<Vendor>,
    settings: RedfishSettings,
}

impl std::fmt::Debug for Redfish {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redfish")
            .field("address", &self.address)
            .finish_non_exhaustive()
    }
}

impl Redfish {
    /// A client for the BMC at `address` (`https://host[:port]`, optionally
    /// with the path of one system).
    pub fn new(
        address: &str,
        username: SecretString,
        password: SecretString,
        settings: RedfishSettings,
        tls: Option<&BmcTls>,
    ) -> Result<Self, BmcError> {
        let url = Url::parse(address)
            .map_err(|e| BmcError::Invalid(format!("BMC address {address:?}: {e}")))?;
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
            return Err(BmcError::Invalid(format!(
                "BMC address {address:?} must be http(s)://host[:port][/redfish/v1/Systems/<id>]"
            )));
        }
        let path = url.path().trim_end_matches('/');
        let system_hint = if path.is_empty() {
            None
        } else if path.starts_with("/redfish/v1/Systems/") {
            Some(path.to_owned())
        } else {
            return Err(BmcError::Invalid(format!(
                "BMC address {address:?}: a path must name a system (/redfish/v1/Systems/<id>)"
            )));
        };
        let mut origin = url.clone();
        origin.set_path("");
        origin.set_query(None);
        origin.set_fragment(None);
        let enrolled = origin.clone();
        let mut builder = reqwest::Client::builder()
            .timeout(settings.request_timeout)
            .connect_timeout(Duration::from_secs(10))
            .redirect(reqwest::redirect::Policy::custom(move |attempt| {
                if attempt.previous().len() >= 3 {
                    attempt.error("more than 3 redirects")
                } else if same_origin(attempt.url(), &enrolled) {
                    attempt.follow()
                } else {
                    let to = origin_of(attempt.url());
                    attempt.error(format!(
                        "the BMC redirected to another host ({to}); its credentials are sent only to the enrolled BMC"
                    ))
                }
            }));
        // The node's own policy wins over the service's setting.
        match tls {
            Some(BmcTls::Insecure {}) => builder = builder.danger_accept_invalid_certs(true),
            Some(BmcTls::Ca { ca_pem }) => builder = with_ca(builder, ca_pem.as_bytes())?,
            Some(BmcTls::Pinned { sha256 }) => {
                builder = builder.use_preconfigured_tls(crate::tls::pinned_config(sha256)?)
            }
            None => {
                if settings.insecure_tls {
                    builder = builder.danger_accept_invalid_certs(true);
                }
                if let Some(pem) = &settings.ca_pem {
                    builder = with_ca(builder, pem)?;
                }
            }
        }
        let http = builder
            .build()
            .map_err(|e| BmcError::Invalid(format!("HTTP client: {e}")))?;
        Ok(Self {
            http,
            origin,
            system_hint,
            address: address.to_owned(),
            username,
            password,
            auth: Mutex::new(Auth::None),
            system_path: tokio::sync::OnceCell::new(),
            vendor: tokio::sync::OnceCell::new(),
            settings,
        })
    }

    /// The URL of a link the BMC gave: on the enrolled BMC only.
    fn url(&self, path: &str) -> Result<Url, BmcError> {
        let url = self
            .origin
            .join(path)
            .map_err(|e| BmcError::Invalid(format!("BMC link {path:?}: {e}")))?;
        if !same_origin(&url, &self.origin) {
            return Err(BmcError::Invalid(format!(
                "{DRIVER} BMC at {}: a link to another host ({}) is not followed; its credentials are sent only to the enrolled BMC",
                self.address,
                origin_of(&url)
            )));
        }
        Ok(url)
    }

    fn unreachable(&self, e: &reqwest::Error) -> BmcError {
        if e.is_redirect() {
            // Not a network fault: retrying would be refused the same way.
            let mut cause: &dyn std::error::Error = e;
            while let Some(inner) = cause.source() {
                cause = inner;
            }
            return BmcError::Invalid(format!("{DRIVER} BMC at {}: {cause}", self.address));
        }
        // reqwest's Display of a connect error names the URL, never a header.
        let message = if e.is_timeout() {
            "timed out".to_owned()
        } else if e.is_connect() {
            // The innermost cause says why (refused, a TLS certificate the
            // policy rejects); none of them carries a header.
            let mut cause: &dyn std::error::Error = e;
            while let Some(inner) = cause.source() {
                cause = inner;
            }
            format!("connection failed: {cause}")
        } else {
            e.to_string()
        };
        BmcError::Unreachable {
            driver: DRIVER,
            address: self.address.clone(),
            message,
        }
    }

    /// An error status, named by the request that got it
    /// (`GET /redfish/v1/Systems: 404 Not Found`), with the BMC's own text.
    fn refused(&self, method: &Method, path: &str, status: StatusCode, body: &str) -> BmcError {
        let reason = status.canonical_reason().unwrap_or("error");
        let message = match error_text(body) {
            Some(text) => format!("{method} {path}: {} {reason}: {text}", status.as_u16()),
            None => format!("{method} {path}: {} {reason}", status.as_u16()),
        };
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            return BmcError::Unauthorized {
                driver: DRIVER,
                address: self.address.clone(),
                message,
            };
        }
        BmcError::Refused {
            driver: DRIVER,
            address: self.address.clone(),
            status: status.as_u16(),
            message,
        }
    }

    /// An answer that is not the resource the driver expected.
    fn unexpected<T>(&self, path: &str, e: &serde_json::Error) -> BmcError {
        BmcError::Invalid(format!(
            "{DRIVER} BMC at {}: GET {path}: expected {}, the answer does not read as one: {e}",
            self.address,
            expected::<T>()
        ))
    }

    /// Logs in: a session when the service offers one, else basic auth.
    async fn login(&self) -> Result<Auth, BmcError> {
        // The service root needs no credentials (Redfish spec): none are sent.
        let root: ServiceRoot = self
            .send_raw(Method::GET, "/redfish/v1/", None, &Auth::None)
            .await?;
        let sessions = root
            .links
            .and_then(|l| l.sessions)
            .map(|l| l.id)
            .or_else(|| {
                root.session_service
                    .map(|_| "/redfish/v1/SessionService/Sessions".to_owned())
            });
        let Some(sessions) = sessions else {
            return Ok(Auth::Basic);
        };
        let body = json!({
            "UserName": self.username.expose_secret(),
            "Password": self.password.expose_secret(),
        });
        let res = self
            .http
            .post(self.url(&sessions)?)
            .json(&body)
            .send()
            .await
            .map_err(|e| self.unreachable(&e))?;
        let status = res.status();
        if status.is_success() {
            let token = res
                .headers()
                .get("X-Auth-Token")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let uri = res
                .headers()
                .get(reqwest::header::LOCATION)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
                .unwrap_or_default();
            return Ok(match token {
                Some(t) => Auth::Session {
                    token: t.into(),
                    uri,
                },
                None => Auth::Basic,
            });
        }
        let text = res.text().await.unwrap_or_default();
        match status {
            // No session service after all: basic auth.
            StatusCode::NOT_FOUND
            | StatusCode::METHOD_NOT_ALLOWED
            | StatusCode::NOT_IMPLEMENTED => Ok(Auth::Basic),
            _ => Err(self.refused(&Method::POST, &sessions, status, &text)),
        }
    }

    async fn current_auth(&self) -> Result<Auth, BmcError> {
        let mut auth = self.auth.lock().await;
        if matches!(*auth, Auth::None) {
            *auth = self.login().await?;
        }
        Ok(auth.clone())
    }

    /// One request with the given auth, no retries.
    async fn send_raw<T: serde::de::DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        auth: &Auth,
    ) -> Result<T, BmcError> {
        let text = self.send_text(method, path, body, auth).await?;
        let text = if text.trim().is_empty() {
            "null".to_owned()
        } else {
            text
        };
        serde_json::from_str(&text).map_err(|e| self.unexpected::<T>(path, &e))
    }

    async fn send_text(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        auth: &Auth,
    ) -> Result<String, BmcError> {
        self.send_text_if_match(method, path, body, auth, None)
            .await
    }

    async fn send_text_if_match(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        auth: &Auth,
        if_match: Option<&str>,
    ) -> Result<String, BmcError> {
        let mut req = self
            .http
            .request(method.clone(), self.url(path)?)
            .header(reqwest::header::ACCEPT, "application/json");
        if let Some(etag) = if_match {
            req = req.header(reqwest::header::IF_MATCH, etag);
        }
        req = match auth {
            Auth::Session { token, .. } => req.header("X-Auth-Token", token.expose_secret()),
            Auth::Basic => req.basic_auth(
                self.username.expose_secret(),
                Some(self.password.expose_secret()),
            ),
            Auth::None => req,
        };
        if let Some(b) = body {
            req = req.json(b);
        }
        let res = req.send().await.map_err(|e| self.unreachable(&e))?;
        let status = res.status();
        let text = res.text().await.map_err(|e| self.unreachable(&e))?;
        if !status.is_success() {
            return Err(self.refused(&method, path, status, &text));
        }
        Ok(text)
    }

    /// A request with auth (re-login once on a 401 of a stale session) and
    /// retries with backoff on transient errors.
    async fn request_text(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<String, BmcError> {
        self.request_text_if_match(method, path, body, None).await
    }

    async fn request_text_if_match(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        if_match: Option<&str>,
    ) -> Result<String, BmcError> {
        let once = || async {
            let auth = self.current_auth().await?;
            match self
                .send_text_if_match(method.clone(), path, body, &auth, if_match)
                .await
            {
                Err(BmcError::Unauthorized { .. }) if matches!(auth, Auth::Session { .. }) => {
                    // The session expired: log in again, once.
                    let fresh = self.login().await?;
                    *self.auth.lock().await = fresh.clone();
                    self.send_text_if_match(method.clone(), path, body, &fresh, if_match)
                        .await
                }
                other => other,
            }
        };
        once.retry(
            ExponentialBuilder::default()
                .with_min_delay(self.settings.backoff)
                .with_max_delay(self.settings.backoff * 16)
                .with_max_times(self.settings.attempts.saturating_sub(1))
                .with_jitter(),
        )
        .when(BmcError::retryable)
        .notify(|e, after| tracing::debug!(address = %self.address, error = %e, ?after, "retrying a Redfish request"))
        .await
    }

    async fn get<T: serde::de::DeserializeOwned>(&self, path: &str) -> Result<T, BmcError> {
        let text = self.request_text(Method::GET, path, None).await?;
        serde_json::from_str(&text).map_err(|e| self.unexpected::<T>(path, &e))
    }

    /// Ends the session, if there is one (best effort).
    pub async fn logout(&self) {
        let auth = std::mem::replace(&mut *self.auth.lock().await, Auth::None);
        if let Auth::Session { uri, .. } = &auth {
            if !uri.is_empty() {
                let _ = self.send_text(Method::DELETE, uri, None, &auth).await;
            }
        }
    }

    /// The system this client manages: the address's, or the only member
    /// of the service root's `Systems` (found once per client).
    async fn system(&self) -> Result<ComputerSystem, BmcError> {
        let path = self
            .system_path
            .get_or_try_init(|| self.discover_system())
            .await?;
        self.get(path).await
    }

    async fn discover_system(&self) -> Result<String, BmcError> {
        let root: ServiceRoot = self.get("/redfish/v1/").await?;
        let systems = root.systems.ok_or_else(|| {
            BmcError::Unsupported(format!(
                "{DRIVER} BMC at {} has no Systems collection",
                self.address
            ))
        })?;
        let members = Collection {
            members: self.members(&systems.id).await?,
        };
        let path = match &self.system_hint {
            Some(hint) => members
                .members
                .iter()
                .find(|m| m.id.trim_end_matches('/') == hint)
                .map(|m| m.id.clone())
                .ok_or_else(|| {
                    BmcError::Invalid(format!("{DRIVER} BMC at {}: no system {hint} in {}", self.address, systems.id))
                })?,
            None => match members.members.as_slice() {
                [one] => one.id.clone(),
                many => {
                    return Err(BmcError::Invalid(format!(
                        "{DRIVER} BMC at {} manages {} systems; name one in the address (…/redfish/v1/Systems/<id>)",
                        self.address,
                        many.len()
                    )))
                }
            },
        };
        Ok(path)
    }

    /// Checks the credentials and finds the system.
    pub async fn verify(&self) -> Result<Verified, BmcError> {
        let root: ServiceRoot = self.get("/redfish/v1/").await?;
        let sys = self.system().await?;
        Ok(Verified {
            protocol_version: root.redfish_version,
            system_id: sys.id.clone().unwrap_or_else(|| sys.odata_id.clone()),
            power: parse_power(sys.power_state.as_deref()),
            sim: false,
        })
    }

    /// Out-of-band inspection: vendor, model, serial, UUID, CPUs, memory,
    /// drives, and the MACs the machine boots from (`redfish_model`).
    pub async fn inspect(&self) -> Result<Inventory, BmcError> {
        let sys = self.system().await?;
        let mut interfaces = vec![];
        if let Some(link) = &sys.ethernet_interfaces {
            for m in self.members(&link.id).await? {
                let nic: EthernetInterface = self.get(&m.id).await?;
                interfaces.extend(nic.mac());
            }
        }
        // The adapters' functions say which NICs boot; when the interfaces
        // already named NICs, an adapter tree the BMC cannot serve costs
        // only that ordering.
        let functions = match self.network_functions(&sys).await {
            Ok(f) => f,
            Err(e) if !interfaces.is_empty() => {
                tracing::warn!(address = %self.address, error = %e, "network adapters unreadable; the EthernetInterfaces MACs stand");
                vec![]
            }
            Err(e) => return Err(e),
        };
        let macs = pxe_macs(&interfaces, &functions);
        if macs.is_empty() {
            tracing::info!(address = %self.address, system = %sys.odata_id, "no NIC in EthernetInterfaces, NetworkInterfaces or the chassis' NetworkAdapters");
        }
        // Drives are what the BMC can tell; the ramdisk's inventory is the
        // one a wipe is checked against, so a BMC without a readable
        // Storage tree reports none rather than failing enrollment.
        let drives = self.drives(&sys).await.unwrap_or_else(|e| {
            tracing::warn!(address = %self.address, error = %e, "drives unreadable out of band");
            vec![]
        });
        let bmc_firmware = self.bmc_firmware(&sys).await;
        Ok(Inventory {
            manufacturer: sys.manufacturer,
            model: sys.model,
            serial: sys.serial_number,
            uuid: sys.uuid,
            cpus: sys.processor_summary.as_ref().and_then(|p| p.count),
            cpu_model: sys.processor_summary.and_then(|p| p.model),
            memory_gib: sys.memory_summary.and_then(|m| m.total_gib),
            macs,
            drives,
            bios_version: sys.bios_version,
            bmc_firmware,
            sim: false,
        })
    }

    /// The firmware version of the system's first manager that reports
    /// one (`Links.ManagedBy`); `None`, logged, when none can be read.
    async fn bmc_firmware(&self, sys: &ComputerSystem) -> Option<String> {
        for m in sys.links.iter().flat_map(|l| &l.managed_by) {
            match self.get_optional::<Manager>(&m.id).await {
                Ok(Some(Manager {
                    firmware_version: Some(v),
                    ..
                })) => return Some(v),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(address = %self.address, manager = %m.id, error = %e, "the BMC's firmware version is unreadable");
                }
            }
        }
        None
    }

    /// A collection's members.
    async fn members(&self, path: &str) -> Result<Vec<Link>, BmcError> {
        Ok(self.get::<Collection>(path).await?.members)
    }

    /// A resource a link names that may be gone: a 404 is `None` (logged),
    /// anything else an error.
    async fn get_optional<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
    ) -> Result<Option<T>, BmcError> {
        match self.get(path).await {
            Ok(v) => Ok(Some(v)),
            Err(BmcError::Refused { status: 404, .. }) => {
                tracing::warn!(address = %self.address, path, "a linked resource answers 404; skipped");
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// The Ethernet functions of the system's network adapters: through
    /// its `NetworkInterfaces` (each links its adapter), else through the
    /// adapters of the chassis it links.
    async fn network_functions(&self, sys: &ComputerSystem) -> Result<Vec<NicFunction>, BmcError> {
        let mut function_lists: Vec<String> = vec![];
        if let Some(link) = &sys.network_interfaces {
            for m in self.members(&link.id).await? {
                let Some(ni) = self.get_optional::<NetworkInterface>(&m.id).await? else {
                    continue;
                };
                let adapter = ni.links.and_then(|l| l.network_adapter);
                let list = match adapter {
                    Some(a) => self
                        .get_optional::<NetworkAdapter>(&a.id)
                        .await?
                        .and_then(|a| a.network_device_functions),
                    None => None,
                }
                .or(ni.network_device_functions);
                function_lists.extend(list.map(|l| l.id));
            }
        }
        if function_lists.is_empty() {
            for c in sys.links.iter().flat_map(|l| &l.chassis) {
                let Some(adapters) = self
                    .get_optional::<Chassis>(&c.id)
                    .await?
                    .and_then(|c| c.network_adapters)
                else {
                    continue;
                };
                for a in self.members(&adapters.id).await? {
                    if let Some(list) = self
                        .get_optional::<NetworkAdapter>(&a.id)
                        .await?
                        .and_then(|a| a.network_device_functions)
                    {
                        function_lists.push(list.id);
                    }
                }
            }
        }
        let mut out = vec![];
        function_lists.dedup();
        for list in function_lists {
            for f in self.members(&list).await? {
                if let Some(nic) = self
                    .get_optional::<NetworkDeviceFunction>(&f.id)
                    .await?
                    .and_then(|f| f.nic())
                {
                    out.push(nic);
                }
            }
        }
        Ok(out)
    }

    /// The drives of the system's `Storage` controllers.
    async fn drives(
        &self,
        sys: &ComputerSystem,
    ) -> Result<Vec<bcm_contracts::outputs::OobDrive>, BmcError> {
        let Some(link) = &sys.storage else {
            return Ok(vec![]);
        };
        let mut out = vec![];
        for controller in self.members(&link.id).await? {
            let Some(storage) = self.get_optional::<Storage>(&controller.id).await? else {
                continue;
            };
            for d in storage.drives {
                if let Some(drive) = self.get_optional::<Drive>(&d.id).await? {
                    out.extend(drive.summary(&d.id));
                }
            }
        }
        Ok(out)
    }

    /// Sets the password of the account this client logs in with, through
    /// the service root's `AccountService`: the account is found by
    /// `UserName` among `Accounts` and PATCHed with `If-Match` on its ETag
    /// (re-read once if another writer changed it meanwhile).
    pub async fn set_password(&self, new: &SecretString) -> Result<(), BmcError> {
        let root: ServiceRoot = self.get("/redfish/v1/").await?;
        let service = root.account_service.ok_or_else(|| {
            BmcError::Unsupported(format!(
                "{DRIVER} BMC at {} has no AccountService",
                self.address
            ))
        })?;
        let service: AccountService = self.get(&service.id).await?;
        let accounts = service.accounts.ok_or_else(|| {
            BmcError::Unsupported(format!(
                "{DRIVER} BMC at {}: AccountService has no Accounts",
                self.address
            ))
        })?;
        let members: Collection = self.get(&accounts.id).await?;
        let mut found = None;
        for m in members.members {
            let account: ManagerAccount = self.get(&m.id).await?;
            if account.user_name.as_deref() == Some(self.username.expose_secret()) {
                found = Some(m.id);
                break;
            }
        }
        let path = found.ok_or_else(|| {
            BmcError::Invalid(format!(
                "{DRIVER} BMC at {}: no account in {} has this username",
                self.address, accounts.id
            ))
        })?;
        let body = json!({ "Password": new.expose_secret() });
        let mut tries = 0;
        loop {
            let account: ManagerAccount = self.get(&path).await?;
            match self
                .request_text_if_match(Method::PATCH, &path, Some(&body), account.etag.as_deref())
                .await
            {
                Err(BmcError::Refused { status: 412, .. }) if tries == 0 => tries += 1,
                other => return other.map(|_| ()),
            }
        }
    }

    /// The power state as the BMC reports it now.
    pub async fn power_state(&self) -> Result<PowerState, BmcError> {
        Ok(parse_power(self.system().await?.power_state.as_deref()))
    }

    async fn reset(&self, sys: &ComputerSystem, reset_type: &str) -> Result<(), BmcError> {
        let action = sys
            .actions
            .as_ref()
            .and_then(|a| a.reset.as_ref())
            .ok_or_else(|| {
                BmcError::Unsupported(format!(
                    "{DRIVER} BMC at {} offers no ComputerSystem.Reset",
                    self.address
                ))
            })?;
        if !action.allowable.is_empty() && !action.allowable.iter().any(|v| v == reset_type) {
            return Err(BmcError::Unsupported(format!(
                "{DRIVER} BMC at {} does not allow ResetType {reset_type} (allows {})",
                self.address,
                action.allowable.join(", ")
            )));
        }
        self.request_text(
            Method::POST,
            &action.target,
            Some(&json!({ "ResetType": reset_type })),
        )
        .await?;
        Ok(())
    }

    fn allows(sys: &ComputerSystem, reset_type: &str) -> bool {
        sys.actions
            .as_ref()
            .and_then(|a| a.reset.as_ref())
            .is_some_and(|a| a.allowable.is_empty() || a.allowable.iter().any(|v| v == reset_type))
    }

    /// Polls `PowerState` until it reads `want` or `within` passes.
    async fn await_power(&self, want: PowerState, within: Duration) -> Result<bool, BmcError> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if self.power_state().await? == want {
                return Ok(true);
            }
            if tokio::time::Instant::now() >= deadline {
                return Ok(false);
            }
            tokio::time::sleep(self.settings.power_poll).await;
        }
    }

    fn power_timeout(&self, action: &str, want: PowerState) -> BmcError {
        BmcError::Timeout {
            driver: DRIVER,
            address: self.address.clone(),
            message: format!(
                "{action}: PowerState did not read {want} within {} s",
                self.settings.power_timeout.as_secs()
            ),
        }
    }

    /// Applies a power action and waits until `PowerState` matches.
    /// Returns the state read at the end.
    pub async fn power(&self, action: PowerAction) -> Result<PowerState, BmcError> {
        let sys = self.system().await?;
        let now = parse_power(sys.power_state.as_deref());
        let timeout = self.settings.power_timeout;
        match action {
            PowerAction::On => {
                if now != PowerState::On {
                    self.reset(&sys, "On").await?;
                }
                self.ensure(PowerState::On, "On", timeout).await
            }
            PowerAction::Off => {
                if now == PowerState::Off {
                    return Ok(PowerState::Off);
                }
                // Graceful first when the BMC offers it, then forced.
                if Self::allows(&sys, "GracefulShutdown") {
                    self.reset(&sys, "GracefulShutdown").await?;
                    if self
                        .await_power(PowerState::Off, self.settings.graceful_timeout)
                        .await?
                    {
                        return Ok(PowerState::Off);
                    }
                    tracing::info!(address = %self.address, "graceful shutdown timed out; forcing off");
                }
                self.reset(&sys, "ForceOff").await?;
                self.ensure(PowerState::Off, "ForceOff", timeout).await
            }
            PowerAction::Cycle => {
                if now == PowerState::Off {
                    self.reset(&sys, "On").await?;
                } else if Self::allows(&sys, "PowerCycle") {
                    self.reset(&sys, "PowerCycle").await?;
                } else {
                    self.reset(&sys, "ForceOff").await?;
                    if !self.await_power(PowerState::Off, timeout).await? {
                        return Err(self.power_timeout("ForceOff", PowerState::Off));
                    }
                    self.reset(&sys, "On").await?;
                }
                self.ensure(PowerState::On, "cycle", timeout).await
            }
            PowerAction::Reset => {
                if now == PowerState::Off {
                    self.reset(&sys, "On").await?;
                } else {
                    self.reset(&sys, "ForceRestart").await?;
                }
                self.ensure(PowerState::On, "ForceRestart", timeout).await
            }
        }
    }

    async fn ensure(
        &self,
        want: PowerState,
        action: &str,
        within: Duration,
    ) -> Result<PowerState, BmcError> {
        if self.await_power(want, within).await? {
            Ok(want)
        } else {
            Err(self.power_timeout(action, want))
        }
    }

    /// The BMC's vendor, for its quirks (`redfish_vendor`).
    async fn vendor(&self, sys: &ComputerSystem) -> Result<Vendor, BmcError> {
        self.vendor
            .get_or_try_init(|| async {
                let root: ServiceRoot = self.get("/redfish/v1/").await?;
                let oem: Vec<&str> = root
                    .oem
                    .as_ref()
                    .map(|o| o.keys().map(String::as_str).collect())
                    .unwrap_or_default();
                let vendor =
                    Vendor::detect(root.vendor.as_deref(), &oem, sys.manufacturer.as_deref());
                tracing::debug!(address = %self.address, ?vendor, "Redfish vendor");
                Ok(vendor)
            })
            .await
            .copied()
    }

    /// Sets the boot override and reads it back.
    pub async fn boot(
        &self,
        device: BootDevice,
        persistent: bool,
        mode: Option<BootMode>,
    ) -> Result<BootOverride, BmcError> {
        let sys = self.system().await?;
        let target = match device {
            BootDevice::Pxe => "Pxe",
            BootDevice::Disk => "Hdd",
            BootDevice::UefiHttp => "UefiHttp",
            BootDevice::Cd => "Cd",
        };
        if let Some(b) = &sys.boot {
            if !b.allowable_targets.is_empty() && !b.allowable_targets.iter().any(|t| t == target) {
                return Err(BmcError::Unsupported(format!(
                    "{DRIVER} BMC at {} cannot boot from {target} (allows {})",
                    self.address,
                    b.allowable_targets.join(", ")
                )));
            }
        }
        let quirks = self.vendor(&sys).await?.quirks();
        let enabled = if persistent { "Continuous" } else { "Once" };
        let mut boot = json!({
            "BootSourceOverrideTarget": target,
            "BootSourceOverrideEnabled": enabled,
        });
        let current_mode = sys
            .boot
            .as_ref()
            .and_then(|b| b.boot_source_override_mode.clone());
        let mode = match mode {
            Some(BootMode::Uefi) => Some("UEFI".to_owned()),
            Some(BootMode::Legacy) => Some("Legacy".to_owned()),
            None if quirks.boot_patch_keeps_mode => current_mode,
            None => None,
        };
        if let Some(m) = mode {
            if let Some(b) = sys.boot.as_ref().filter(|b| !b.allowable_modes.is_empty()) {
                if !b.allowable_modes.contains(&m) {
                    return Err(BmcError::Unsupported(format!(
                        "{DRIVER} BMC at {}: {} does not allow BootSourceOverrideMode {m} (allows {})",
                        self.address,
                        sys.odata_id,
                        b.allowable_modes.join(", ")
                    )));
                }
            }
            boot["BootSourceOverrideMode"] = json!(m);
        }
        let if_match = sys.etag.as_deref().filter(|_| quirks.patch_if_match);
        self.request_text_if_match(
            Method::PATCH,
            &sys.odata_id,
            Some(&json!({ "Boot": boot })),
            if_match,
        )
        .await?;
        let after: ComputerSystem = self.get(&sys.odata_id).await?;
        let read = after.boot.unwrap_or(Boot {
            boot_source_override_target: None,
            boot_source_override_enabled: None,
            boot_source_override_mode: None,
            allowable_targets: vec![],
            allowable_modes: vec![],
        });
        if read.boot_source_override_target.as_deref() != Some(target) {
            return Err(BmcError::Refused {
                driver: DRIVER,
                address: self.address.clone(),
                status: 200,
                message: format!(
                    "boot override read back {:?}, not {target}",
                    read.boot_source_override_target
                ),
            });
        }
        Ok(BootOverride {
            device,
            persistent,
            sim: false,
            target: target.to_owned(),
            enabled_requested: enabled.to_owned(),
            enabled_read_back: read.boot_source_override_enabled,
            mode_read_back: read.boot_source_override_mode,
        })
    }
}

impl Redfish {
    /// The system's virtual media slots: its own `VirtualMedia` (iDRAC 6+,
    /// XCC, the standard since 2021.2), else its managers' (iLO 5,
    /// Supermicro). A BMC with neither offers none: `unsupported`.
    async fn media_slots(&self, sys: &ComputerSystem) -> Result<Vec<VirtualMedia>, BmcError> {
        let mut list = sys.virtual_media.as_ref().map(|l| l.id.clone());
        if list.is_none() {
            for m in sys.links.iter().flat_map(|l| &l.managed_by) {
                if let Some(v) = self
                    .get_optional::<Manager>(&m.id)
                    .await?
                    .and_then(|m| m.virtual_media)
                {
                    list = Some(v.id);
                    break;
                }
            }
        }
        let Some(list) = list else {
            return Err(BmcError::Unsupported(format!(
                "{DRIVER} BMC at {}: {} offers no virtual media (no VirtualMedia on the system or its managers)",
                self.address, sys.odata_id
            )));
        };
        let mut slots = vec![];
        for m in self.members(&list).await? {
            slots.extend(self.get_optional::<VirtualMedia>(&m.id).await?);
        }
        Ok(slots)
    }

    /// The CD/DVD slot, or `unsupported` naming what the BMC offers.
    async fn cd(&self, sys: &ComputerSystem) -> Result<VirtualMedia, BmcError> {
        let mut slots = self.media_slots(sys).await?;
        let Some(i) = cd_slot(&slots) else {
            let offered: Vec<&str> = slots
                .iter()
                .flat_map(|s| s.media_types.iter().map(String::as_str))
                .collect();
            return Err(BmcError::Unsupported(format!(
                "{DRIVER} BMC at {}: no CD or DVD virtual media slot (offers {})",
                self.address,
                if offered.is_empty() {
                    "none".to_owned()
                } else {
                    offered.join(", ")
                }
            )));
        };
        Ok(slots.swap_remove(i))
    }

    /// Inserts `image` (an http(s) URL the BMC fetches) into the CD/DVD
    /// slot, write-protected, and reads it back. A slot that already holds
    /// the image is left as it is, so a retried insert changes nothing; a
    /// slot holding another image is ejected first. The `InsertMedia`
    /// action where the slot has one, else a PATCH of `Image` and
    /// `Inserted` (with `If-Match` where the vendor needs it).
    pub async fn insert_media(&self, image: &str) -> Result<MediaState, BmcError> {
        check_media_url(image)?;
        let sys = self.system().await?;
        let quirks = self.vendor(&sys).await?.quirks();
        let mut slot = self.cd(&sys).await?;
        if slot.holds(image) {
            return Ok(MediaState::of(&slot));
        }
        if !slot.is_empty() {
            self.eject_slot(&slot, quirks.patch_if_match).await?;
            slot = self.get(&slot.odata_id).await?;
        }
        let body = json!({"Image": image, "Inserted": true, "WriteProtected": true});
        match &slot.actions.insert {
            Some(action) => {
                self.request_text(Method::POST, &action.target, Some(&body))
                    .await?;
            }
            None => {
                let if_match = slot.etag.as_deref().filter(|_| quirks.patch_if_match);
                self.request_text_if_match(Method::PATCH, &slot.odata_id, Some(&body), if_match)
                    .await?;
            }
        }
        let after: VirtualMedia = self.get(&slot.odata_id).await?;
        if !after.holds(image) {
            return Err(BmcError::Refused {
                driver: DRIVER,
                address: self.address.clone(),
                status: 200,
                message: format!(
                    "{} read back Image {:?} Inserted {:?} after inserting {image}",
                    after.odata_id, after.image, after.inserted
                ),
            });
        }
        Ok(MediaState::of(&after))
    }

    /// Ejects whatever the CD/DVD slot holds and reads it back empty; an
    /// empty slot is left as it is.
    pub async fn eject_media(&self) -> Result<MediaState, BmcError> {
        let sys = self.system().await?;
        let quirks = self.vendor(&sys).await?.quirks();
        let slot = self.cd(&sys).await?;
        if slot.is_empty() {
            return Ok(MediaState::of(&slot));
        }
        self.eject_slot(&slot, quirks.patch_if_match).await?;
        let after: VirtualMedia = self.get(&slot.odata_id).await?;
        if !after.is_empty() {
            return Err(BmcError::Refused {
                driver: DRIVER,
                address: self.address.clone(),
                status: 200,
                message: format!(
                    "{} still holds {:?} after the eject",
                    after.odata_id, after.image
                ),
            });
        }
        Ok(MediaState::of(&after))
    }

    /// Erases every present drive of the system's `Storage` through the
    /// BMC's `#Drive.SecureErase` (the drive picks the method). A drive
    /// without the action is reported not erased; a BMC none of whose
    /// drives offers it is reported `offered: false` and nothing is sent.
    /// An erase answered with a `Task` is followed until the task ends.
    pub async fn erase_drives(&self) -> Result<bcm_contracts::outputs::DiskEraseReport, BmcError> {
        use bcm_contracts::outputs::{DiskEraseReport, DriveErase};
        let sys = self.system().await?;
        // Nothing is sent until every drive is known: a Storage tree the
        // BMC cannot serve (sushy-tools without storage configured answers
        // 500) is a BMC that offers no erase, said with the reason.
        let drives = match self.erasable_drives(&sys).await {
            Ok(d) => d,
            Err(e) => {
                return Ok(DiskEraseReport {
                    offered: false,
                    drives: vec![],
                    reason: Some(format!("the BMC's Storage cannot be read: {e}")),
                    sim: false,
                })
            }
        };
        if !drives.iter().any(|(_, d)| d.actions.secure_erase.is_some()) {
            return Ok(DiskEraseReport {
                offered: false,
                drives: vec![],
                reason: Some(if drives.is_empty() {
                    "the BMC reports no drive".to_owned()
                } else {
                    format!(
                        "none of the BMC's {} drives offers #Drive.SecureErase",
                        drives.len()
                    )
                }),
                sim: false,
            });
        }
        let mut out = vec![];
        for (path, drive) in drives {
            let Some(summary) = drive.summary(&path) else {
                continue;
            };
            let (erased, reason) = match &drive.actions.secure_erase {
                None => (
                    false,
                    Some("the drive offers no #Drive.SecureErase".to_owned()),
                ),
                Some(action) => match self.secure_erase(&action.target).await {
                    Ok(()) => (true, None),
                    Err(e) => (false, Some(e.to_string())),
                },
            };
            tracing::info!(address = %self.address, drive = %summary.id, erased, "BMC drive erase");
            out.push(DriveErase {
                id: summary.id,
                serial: summary.serial,
                erased,
                reason,
            });
        }
        Ok(DiskEraseReport {
            offered: true,
            drives: out,
            reason: None,
            sim: false,
        })
    }

    /// The present drives of the system's `Storage`, with their paths.
    async fn erasable_drives(
        &self,
        sys: &ComputerSystem,
    ) -> Result<Vec<(String, Drive)>, BmcError> {
        let mut drives = vec![];
        let Some(link) = &sys.storage else {
            return Ok(drives);
        };
        for controller in self.members(&link.id).await? {
            let Some(storage) = self.get_optional::<Storage>(&controller.id).await? else {
                continue;
            };
            for d in storage.drives {
                if let Some(drive) = self.get_optional::<Drive>(&d.id).await? {
                    if drive.summary(&d.id).is_some() {
                        drives.push((d.id.clone(), drive));
                    }
                }
            }
        }
        Ok(drives)
    }

    /// One `#Drive.SecureErase`, followed to its end when the BMC answers
    /// with a `Task` (polled every second, for up to an hour).
    async fn secure_erase(&self, target: &str) -> Result<(), BmcError> {
        let text = self
            .request_text(Method::POST, target, Some(&json!({})))
            .await?;
        let Ok(mut task) = serde_json::from_str::<Task>(&text) else {
            return Ok(());
        };
        let Some(monitor) = task.odata_id.clone() else {
            return Ok(());
        };
        for _ in 0..3_600 {
            if task.task_state.is_none() || task.ended() {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
            task = self.get(&monitor).await?;
        }
        if task.task_state.is_none() || task.completed() {
            Ok(())
        } else {
            Err(BmcError::Refused {
                driver: DRIVER,
                address: self.address.clone(),
                status: 200,
                message: format!(
                    "{monitor}: the erase task ended {:?} {}",
                    task.task_state,
                    serde_json::Value::Array(task.messages.clone())
                ),
            })
        }
    }

    async fn eject_slot(&self, slot: &VirtualMedia, if_match: bool) -> Result<(), BmcError> {
        match &slot.actions.eject {
            Some(action) => {
                self.request_text(Method::POST, &action.target, Some(&json!({})))
                    .await?;
            }
            None => {
                let etag = slot.etag.as_deref().filter(|_| if_match);
                self.request_text_if_match(
                    Method::PATCH,
                    &slot.odata_id,
                    Some(&json!({"Image": null, "Inserted": false})),
                    etag,
                )
                .await?;
            }
        }
        Ok(())
    }
}

/// A virtual media slot as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MediaState {
    /// The slot's resource (`/redfish/v1/Managers/1/VirtualMedia/2`).
    pub slot: String,
    pub image: Option<String>,
    pub inserted: bool,
}

impl MediaState {
    fn of(v: &VirtualMedia) -> MediaState {
        MediaState {
            slot: v.odata_id.clone(),
            image: v.image.clone().filter(|i| !i.is_empty()),
            inserted: v.inserted == Some(true),
        }
    }
}

/// An image a BMC is told to fetch: an http or https URL of at most 2048
/// printable characters without spaces.
fn check_media_url(image: &str) -> Result<(), BmcError> {
    let url_ok = reqwest::Url::parse(image)
        .is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some());
    if url_ok && image.len() <= 2048 && image.chars().all(|c| c.is_ascii_graphic()) {
        Ok(())
    } else {
        Err(BmcError::Invalid(format!(
            "a virtual media image is an http(s) URL with a host, at most 2048 printable characters: {:?}",
            image.chars().take(80).collect::<String>()
        )))
    }
}

/// What a resource type is called in an error: its Redfish name.
fn expected<T>() -> &'static str {
    let full = std::any::type_name::<T>();
    match full.rsplit("::").next().unwrap_or(full) {
        "Collection" => "a resource collection (Members)",
        "ServiceRoot" => "the Redfish service root",
        "ComputerSystem" => "a ComputerSystem",
        "AccountService" => "an AccountService",
        "ManagerAccount" => "a ManagerAccount",
        "EthernetInterface" => "an EthernetInterface",
        "NetworkDeviceFunction" => "a NetworkDeviceFunction",
        "NetworkInterface" => "a NetworkInterface",
        "Chassis" => "a Chassis",
        "Manager" => "a Manager",
        "VirtualMedia" => "a VirtualMedia slot",
        "Value" => "a JSON document",
        other => other,
    }
}

fn parse_power(s: Option<&str>) -> PowerState {
    match s {
        Some("On") | Some("PoweringOff") => PowerState::On,
        Some("Off") | Some("PoweringOn") => PowerState::Off,
        _ => PowerState::Unknown,
    }
}

/// Lower-case, colon-separated MAC; `None` for anything else.
pub fn normalize_mac(s: &str) -> Option<String> {
    let hex: String = s.chars().filter(|c| c.is_ascii_hexdigit()).collect();
    let seps = s.chars().filter(|c| matches!(c, ':' | '-' | '.')).count();
    if hex.len() != 12 || hex.len() + seps != s.len() {
        return None;
    }
    let hex = hex.to_ascii_lowercase();
    Some(
        (0..6)
            .map(|i| &hex[i * 2..i * 2 + 2])
            .collect::<Vec<_>>()
            .join(":"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extended_info_messages_become_the_error_text() {
        let body = r#"{"error":{"code":"Base.1.0.GeneralError","message":"A general error has occurred.",
            "@Message.ExtendedInfo":[{"MessageId":"Base.1.8.PropertyValueNotInList","Message":"The value Floppy for the property BootSourceOverrideTarget is not in the list of acceptable values."}]}}"#;
        assert_eq!(
            error_text(body).as_deref(),
            Some("The value Floppy for the property BootSourceOverrideTarget is not in the list of acceptable values.")
        );
        assert_eq!(
            error_text(r#"{"error":{"message":"nope"}}"#).as_deref(),
            Some("nope")
        );
        assert_eq!(error_text("<html>"), None);
    }

    #[test]
    fn macs_are_normalized_or_refused() {
        assert_eq!(
            normalize_mac("52:54:00:AB:cd:01").as_deref(),
            Some("52:54:00:ab:cd:01")
        );
        assert_eq!(
            normalize_mac("52-54-00-ab-cd-01").as_deref(),
            Some("52:54:00:ab:cd:01")
        );
        assert_eq!(
            normalize_mac("5254.00ab.cd01").as_deref(),
            Some("52:54:00:ab:cd:01")
        );
        assert_eq!(normalize_mac("52:54:00:ab:cd"), None);
        assert_eq!(normalize_mac("zz:54:00:ab:cd:01"), None);
        assert_eq!(normalize_mac(""), None);
    }

    #[test]
    fn addresses_name_a_bmc_or_one_of_its_systems() {
        let s = || SecretString::from("x".to_owned());
        let r = Redfish::new(
            "https://10.0.0.10",
            s(),
            s(),
            RedfishSettings::default(),
            None,
        )
        .expect("plain");
        assert_eq!(r.system_hint, None);
        let r = Redfish::new(
            "http://127.0.0.1:8000/redfish/v1/Systems/abc/",
            s(),
            s(),
            RedfishSettings::default(),
            None,
        )
        .expect("with a system");
        assert_eq!(r.system_hint.as_deref(), Some("/redfish/v1/Systems/abc"));
        assert!(Redfish::new("ftp://x", s(), s(), RedfishSettings::default(), None).is_err());
        assert!(Redfish::new(
            "https://x/other",
            s(),
            s(),
            RedfishSettings::default(),
            None
        )
        .is_err());
        assert!(Redfish::new("not a url", s(), s(), RedfishSettings::default(), None).is_err());
    }

    #[test]
    fn unknown_values_do_not_fail_a_document() {
        let sys: ComputerSystem = serde_json::from_value(json!({
            "@odata.id": "/redfish/v1/Systems/1",
            "PowerState": "SomethingNew",
            "Boot": {"BootSourceOverrideTarget": "BiosSetup", "BootSourceOverrideEnabled": "Disabled"},
            "Oem": {"Vendor": {"x": 1}}
        }))
        .expect("parses");
        assert_eq!(parse_power(sys.power_state.as_deref()), PowerState::Unknown);
    }
}
