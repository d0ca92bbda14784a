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
}

impl Sushy {
    /// Starts the emulator with auth on (user `admin`, a random password).
    pub async fn start(systems: usize) -> Sushy {
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
"#,
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
        };
        s.spawn().await;
        s
    }

    async fn spawn(&mut self) {
        let bin = env_or(
            "BCM_SUSHY_EMULATOR",
            repo().join(".bcm/venv-sushy/bin/sushy-emulator"),
        );
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("sushy.log"))
            .expect("log");
        let child = Command::new(&bin)
            .arg("--config")
            .arg(self.dir.join("sushy.conf"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e}; run tests/peers/install.sh", bin.display()));
        self.child = Some(child);
        let http = reqwest::Client::new();
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

    /// `http://127.0.0.1:<port>`.
    pub fn origin(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
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
