//! Real BMC peers for the tests, each started fresh per test on a free
//! loopback port and stopped when dropped: sushy-tools' Redfish emulator
//! (fake systems driver) and OpenIPMI's `ipmi_sim`. `tests/peers/install.sh`
//! installs both and prints the environment naming them.
#![allow(dead_code)] // each test binary uses a part

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn env_or(name: &str, default: PathBuf) -> PathBuf {
    std::env::var_os(name).map(PathBuf::from).unwrap_or(default)
}

fn free_tcp_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "bcm-peer-{name}-{}-{}",
        std::process::id(),
        free_tcp_port()
    ));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// The UUID sushy gives fake system `i` (1-based).
pub fn sushy_uuid(i: usize) -> String {
    format!("{i:08}-0000-4000-8000-{i:012}")
}

/// The MAC of fake system `i`'s one NIC.
pub fn sushy_mac(i: usize) -> String {
    format!("52:54:00:00:00:{i:02x}")
}

/// sushy-emulator with `systems` fake systems and basic auth.
pub struct Sushy {
    pub port: u16,
    pub username: String,
    pub password: String,
    dir: PathBuf,
    child: Option<Child>,
    https: bool,
}

impl Sushy {
    /// Starts the emulator with auth on (user `admin`, a random password).
    pub async fn start(systems: usize) -> Sushy {
        Self::start_with(systems, None).await
    }

    /// Starts it serving HTTPS with the given certificate and key (PEM).
    pub async fn start_tls(systems: usize, cert_pem: &str, key_pem: &str) -> Sushy {
        Self::start_with(systems, Some((cert_pem, key_pem))).await
    }

    async fn start_with(systems: usize, tls: Option<(&str, &str)>) -> Sushy {
        let python = env_or(
            "BCM_SUSHY_PYTHON",
            repo().join(".bcm/venv-sushy/bin/python"),
        );
        let dir = scratch("sushy");
        let password = format!("pw-{}", free_tcp_port());
        let hash = Command::new(&python)
            .args([
                "-c",
                "import bcrypt,sys; print('admin:' + bcrypt.hashpw(sys.argv[1].encode(), bcrypt.gensalt()).decode())",
                &password,
            ])
            .output()
            .unwrap_or_else(|e| {
                panic!(
                    "{}: {e}; run tests/peers/install.sh (deploy/dev/test.sh does)",
                    python.display()
                )
            });
        assert!(hash.status.success(), "bcrypt: {:?}", hash);
        std::fs::write(dir.join("htpasswd"), &hash.stdout).expect("htpasswd");
        std::fs::create_dir_all(dir.join("state")).expect("state dir");
        let tls_conf = match tls {
            Some((cert, key)) => {
                std::fs::write(dir.join("cert.pem"), cert).expect("cert");
                std::fs::write(dir.join("key.pem"), key).expect("key");
                format!(
                    "SUSHY_EMULATOR_SSL_CERT = '{0}/cert.pem'\nSUSHY_EMULATOR_SSL_KEY = '{0}/key.pem'\n",
                    dir.display()
                )
            }
            None => String::new(),
        };
        let port = free_tcp_port();
        let conf = format!(
            r#"
SUSHY_EMULATOR_LISTEN_IP = '127.0.0.1'
SUSHY_EMULATOR_LISTEN_PORT = {port}
SUSHY_EMULATOR_FAKE_DRIVER = True
SUSHY_EMULATOR_STATE_DIR = '{state}'
SUSHY_EMULATOR_FEATURE_SET = 'full'
SUSHY_EMULATOR_AUTH_FILE = '{dir}/htpasswd'
SUSHY_EMULATOR_FAKE_SYSTEMS = [
    {{'uuid': '%08d-0000-4000-8000-%012d' % (i, i), 'name': 'fake-%d' % i, 'power_state': 'Off',
      'external_notifier': False, 'nics': [{{'mac': '52:54:00:00:00:%02x' % i, 'ip': '127.0.1.%d' % i}}]}}
    for i in range(1, {systems} + 1)
]
{tls_conf}"#,
            state = dir.join("state").display(),
            dir = dir.display(),
        );
        std::fs::write(dir.join("sushy.conf"), conf).expect("conf");
        let mut s = Sushy {
            port,
            username: "admin".into(),
            password,
            dir,
            child: None,
            https: tls.is_some(),
        };
        s.spawn().await;
        s
    }

    async fn spawn(&mut self) {
        // The emulator itself, with the AccountService it lacks added by
        // tests/peers/sushy_accounts.py (which then runs its main()).
        let bin = env_or(
            "BCM_SUSHY_PYTHON",
            repo().join(".bcm/venv-sushy/bin/python"),
        );
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("sushy.log"))
            .expect("log");
        let child = Command::new(&bin)
            .arg(repo().join("tests/peers/sushy_accounts.py"))
            .arg("--config")
            .arg(self.dir.join("sushy.conf"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e}; run tests/peers/install.sh", bin.display()));
        self.child = Some(child);
        let http = reqwest::Client::builder()
            .danger_accept_invalid_certs(true)
            .build()
            .expect("client");
        let url = format!("{}/redfish/v1/", self.origin());
        for _ in 0..120 {
            if http
                .get(&url)
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        panic!("sushy-emulator did not answer: {}", self.log());
    }

    /// `http(s)://127.0.0.1:<port>`.
    pub fn origin(&self) -> String {
        let scheme = if self.https { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// Whether `password` is what the emulator's account now takes (asks
    /// the emulator itself with basic auth).
    pub async fn takes(&self, password: &str) -> bool {
        reqwest::Client::builder()
            .danger_accept_invalid_certs(true)
            .build()
            .expect("client")
            .get(format!("{}/redfish/v1/Systems", self.origin()))
            .basic_auth(&self.username, Some(password))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
    }

    /// The BMC address of fake system `i` (1-based).
    pub fn system_address(&self, i: usize) -> String {
        format!("{}/redfish/v1/Systems/{}", self.origin(), sushy_uuid(i))
    }

    /// A Redfish driver for fake system `i` with the right credentials.
    pub fn driver(&self, i: usize) -> bcm_bmc::driver::Driver {
        bcm_bmc::driver::Driver::open(
            bcm_core::BmcDriver::Redfish,
            &self.system_address(i),
            self.username.clone().into(),
            self.password.clone().into(),
            &Default::default(),
            None,
        )
        .expect("driver")
    }

    /// Stops the emulator (its state survives in the state dir).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port with the same state.
    pub async fn restart(&mut self) {
        self.stop();
        self.spawn().await;
    }

    /// The emulator's request log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("sushy.log")).unwrap_or_default()
    }

    /// How many `ComputerSystem.Reset` requests system `i` received.
    pub fn resets(&self, i: usize) -> usize {
        let needle = format!(
            "POST /redfish/v1/Systems/{}/Actions/ComputerSystem.Reset",
            sushy_uuid(i)
        );
        self.log().lines().filter(|l| l.contains(&needle)).count()
    }
}

impl Drop for Sushy {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `ipmi_sim` with user `admin` and a random password.
pub struct IpmiSim {
    pub port: u16,
    pub username: String,
    pub password: String,
    dir: PathBuf,
    child: Option<Child>,
}

impl IpmiSim {
    /// Starts ipmi_sim on a free UDP port of 127.0.0.1.
    pub async fn start() -> IpmiSim {
        let peers = repo().join("tests/peers");
        let dir = scratch("ipmi");
        let state = dir.join("state");
        std::fs::create_dir_all(state.join("chassis")).expect("state");
        let port = free_udp_port();
        let password = format!("pw{}", free_tcp_port());
        let conf = std::fs::read_to_string(peers.join("lan.conf.in"))
            .expect("lan.conf.in")
            .replace("@PORT@", &port.to_string())
            .replace("@STATE@", &state.display().to_string())
            .replace(
                "@CHASSIS@",
                &peers.join("chassis_control.sh").display().to_string(),
            )
            .replace("@PASSWORD@", &password);
        std::fs::write(dir.join("lan.conf"), conf).expect("lan.conf");
        let bin = env_or("BCM_IPMI_SIM", PathBuf::from("/usr/bin/ipmi_sim"));
        let log = std::fs::File::create(dir.join("ipmi_sim.log")).expect("log");
        let child = Command::new(&bin)
            .arg("-n")
            .arg("-c")
            .arg(dir.join("lan.conf"))
            .arg("-f")
            .arg(peers.join("sim.emu"))
            .arg("-s")
            .arg(&state)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e}; run tests/peers/install.sh", bin.display()));
        let sim = IpmiSim {
            port,
            username: "admin".into(),
            password,
            dir,
            child: Some(child),
        };
        for _ in 0..40 {
            let ok = Command::new("ipmitool")
                .args(["-I", "lanplus", "-C", "3", "-H", "127.0.0.1", "-p"])
                .arg(port.to_string())
                .args(["-U", "admin", "-E", "-N", "1", "-R", "1", "mc", "info"])
                .env("IPMI_PASSWORD", &sim.password)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                return sim;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        panic!("ipmi_sim did not answer on udp {port}");
    }

    /// `127.0.0.1:<port>`.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Whether `password` logs in as `admin` now (asks with ipmitool).
    pub fn takes(&self, password: &str) -> bool {
        Command::new("ipmitool")
            .args(["-I", "lanplus", "-C", "3", "-H", "127.0.0.1", "-p"])
            .arg(self.port.to_string())
            .args(["-U", "admin", "-E", "-N", "1", "-R", "1", "mc", "info"])
            .env("IPMI_PASSWORD", password)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// The chassis "hardware" state dir.
    fn chassis(&self) -> PathBuf {
        self.dir.join("state/chassis")
    }

    /// Power and reset changes the chassis saw, in order.
    pub fn events(&self) -> Vec<String> {
        std::fs::read_to_string(self.chassis().join("events"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_once(' ').map(|(_, e)| e.to_owned()))
            .collect()
    }

    /// From now on the chassis' "OS" ignores an ACPI soft-off.
    pub fn ignore_acpi(&self) {
        std::fs::write(self.chassis().join("ignores_acpi"), "").expect("ignores_acpi");
    }

    /// The boot device the chassis holds.
    pub fn boot(&self) -> String {
        read_trim(&self.chassis().join("boot"))
    }
}

fn read_trim(p: &Path) -> String {
    std::fs::read_to_string(p)
        .unwrap_or_default()
        .trim()
        .to_owned()
}

impl Drop for IpmiSim {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The `bcm-bmc` binary as its own process for site `s1` of `env`, logging
/// JSON at `debug` into a file; killed when dropped.
pub struct BmcProcess {
    pub dir: PathBuf,
    pub log_path: PathBuf,
    child: Option<Child>,
}

impl BmcProcess {
    /// Starts it with the extra environment `vars`.
    pub fn start(env: &bcm_testkit::TestEnv, vars: &[(&str, &str)]) -> BmcProcess {
        use secrecy::ExposeSecret as _;
        let dir = scratch("bmc-process");
        let keys: String = env
            .sealing_keys
            .iter()
            .map(|k| {
                format!(
                    "[[sealing_keys]]\nid = \"{}\"\nkey = \"{}\"\n",
                    k.id,
                    k.key.expose_secret()
                )
            })
            .collect();
        let config = format!(
            "site = \"s1\"\npower_timeout_secs = 40\nquorum_anchor_file = \"{}\"\n[plugins]\nipmi = \"{}\"\n[bus]\nurl = \"{}\"\nnamespace = \"{}\"\n[telemetry]\nlog_format = \"json\"\nlog_filter = \"debug\"\n{keys}",
            env.anchor_file().display(),
            env!("CARGO_BIN_EXE_bcx-ipmi"),
            env.bus_config.url,
            env.bus_config.namespace.clone().expect("namespace"),
        );
        std::fs::write(dir.join("bmc.toml"), config).expect("config");
        let mut p = BmcProcess {
            log_path: dir.join("bmc.log"),
            dir,
            child: None,
        };
        p.spawn(vars);
        p
    }

    /// Starts the process again (same config, appending to the same log).
    pub fn spawn(&mut self, vars: &[(&str, &str)]) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .expect("log");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_bcm-bmc"));
        cmd.arg("--config")
            .arg(self.dir.join("bmc.toml"))
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log);
        for (k, v) in vars {
            cmd.env(k, v);
        }
        self.child = Some(cmd.spawn().expect("spawn bcm-bmc"));
    }

    /// Waits up to `within` for the process to exit on its own.
    pub async fn exited(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + within;
        while std::time::Instant::now() < deadline {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    self.child = None;
                    return Some(status);
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        None
    }

    /// Stops it.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Everything it logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }
}

impl Drop for BmcProcess {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Records the body of every message the NATS server carries from now on
/// (core subscription to `>`: commands, results, events, JetStream API).
pub async fn record_all_messages(
    env: &bcm_testkit::TestEnv,
) -> std::sync::Arc<std::sync::Mutex<Vec<String>>> {
    use futures::StreamExt as _;
    let seen: std::sync::Arc<std::sync::Mutex<Vec<String>>> = Default::default();
    let mut sub = env
        .state
        .inner
        .bus
        .client()
        .subscribe(">")
        .await
        .expect("subscribe");
    let out = seen.clone();
    tokio::spawn(async move {
        while let Some(m) = sub.next().await {
            out.lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(String::from_utf8_lossy(&m.payload).into_owned());
        }
    });
    seen
}
pub mod vendor_sim;
