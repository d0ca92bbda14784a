//! `VendorSim`: Redfish BMCs in the shapes of the vendors' firmware, for the
//! tests of the Redfish driver. A simulation, and named so: the vendors'
//! BMCs cannot run on this machine, DMTF's Redfish-Mockup-Server is on no
//! registry this machine reaches, and captures fetched from public
//! repositories may not be committed here. So the trees below are written
//! for this project, one per vendor, reproducing what each firmware does
//! that the standard leaves open and that the driver must handle:
//!
//! | shape | firmware | what it does |
//! |---|---|---|
//! | `dell_idrac9` | iDRAC 9 (15G) | `EthernetInterfaces` empty; NICs only under `NetworkInterfaces` → `NetworkAdapters` → `NetworkDeviceFunctions`, the PXE port last in the collection; virtual media on the system, a USB slot before the CD slot; an occupied slot refuses `InsertMedia`; its drives offer `#Drive.SecureErase`, answered with a `Task` that runs before it completes (the other shapes offer no drive erase) |
//! | `hpe_ilo5` | iLO 5 (Gen10 Plus) | `Oem.Hpe` root; `NetworkInterfaces` empty, adapters under the chassis; links end in `/`; a PATCH without `If-Match` is `428`; virtual media only under the manager (`Links.ManagedBy`), an empty slot's `Image` is `""` |
//! | `supermicro_x13` | X13 BMC | a boot PATCH that omits `BootSourceOverrideMode` resets the mode to `Legacy`; drives under a backplane's storage; virtual media under the manager, `EjectMedia` listed only while inserted |
//! | `lenovo_xcc` | XCC (SR670 V2) | `BootSourceOverrideMode` allows `UEFI` only; PATCH needs `If-Match`; virtual media slots without actions (PATCHed) |
//! | `dmtf_rackmount` | DMTF public rackmount | the standard: interfaces with a `PermanentMACAddress` beside a configured `MACAddress`, basic auth only (no `SessionService`), a CD slot already holding an image, without actions |
//!
//! The service is a real HTTP server on loopback: GET serves the tree with
//! an `@odata.etag` per resource, PATCH merges into it (and bumps the ETag),
//! `ComputerSystem.Reset` changes `PowerState`, sessions and basic auth are
//! checked against one account whose password PATCH changes. It counts
//! what the driver sent, so a test can assert the quirk was honoured.

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use base64::Engine;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};

/// What a vendor's firmware enforces beyond serving its tree.
#[derive(Debug, Clone, Copy, Default)]
pub struct Rules {
    /// A PATCH without `If-Match` is `428 Precondition Required`; a stale
    /// one is `412`.
    pub patch_needs_if_match: bool,
    /// A PATCH of `Boot` without `BootSourceOverrideMode` sets it to
    /// `Legacy` (Supermicro).
    pub omitted_mode_becomes_legacy: bool,
    /// A slot lists `EjectMedia` only while it holds an image (Supermicro).
    pub eject_listed_when_inserted: bool,
    /// An empty slot's `Image` is `""`, not `null` (iLO).
    pub empty_image_is_blank: bool,
}

/// One vendor's BMC: its tree, its rules, and what inspection must find.
#[derive(Debug, Clone)]
pub struct Shape {
    pub name: &'static str,
    pub system_path: &'static str,
    pub tree: BTreeMap<String, Value>,
    pub rules: Rules,
    /// The MACs in the order the driver must report them (boot-capable
    /// functions first).
    pub macs: Vec<&'static str>,
    pub cpus: u64,
    pub memory_gib: f64,
    pub drive_bytes: Vec<u64>,
}

pub const USER: &str = "root";
pub const PASSWORD: &str = "calvin-Sim-1";

#[derive(Debug)]
struct State {
    tree: BTreeMap<String, Value>,
    etags: BTreeMap<String, u64>,
    rules: Rules,
    password: String,
    sessions: HashSet<String>,
    sessions_enabled: bool,
    patches: Vec<(String, Option<String>, Value)>,
    actions: Vec<(String, Value)>,
    refused: Vec<(Method, String, u16)>,
}

/// A running vendor-shaped BMC.
pub struct VendorSim {
    pub origin: String,
    pub shape: Shape,
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for VendorSim {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn error(status: StatusCode, message: &str) -> Response {
    (
        status,
        [("Content-Type", "application/json")],
        json!({"error": {"code": "Base.1.8.GeneralError", "message": message,
            "@Message.ExtendedInfo": [{"MessageId": "Base.1.8.GeneralError", "Message": message}]}})
        .to_string(),
    )
        .into_response()
}

fn merge(into: &mut Value, patch: &Value) {
    match (into, patch) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        (slot, v) => *slot = v.clone(),
    }
}

impl VendorSim {
    pub async fn start(shape: Shape) -> VendorSim {
        let sessions_enabled = shape
            .tree
            .contains_key("/redfish/v1/SessionService/Sessions");
        let state = Arc::new(Mutex::new(State {
            etags: shape.tree.keys().map(|k| (k.clone(), 1)).collect(),
            tree: shape.tree.clone(),
            rules: shape.rules,
            password: PASSWORD.to_owned(),
            sessions: HashSet::new(),
            sessions_enabled,
            patches: vec![],
            actions: vec![],
            refused: vec![],
        }));
        let s = state.clone();
        let router = Router::new().fallback(
            move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
                let s = s.clone();
                async move { handle(&s, method, uri, headers, body) }
            },
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let origin = format!("http://{}", listener.local_addr().expect("addr"));
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        VendorSim {
            origin,
            shape,
            state,
            task,
        }
    }

    /// The address a node is enrolled with: the system's URL.
    pub fn address(&self) -> String {
        format!("{}{}", self.origin, self.shape.system_path)
    }

    /// The system resource as the BMC holds it now.
    pub fn system(&self) -> Value {
        let st = self.state.lock().expect("state");
        st.tree[self.shape.system_path].clone()
    }

    /// The PATCHes received: path, `If-Match`, body.
    pub fn patches(&self) -> Vec<(String, Option<String>, Value)> {
        self.state.lock().expect("state").patches.clone()
    }

    /// The actions POSTed: target, body.
    pub fn actions(&self) -> Vec<(String, Value)> {
        self.state.lock().expect("state").actions.clone()
    }

    /// A resource as the BMC holds it now.
    pub fn resource(&self, path: &str) -> Value {
        let st = self.state.lock().expect("state");
        st.tree.get(path).cloned().unwrap_or(Value::Null)
    }

    /// The requests refused: method, path, status.
    pub fn refused(&self) -> Vec<(Method, String, u16)> {
        self.state.lock().expect("state").refused.clone()
    }

    pub fn password(&self) -> String {
        self.state.lock().expect("state").password.clone()
    }
}

fn authorized(st: &State, headers: &HeaderMap) -> bool {
    if let Some(token) = headers.get("X-Auth-Token").and_then(|v| v.to_str().ok()) {
        return st.sessions.contains(token);
    }
    let Some(basic) = headers
        .get("Authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Basic "))
        .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
        .and_then(|b| String::from_utf8(b).ok())
    else {
        return false;
    };
    basic == format!("{USER}:{}", st.password)
}

fn handle(
    state: &Mutex<State>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let mut st = state.lock().expect("state");
    let path = match uri.path().trim_end_matches('/') {
        "" => "/".to_owned(),
        p => p.to_owned(),
    };
    let resp = route(&mut st, &method, &path, &headers, &body);
    if !resp.status().is_success() {
        st.refused.push((method, path, resp.status().as_u16()));
    }
    resp
}

fn route(
    st: &mut State,
    method: &Method,
    path: &str,
    headers: &HeaderMap,
    body: &Bytes,
) -> Response {
    let json_body = || serde_json::from_slice::<Value>(body).unwrap_or(Value::Null);
    // The service root and the session login need no credentials.
    if method == Method::POST
        && path == "/redfish/v1/SessionService/Sessions"
        && st.sessions_enabled
    {
        let b = json_body();
        if b["UserName"] != USER || b["Password"] != st.password.as_str() {
            return error(StatusCode::UNAUTHORIZED, "Invalid username or password.");
        }
        let token = format!("tok-{}", st.sessions.len() + 1);
        st.sessions.insert(token.clone());
        let location = format!("/redfish/v1/SessionService/Sessions/{}", st.sessions.len());
        return (
            StatusCode::CREATED,
            [
                ("X-Auth-Token", token.as_str()),
                ("Location", location.as_str()),
            ],
            json!({"@odata.id": location, "UserName": USER}).to_string(),
        )
            .into_response();
    }
    let service_root = method == Method::GET && path == "/redfish/v1";
    if !service_root && !authorized(st, headers) {
        return error(
            StatusCode::UNAUTHORIZED,
            "The request requires authentication.",
        );
    }
    if *method == Method::GET && path.starts_with("/redfish/v1/TaskService/Tasks/") {
        if let Some(t) = st.tree.get_mut(path) {
            let left = t["Oem"]["Sim"]["PollsLeft"].as_u64().unwrap_or(0);
            if left == 0 {
                t["TaskState"] = json!("Completed");
            } else {
                t["Oem"]["Sim"]["PollsLeft"] = json!(left - 1);
            }
        }
    }
    match *method {
        Method::GET => match st.tree.get(path) {
            Some(v) => {
                let mut v = v.clone();
                let etag = format!("W/\"{}\"", st.etags.get(path).copied().unwrap_or(1));
                if let Value::Object(o) = &mut v {
                    o.insert("@odata.id".into(), Value::String(path.to_owned()));
                    o.insert("@odata.etag".into(), Value::String(etag.clone()));
                }
                (
                    StatusCode::OK,
                    [
                        ("Content-Type", "application/json"),
                        ("ETag", etag.as_str()),
                    ],
                    v.to_string(),
                )
                    .into_response()
            }
            None => error(
                StatusCode::NOT_FOUND,
                &format!("The resource at the URI {path} was not found."),
            ),
        },
        Method::PATCH => {
            if !st.tree.contains_key(path) {
                return error(
                    StatusCode::NOT_FOUND,
                    &format!("The resource at the URI {path} was not found."),
                );
            }
            let if_match = headers
                .get("If-Match")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let current = format!("W/\"{}\"", st.etags.get(path).copied().unwrap_or(1));
            if st.rules.patch_needs_if_match {
                match &if_match {
                    None => {
                        return error(
                            StatusCode::PRECONDITION_REQUIRED,
                            "The request requires an If-Match header.",
                        )
                    }
                    Some(e) if *e != current => {
                        return error(StatusCode::PRECONDITION_FAILED, "The ETag does not match.")
                    }
                    Some(_) => {}
                }
            }
            let mut patch = json_body();
            if !patch.is_object() {
                return error(
                    StatusCode::BAD_REQUEST,
                    "The request body is not a JSON object.",
                );
            }
            st.patches.push((path.to_owned(), if_match, patch.clone()));
            if let Some(password) = patch.get("Password").and_then(Value::as_str) {
                st.password = password.to_owned();
                if let Some(o) = patch.as_object_mut() {
                    o.remove("Password");
                }
            }
            if st.rules.omitted_mode_becomes_legacy {
                if let Some(boot) = patch.get_mut("Boot").and_then(Value::as_object_mut) {
                    boot.entry("BootSourceOverrideMode")
                        .or_insert_with(|| json!("Legacy"));
                }
            }
            if let Some(v) = st.tree.get_mut(path) {
                merge(v, &patch);
            }
            *st.etags.entry(path.to_owned()).or_insert(1) += 1;
            StatusCode::NO_CONTENT.into_response()
        }
        Method::POST => {
            st.actions.push((path.to_owned(), json_body()));
            if let Some(drive) = path.strip_suffix("/Actions/Drive.SecureErase") {
                return secure_erase(st, drive);
            }
            if let Some(slot) = path.strip_suffix("/Actions/VirtualMedia.InsertMedia") {
                return insert_media(st, slot, &json_body());
            }
            if let Some(slot) = path.strip_suffix("/Actions/VirtualMedia.EjectMedia") {
                return eject_media(st, slot);
            }
            let Some(system) = path.strip_suffix("/Actions/ComputerSystem.Reset") else {
                return error(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "The action is not supported.",
                );
            };
            let power = match json_body()["ResetType"].as_str() {
                Some("On" | "ForceOn" | "ForceRestart" | "GracefulRestart" | "PowerCycle") => "On",
                Some("ForceOff" | "GracefulShutdown") => "Off",
                _ => {
                    return error(
                        StatusCode::BAD_REQUEST,
                        "ResetType is not one of the allowable values.",
                    )
                }
            };
            match st.tree.get_mut(system) {
                Some(s) => {
                    s["PowerState"] = json!(power);
                    *st.etags.entry(system.to_owned()).or_insert(1) += 1;
                    StatusCode::NO_CONTENT.into_response()
                }
                None => error(StatusCode::NOT_FOUND, "No such system."),
            }
        }
        Method::DELETE if path.starts_with("/redfish/v1/SessionService/Sessions/") => {
            StatusCode::NO_CONTENT.into_response()
        }
        _ => error(
            StatusCode::METHOD_NOT_ALLOWED,
            "The method is not allowed on this resource.",
        ),
    }
}

/// `InsertMedia`: an occupied slot refuses (as iDRAC's "virtual media is
/// already connected"); the image must be an http(s) URL.
fn insert_media(st: &mut State, slot: &str, body: &Value) -> Response {
    let listed_when_inserted = st.rules.eject_listed_when_inserted;
    let Some(v) = st.tree.get_mut(slot) else {
        return error(StatusCode::NOT_FOUND, "No such virtual media slot.");
    };
    if v["Inserted"] == true {
        return error(
            StatusCode::BAD_REQUEST,
            "Virtual media is already connected.",
        );
    }
    let Some(image) = body["Image"].as_str().filter(|i| i.starts_with("http")) else {
        return error(StatusCode::BAD_REQUEST, "Image is not a supported URI.");
    };
    v["Image"] = json!(image);
    v["Inserted"] = json!(true);
    v["ConnectedVia"] = json!("URI");
    if listed_when_inserted {
        v["Actions"]["#VirtualMedia.EjectMedia"] =
            json!({"target": format!("{slot}/Actions/VirtualMedia.EjectMedia")});
    }
    *st.etags.entry(slot.to_owned()).or_insert(1) += 1;
    StatusCode::NO_CONTENT.into_response()
}

/// `Drive.SecureErase`: accepted with a `Task` (iDRAC's job), which reads
/// `Running` once and then `Completed`; the drive is marked erased.
fn secure_erase(st: &mut State, drive: &str) -> Response {
    if !st.tree.contains_key(drive) {
        return error(StatusCode::NOT_FOUND, "No such drive.");
    }
    let id = st
        .tree
        .keys()
        .filter(|k| k.starts_with("/redfish/v1/TaskService/Tasks/"))
        .count()
        + 1;
    let task = format!("/redfish/v1/TaskService/Tasks/JID_{id}");
    let body = json!({"@odata.id": task, "Id": format!("JID_{id}"), "TaskState": "Running",
                      "Oem": {"Sim": {"Drive": drive, "PollsLeft": 1}}});
    st.tree.insert(task.clone(), body.clone());
    if let Some(d) = st.tree.get_mut(drive) {
        d["Oem"]["Sim"]["Erased"] = json!(true);
    }
    (
        StatusCode::ACCEPTED,
        [
            ("Content-Type", "application/json"),
            ("Location", task.as_str()),
        ],
        body.to_string(),
    )
        .into_response()
}

fn eject_media(st: &mut State, slot: &str) -> Response {
    let blank = st.rules.empty_image_is_blank;
    let listed_when_inserted = st.rules.eject_listed_when_inserted;
    let Some(v) = st.tree.get_mut(slot) else {
        return error(StatusCode::NOT_FOUND, "No such virtual media slot.");
    };
    if listed_when_inserted && v["Inserted"] != true {
        return error(
            StatusCode::METHOD_NOT_ALLOWED,
            "The action is not supported.",
        );
    }
    v["Image"] = if blank { json!("") } else { Value::Null };
    v["Inserted"] = json!(false);
    v["ConnectedVia"] = json!("NotConnected");
    if listed_when_inserted {
        if let Some(a) = v["Actions"].as_object_mut() {
            a.remove("#VirtualMedia.EjectMedia");
        }
    }
    *st.etags.entry(slot.to_owned()).or_insert(1) += 1;
    StatusCode::NO_CONTENT.into_response()
}

// ---- the trees -------------------------------------------------------

fn link(p: &str) -> Value {
    json!({"@odata.id": p})
}

fn collection(members: &[String]) -> Value {
    json!({"Members": members.iter().map(|m| link(m)).collect::<Vec<_>>(),
           "Members@odata.count": members.len()})
}

/// Builds a tree: a service root, one system, one account.
struct Tree {
    t: BTreeMap<String, Value>,
    slash: &'static str,
}

impl Tree {
    fn new(root_extra: Value, sessions: bool, slash: &'static str) -> Tree {
        let mut root = json!({
            "RedfishVersion": "1.11.0",
            "Systems": link(&format!("/redfish/v1/Systems{slash}")),
            "Chassis": link(&format!("/redfish/v1/Chassis{slash}")),
            "AccountService": link(&format!("/redfish/v1/AccountService{slash}")),
        });
        merge(&mut root, &root_extra);
        let mut t = Tree {
            t: BTreeMap::new(),
            slash,
        };
        if sessions {
            root["SessionService"] = link("/redfish/v1/SessionService");
            root["Links"] = json!({"Sessions": link("/redfish/v1/SessionService/Sessions")});
            t.put(
                "/redfish/v1/SessionService",
                json!({"Sessions": link("/redfish/v1/SessionService/Sessions")}),
            );
            t.put("/redfish/v1/SessionService/Sessions", collection(&[]));
        }
        t.put("/redfish/v1", root);
        t.put(
            "/redfish/v1/AccountService",
            json!({"Accounts": link(&t.l("/redfish/v1/AccountService/Accounts"))}),
        );
        t.collection(
            "/redfish/v1/AccountService/Accounts",
            &["/redfish/v1/AccountService/Accounts/2"],
        );
        t.put(
            "/redfish/v1/AccountService/Accounts/2",
            json!({"Id": "2", "UserName": USER, "RoleId": "Administrator", "Enabled": true}),
        );
        t
    }

    /// A link as this firmware spells it (iLO ends links in `/`).
    fn l(&self, p: &str) -> String {
        format!("{p}{}", self.slash)
    }

    fn put(&mut self, p: &str, v: Value) {
        self.t.insert(p.to_owned(), v);
    }

    fn collection(&mut self, p: &str, members: &[&str]) {
        let m: Vec<String> = members.iter().map(|m| self.l(m)).collect();
        self.put(p, collection(&m));
    }

    /// The system with its summaries and boot block; `links` are the
    /// sub-collections it names.
    fn system(&mut self, p: &str, extra: Value) {
        let mut s = json!({
            "Id": p.rsplit('/').next(),
            "PowerState": "On",
            "Actions": {"#ComputerSystem.Reset": {
                "target": format!("{p}/Actions/ComputerSystem.Reset"),
                "ResetType@Redfish.AllowableValues": ["On", "ForceOff", "GracefulShutdown", "ForceRestart", "PowerCycle"]}},
            "Boot": {"BootSourceOverrideEnabled": "Disabled", "BootSourceOverrideTarget": "None",
                     "BootSourceOverrideMode": "UEFI",
                     "BootSourceOverrideTarget@Redfish.AllowableValues": ["None", "Pxe", "Hdd", "Cd", "BiosSetup"],
                     "BootSourceOverrideMode@Redfish.AllowableValues": ["Legacy", "UEFI"]},
        });
        merge(&mut s, &extra);
        self.put(p, s);
        self.collection("/redfish/v1/Systems", &[p]);
    }

    /// The system's `EthernetInterfaces`: one member per MAC, named
    /// `{prefix}{n}` from 1; `permanent` repeats each MAC as the
    /// `PermanentMACAddress`, `state` is the `Status.State` if given.
    fn interfaces(
        &mut self,
        sys: &str,
        prefix: &str,
        macs: &[&str],
        permanent: bool,
        state: Option<&str>,
    ) {
        let list = format!("{sys}/EthernetInterfaces");
        let paths: Vec<String> = (1..=macs.len())
            .map(|i| format!("{list}/{prefix}{i}"))
            .collect();
        self.collection(&list, &paths.iter().map(String::as_str).collect::<Vec<_>>());
        for (p, mac) in paths.iter().zip(macs) {
            let mut v = json!({"MACAddress": mac});
            if permanent {
                v["PermanentMACAddress"] = json!(mac);
            }
            if let Some(state) = state {
                v["Status"] = json!({"State": state});
            }
            self.put(p, v);
        }
    }

    /// A network adapter with its functions: (id, permanent MAC, boot mode).
    fn adapter(&mut self, p: &str, functions: &[(&str, &str, &str)]) {
        let list = format!("{p}/NetworkDeviceFunctions");
        self.put(
            p,
            json!({"Id": p.rsplit('/').next(), "NetworkDeviceFunctions": link(&self.l(&list))}),
        );
        let members: Vec<String> = functions
            .iter()
            .map(|(id, _, _)| format!("{list}/{id}"))
            .collect();
        let refs: Vec<&str> = members.iter().map(String::as_str).collect();
        self.collection(&list, &refs);
        for (id, mac, boot) in functions {
            self.put(
                &format!("{list}/{id}"),
                json!({"Id": id, "NetDevFuncType": "Ethernet", "BootMode": boot,
                       "Ethernet": {"PermanentMACAddress": mac.to_uppercase(), "MACAddress": mac.to_uppercase()},
                       "Status": {"State": "Enabled"}}),
            );
        }
    }

    /// A virtual media collection with slots: id, media types, whether it
    /// has the Insert/Eject actions (else it is PATCHed), the image it holds.
    fn media(&mut self, list: &str, slots: &[(&str, &[&str], bool, Option<&str>)]) {
        let members: Vec<String> = slots
            .iter()
            .map(|(id, ..)| format!("{list}/{id}"))
            .collect();
        let refs: Vec<&str> = members.iter().map(String::as_str).collect();
        self.collection(list, &refs);
        for (m, (id, types, actions, image)) in members.iter().zip(slots) {
            let mut v = json!({"Id": id, "MediaTypes": types, "Image": image,
                "Inserted": image.is_some(), "WriteProtected": true,
                "ConnectedVia": if image.is_some() { "URI" } else { "NotConnected" }});
            if *actions {
                v["Actions"] = json!({
                    "#VirtualMedia.InsertMedia": {"target": format!("{m}/Actions/VirtualMedia.InsertMedia")},
                    "#VirtualMedia.EjectMedia": {"target": format!("{m}/Actions/VirtualMedia.EjectMedia")}});
            }
            self.put(m, v);
        }
    }

    /// The system's own `VirtualMedia` link.
    fn system_media(&mut self, sys: &str, list: &str) {
        let l = link(&self.l(list));
        if let Some(s) = self.t.get_mut(sys) {
            s["VirtualMedia"] = l;
        }
    }

    /// The system managed by `manager`, which holds the virtual media.
    fn managed_by(&mut self, sys: &str, manager: &str, list: &str) {
        let (m, l) = (link(&self.l(manager)), link(&self.l(list)));
        if let Some(s) = self.t.get_mut(sys) {
            s["Links"]["ManagedBy"] = json!([m]);
        }
        self.put(
            manager,
            json!({"Id": "1", "VirtualMedia": l, "FirmwareVersion": "2.72"}),
        );
    }

    /// The drives of the storage controller `p` offer `#Drive.SecureErase`.
    fn erasable(&mut self, p: &str) {
        let drives: Vec<String> = self
            .t
            .keys()
            .filter(|k| k.starts_with(&format!("{p}/Drives/")))
            .cloned()
            .collect();
        for d in drives {
            let target = format!("{d}/Actions/Drive.SecureErase");
            if let Some(v) = self.t.get_mut(&d) {
                v["Actions"] = json!({"#Drive.SecureErase": {"target": target}});
            }
        }
    }

    /// One storage controller with drives of these sizes.
    fn storage(&mut self, p: &str, drives: &[u64]) {
        let members: Vec<String> = (0..drives.len())
            .map(|i| format!("{p}/Drives/Disk.Bay.{i}"))
            .collect();
        self.put(
            p,
            json!({"Drives": members.iter().map(|m| link(&self.l(m))).collect::<Vec<_>>()}),
        );
        for (m, bytes) in members.iter().zip(drives) {
            self.put(m, json!({"CapacityBytes": bytes, "MediaType": "SSD", "Protocol": "NVMe",
                               "SerialNumber": format!("SN{bytes}"), "Status": {"State": "Enabled"}}));
        }
    }
}

/// Dell iDRAC 9: the interfaces collection is empty; the NICs are under
/// `NetworkInterfaces` → adapters, and the port set to PXE is the last
/// function listed.
pub fn dell_idrac9() -> Shape {
    let sys = "/redfish/v1/Systems/System.Embedded.1";
    let ch = "/redfish/v1/Chassis/System.Embedded.1";
    let mut t = Tree::new(json!({"Vendor": "Dell", "Oem": {"Dell": {}}}), true, "");
    t.system(sys, json!({
        "Manufacturer": "Dell Inc.", "Model": "PowerEdge R750", "BiosVersion": "1.13.2",
        "ProcessorSummary": {"Count": 2, "Model": "Intel(R) Xeon(R) Gold 6354 CPU @ 3.00GHz"},
        "MemorySummary": {"TotalSystemMemoryGiB": 512},
        "EthernetInterfaces": link(&format!("{sys}/EthernetInterfaces")),
        "NetworkInterfaces": link(&format!("{sys}/NetworkInterfaces")),
        "Storage": link(&format!("{sys}/Storage")),
        "Links": {"Chassis": [link(ch)]},
        "Boot": {"BootSourceOverrideTarget@Redfish.AllowableValues": ["None", "Pxe", "Floppy", "Cd", "Hdd", "BiosSetup", "Utilities", "UefiTarget", "SDCard", "UefiHttp"]},
    }));
    t.collection(&format!("{sys}/EthernetInterfaces"), &[]);
    let (emb, slot) = (
        format!("{ch}/NetworkAdapters/NIC.Embedded.1"),
        format!("{ch}/NetworkAdapters/NIC.Slot.3"),
    );
    t.collection(
        &format!("{sys}/NetworkInterfaces"),
        &[
            &format!("{sys}/NetworkInterfaces/NIC.Embedded.1"),
            &format!("{sys}/NetworkInterfaces/NIC.Slot.3"),
        ],
    );
    t.put(
        &format!("{sys}/NetworkInterfaces/NIC.Embedded.1"),
        json!({"Links": {"NetworkAdapter": link(&emb)}}),
    );
    t.put(
        &format!("{sys}/NetworkInterfaces/NIC.Slot.3"),
        json!({"Links": {"NetworkAdapter": link(&slot)}}),
    );
    t.put(
        ch,
        json!({"NetworkAdapters": link(&format!("{ch}/NetworkAdapters"))}),
    );
    t.collection(&format!("{ch}/NetworkAdapters"), &[&emb, &slot]);
    t.adapter(
        &emb,
        &[
            ("NIC.Embedded.1-1-1", "70:b5:e8:f0:52:dc", "Disabled"),
            ("NIC.Embedded.1-2-1", "70:b5:e8:f0:52:dd", "Disabled"),
        ],
    );
    t.adapter(
        &slot,
        &[
            ("NIC.Slot.3-1-1", "b8:3f:d2:a4:1b:d2", "Disabled"),
            ("NIC.Slot.3-2-1", "b8:3f:d2:a4:1b:d3", "PXE"),
        ],
    );
    t.collection(
        &format!("{sys}/Storage"),
        &[&format!("{sys}/Storage/RAID.SL.3-1")],
    );
    t.storage(
        &format!("{sys}/Storage/RAID.SL.3-1"),
        &[1_920_383_410_176, 1_920_383_410_176],
    );
    t.erasable(&format!("{sys}/Storage/RAID.SL.3-1"));
    let media = format!("{sys}/VirtualMedia");
    t.system_media(sys, &media);
    t.media(
        &media,
        &[
            ("1", &["USBStick"], true, None),
            (
                "2",
                &["CD", "DVD"],
                true,
                Some("http://127.0.0.1:9/last-deploy.iso"),
            ),
        ],
    );
    Shape {
        name: "dell-idrac9",
        system_path: sys,
        tree: t.t,
        rules: Rules::default(),
        macs: vec![
            "b8:3f:d2:a4:1b:d3",
            "70:b5:e8:f0:52:dc",
            "70:b5:e8:f0:52:dd",
            "b8:3f:d2:a4:1b:d2",
        ],
        cpus: 2,
        memory_gib: 512.0,
        drive_bytes: vec![1_920_383_410_176, 1_920_383_410_176],
    }
}

/// HPE iLO 5: interfaces listed, `NetworkInterfaces` empty, adapters
/// under the chassis (with the embedded LOM's function set to PXE), links
/// ending in `/`, PATCH only with `If-Match`.
pub fn hpe_ilo5() -> Shape {
    let sys = "/redfish/v1/Systems/1";
    let ch = "/redfish/v1/Chassis/1";
    let mut t = Tree::new(
        json!({"Oem": {"Hpe": {"Manager": [{"ManagerType": "iLO 5"}]}}}),
        true,
        "/",
    );
    let l = |p: &str| link(&format!("{p}/"));
    t.system(
        sys,
        json!({
            "Manufacturer": "HPE", "Model": "ProLiant DL385 Gen10 Plus v2",
            "ProcessorSummary": {"Count": 2, "Model": "AMD EPYC 7763 64-Core Processor"},
            "MemorySummary": {"TotalSystemMemoryGiB": 1024},
            "EthernetInterfaces": l(&format!("{sys}/EthernetInterfaces")),
            "NetworkInterfaces": l(&format!("{sys}/NetworkInterfaces")),
            "Storage": l(&format!("{sys}/Storage")),
            "Links": {"Chassis": [l(ch)]},
        }),
    );
    let nics = [
        "50:7c:6f:11:f2:a6",
        "50:7c:6f:11:f2:a7",
        "88:e9:a4:87:42:c8",
    ];
    t.interfaces(sys, "", &nics, false, Some("Enabled"));
    t.collection(&format!("{sys}/NetworkInterfaces"), &[]);
    t.put(
        ch,
        json!({"NetworkAdapters": l(&format!("{ch}/NetworkAdapters"))}),
    );
    let lom = format!("{ch}/NetworkAdapters/DC080000");
    t.collection(&format!("{ch}/NetworkAdapters"), &[&lom]);
    t.adapter(&lom, &[("1", "b8:3f:d2:d7:f7:4a", "PXE")]);
    t.collection(
        &format!("{sys}/Storage"),
        &[&format!("{sys}/Storage/DA000000")],
    );
    t.storage(
        &format!("{sys}/Storage/DA000000"),
        &[6_401_252_745_216, 480_103_981_056],
    );
    let media = "/redfish/v1/Managers/1/VirtualMedia";
    t.managed_by(sys, "/redfish/v1/Managers/1", media);
    t.media(
        media,
        &[
            ("1", &["Floppy", "USBStick"], true, None),
            ("2", &["CD", "DVD"], true, None),
        ],
    );
    Shape {
        name: "hpe-ilo5",
        system_path: sys,
        tree: t.t,
        rules: Rules {
            patch_needs_if_match: true,
            empty_image_is_blank: true,
            ..Rules::default()
        },
        macs: vec![
            "b8:3f:d2:d7:f7:4a",
            "50:7c:6f:11:f2:a6",
            "50:7c:6f:11:f2:a7",
            "88:e9:a4:87:42:c8",
        ],
        cpus: 2,
        memory_gib: 1024.0,
        drive_bytes: vec![6_401_252_745_216, 480_103_981_056],
    }
}

/// Supermicro X13: interfaces listed; an omitted boot mode becomes Legacy.
pub fn supermicro_x13() -> Shape {
    let sys = "/redfish/v1/Systems/1";
    let mut t = Tree::new(json!({"Oem": {"Supermicro": {}}}), true, "");
    t.system(
        sys,
        json!({
            "Manufacturer": "Supermicro", "Model": "SYS-821GE-TNHR",
            "ProcessorSummary": {"Count": 2, "Model": "Intel(R) Xeon(R) processor"},
            "MemorySummary": {"TotalSystemMemoryGiB": 2048},
            "EthernetInterfaces": link(&format!("{sys}/EthernetInterfaces")),
            "Storage": link(&format!("{sys}/Storage")),
        }),
    );
    let nics = ["7c:c2:55:79:3f:8e", "7c:c2:55:79:3f:8f"];
    t.interfaces(sys, "", &nics, true, None);
    let hba = format!("{sys}/Storage/HA-RAID.0.StorageEnclosure.0");
    t.collection(&format!("{sys}/Storage"), &[&hba]);
    t.storage(&hba, &[7_681_501_126_656; 4]);
    let media = "/redfish/v1/Managers/1/VirtualMedia";
    t.system_media(sys, media);
    t.media(
        media,
        &[(
            "VirtualMedia1",
            &["CD", "DVD", "Floppy", "USBStick"],
            true,
            None,
        )],
    );
    if let Some(a) =
        t.t.get_mut("/redfish/v1/Managers/1/VirtualMedia/VirtualMedia1")
            .and_then(|v| v["Actions"].as_object_mut())
    {
        a.remove("#VirtualMedia.EjectMedia");
    }
    Shape {
        name: "supermicro-x13",
        system_path: sys,
        tree: t.t,
        rules: Rules {
            omitted_mode_becomes_legacy: true,
            eject_listed_when_inserted: true,
            ..Rules::default()
        },
        macs: nics.to_vec(),
        cpus: 2,
        memory_gib: 2048.0,
        drive_bytes: vec![7_681_501_126_656; 4],
    }
}

/// Lenovo XCC: UEFI only, PATCH with `If-Match`, NICs listed both as
/// interfaces and under the chassis' adapters (the same MACs).
pub fn lenovo_xcc() -> Shape {
    let sys = "/redfish/v1/Systems/1";
    let ch = "/redfish/v1/Chassis/1";
    let mut t = Tree::new(json!({"Vendor": "Lenovo", "Oem": {"Lenovo": {}}}), true, "");
    t.system(sys, json!({
        "Manufacturer": "Lenovo", "Model": "ThinkSystem SR670 V2",
        "ProcessorSummary": {"Count": 2, "Model": "Intel(R) Xeon(R) Platinum 8362 CPU @ 2.80GHz"},
        "MemorySummary": {"TotalSystemMemoryGiB": 1024},
        "EthernetInterfaces": link(&format!("{sys}/EthernetInterfaces")),
        "Storage": link(&format!("{sys}/Storage")),
        "Links": {"Chassis": [link(ch)]},
        "Boot": {"BootSourceOverrideMode@Redfish.AllowableValues": ["UEFI"]},
    }));
    let nics = ["00:62:0b:4c:28:4e", "00:62:0b:4c:28:4f"];
    t.interfaces(sys, "NIC", &nics, false, None);
    t.put(
        ch,
        json!({"NetworkAdapters": link(&format!("{ch}/NetworkAdapters"))}),
    );
    let slot = format!("{ch}/NetworkAdapters/slot-7");
    t.collection(&format!("{ch}/NetworkAdapters"), &[&slot]);
    t.adapter(
        &slot,
        &[("1.1", nics[0], "Disabled"), ("2.1", nics[1], "PXE")],
    );
    t.collection(
        &format!("{sys}/Storage"),
        &[&format!("{sys}/Storage/RAID_Slot3")],
    );
    t.storage(
        &format!("{sys}/Storage/RAID_Slot3"),
        &[960_000_000_000, 960_000_000_000],
    );
    let media = format!("{sys}/VirtualMedia");
    t.system_media(sys, &media);
    t.media(
        &media,
        &[("EXT1", &["CD", "DVD", "Floppy", "USBStick"], false, None)],
    );
    Shape {
        name: "lenovo-xcc",
        system_path: sys,
        tree: t.t,
        rules: Rules {
            patch_needs_if_match: true,
            ..Rules::default()
        },
        macs: vec![nics[1], nics[0]],
        cpus: 2,
        memory_gib: 1024.0,
        drive_bytes: vec![960_000_000_000, 960_000_000_000],
    }
}

/// DMTF's public rackmount: the standard alone; basic auth only; one
/// interface with a configured MAC beside its permanent one.
pub fn dmtf_rackmount() -> Shape {
    let sys = "/redfish/v1/Systems/437XR1138R2";
    let mut t = Tree::new(json!({"Vendor": "Contoso"}), false, "");
    t.system(sys, json!({
        "Manufacturer": "Contoso", "Model": "3500",
        "ProcessorSummary": {"Count": 2, "Model": "Multi-Core Intel(R) Xeon(R) processor 7xxx Series"},
        "MemorySummary": {"TotalSystemMemoryGiB": 96},
        "EthernetInterfaces": link(&format!("{sys}/EthernetInterfaces")),
    }));
    t.collection(
        &format!("{sys}/EthernetInterfaces"),
        &[
            &format!("{sys}/EthernetInterfaces/12446A3B0411"),
            &format!("{sys}/EthernetInterfaces/12446A3B8890"),
        ],
    );
    t.put(
        &format!("{sys}/EthernetInterfaces/12446A3B0411"),
        json!({"MACAddress": "12:44:6A:3B:04:11", "PermanentMACAddress": "12:44:6A:3B:04:11"}),
    );
    t.put(
        &format!("{sys}/EthernetInterfaces/12446A3B8890"),
        json!({"MACAddress": "AA:BB:CC:DD:EE:00", "PermanentMACAddress": "12:44:6A:3B:88:90"}),
    );
    let media = format!("{sys}/VirtualMedia");
    t.system_media(sys, &media);
    t.media(
        &media,
        &[
            ("Floppy1", &["Floppy", "USBStick"], false, None),
            (
                "CD1",
                &["CD", "DVD"],
                false,
                Some("http://127.0.0.1:9/freeImages/freeOS.1.1.iso"),
            ),
        ],
    );
    Shape {
        name: "dmtf-rackmount",
        system_path: sys,
        tree: t.t,
        rules: Rules::default(),
        macs: vec!["12:44:6a:3b:04:11", "12:44:6a:3b:88:90"],
        cpus: 2,
        memory_gib: 96.0,
        drive_bytes: vec![],
    }
}

/// Every shape, for the table tests.
pub fn all() -> Vec<Shape> {
    vec![
        dell_idrac9(),
        hpe_ilo5(),
        supermicro_x13(),
        lenovo_xcc(),
        dmtf_rackmount(),
    ]
}
