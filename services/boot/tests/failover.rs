//! One active boot server per site, with two `bcm-boot` processes: only the
//! lease holder answers DHCP; a paused holder (SIGSTOP) is replaced within
//! 10 s and, resumed, stays silent because it lost the lease; a killed
//! holder (SIGKILL) is replaced within 10 s too.

mod support;

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use support::{Client, Request, Scratch};

const MAC: [u8; 6] = [0x52, 0x54, 0x00, 0xbb, 0x00, 0x01];

/// Four distinct ports, each free for both UDP and TCP right now (a port
/// free for UDP may be taken for TCP, and two separate asks may return the
/// same port once the first socket is closed).
fn free_ports() -> [u16; 4] {
    let mut held = Vec::new();
    while held.len() < 4 {
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").expect("udp port");
        let port = udp.local_addr().expect("addr").port();
        if let Ok(tcp) = std::net::TcpListener::bind(("127.0.0.1", port)) {
            held.push((port, udp, tcp));
        }
    }
    [held[0].0, held[1].0, held[2].0, held[3].0]
}

struct Proc {
    child: Child,
    dhcp: SocketAddr,
    http: SocketAddr,
}

impl Proc {
    fn start(
        env: &bcm_testkit::TestEnv,
        dir: &std::path::Path,
        name: &str,
        client_port: u16,
    ) -> Proc {
        let [dhcp, pxe, tftp, http] = free_ports();
        let config = format!(
            r#"site = "s1"
server_ip = "127.0.0.1"
tftp_listen = "127.0.0.1:{tftp}"
http_listen = "127.0.0.1:{http}"
boot_files = "{boot}"
image_cache = "{cache}"
lease_ttl_secs = 3
holder = "{name}"
[bus]
url = "{url}"
namespace = "{ns}"
[dhcp]
listen = "127.0.0.1"
port = {dhcp}
pxe_port = {pxe}
client_port = {client_port}
broadcast = "127.0.0.1"
[telemetry]
log_format = "json"
"#,
            boot = dir.join("boot").display(),
            cache = dir.join(format!("cache-{name}")).display(),
            url = env.bus_config.url,
            ns = env.bus_config.namespace.clone().expect("namespace"),
        );
        let path = dir.join(format!("{name}.toml"));
        std::fs::write(&path, config).expect("config");
        let log = std::fs::File::create(dir.join(format!("{name}.log"))).expect("log");
        let child = Command::new(env!("CARGO_BIN_EXE_bcm-boot"))
            .arg("--config")
            .arg(&path)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawn bcm-boot");
        Proc {
            child,
            dhcp: SocketAddr::from(([127, 0, 0, 1], dhcp)),
            http: SocketAddr::from(([127, 0, 0, 1], http)),
        }
    }

    /// Its log and whether it has exited: what a failed expectation shows.
    fn report(&mut self, dir: &std::path::Path, name: &str) -> String {
        let status = match self.child.try_wait() {
            Ok(Some(status)) => format!("exited: {status}"),
            Ok(None) => "still running".to_owned(),
            Err(e) => format!("status unknown: {e}"),
        };
        let log = std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default();
        format!("bcm-boot {name} {status}; its log:\n{log}")
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.child.id().to_string())
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill -{sig}");
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Asks `server` until it answers; how long that took, if within `within`.
async fn answers_within(client: &Client, server: SocketAddr, within: Duration) -> Option<Duration> {
    let start = Instant::now();
    let packet = Request::pxe(MAC, 0).bytes();
    while start.elapsed() < within {
        if client
            .ask(server, &packet, Duration::from_millis(200))
            .await
            .is_some()
        {
            return Some(start.elapsed());
        }
    }
    None
}

/// Whether `server` stays silent for `during`.
async fn silent_for(client: &Client, server: SocketAddr, during: Duration) -> bool {
    answers_within(client, server, during).await.is_none()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_lease_holder_answers_and_a_standby_takes_over() {
    let env = bcm_testkit::TestEnv::start().await.expect("env");
    let dir = Scratch::new("failover");
    support::boot_files(&dir.0.join("boot"));
    let client = Client::new().await;

    let mut a = Proc::start(&env, &dir.0, "a", client.port());
    support::command(
        &env,
        "site.bootEntry.set",
        serde_json::json!({"bootEntry": {"macs": ["52:54:00:bb:00:01"], "kernel": "k", "initrd": "i",
            "cmdline": "c", "expiresInSecs": 600}}),
    )
    .await;
    if answers_within(&client, a.dhcp, Duration::from_secs(30))
        .await
        .is_none()
    {
        panic!(
            "the first process takes the lease and answers within 30 s; {}",
            a.report(&dir.0, "a")
        );
    }
    let b = Proc::start(&env, &dir.0, "b", client.port());
    // Up (its HTTP answers) and standing by.
    let http = reqwest::Client::new();
    let mut health = serde_json::Value::Null;
    for _ in 0..100 {
        if let Ok(r) = http.get(format!("http://{}/healthz", b.http)).send().await {
            health = r.json().await.unwrap_or_default();
            if health["entries"] == 1 {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        health["entries"], 1,
        "the standby has the site's entry: {health}"
    );
    assert_eq!(health["active"], false, "{health}");
    assert!(
        silent_for(&client, b.dhcp, Duration::from_secs(2)).await,
        "the standby does not answer"
    );

    // The holder freezes: the standby answers within 10 s.
    a.signal("STOP");
    let took = answers_within(&client, b.dhcp, Duration::from_secs(10))
        .await
        .unwrap_or_else(|| {
            panic!(
                "the standby answers within 10 s; its log:\n{}",
                std::fs::read_to_string(dir.0.join("b.log")).unwrap_or_default()
            )
        });
    eprintln!("standby answered {took:?} after the holder was paused");
    // Resumed, the old holder has lost the lease and stays silent.
    a.signal("CONT");
    assert!(
        silent_for(&client, a.dhcp, Duration::from_secs(4)).await,
        "a resumed holder without the lease does not answer"
    );

    // The new holder is killed: the other takes over within 10 s.
    b.signal("KILL");
    let Some(took) = answers_within(&client, a.dhcp, Duration::from_secs(10)).await else {
        panic!(
            "the remaining process answers within 10 s; {}",
            a.report(&dir.0, "a")
        )
    };
    eprintln!("takeover {took:?} after the holder was killed");
}
