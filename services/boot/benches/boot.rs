//! Boot service figures beside the reference servers, in one run (root:
//! it creates a network namespace and a veth pair):
//! - proxy DHCP answers/s and latency p50/p99 for PXE DISCOVERs from a
//!   client in the namespace, ours vs dnsmasq in proxy mode;
//! - TFTP: 200 parallel `curl tftp://` fetches of a 1 MiB file, ours vs
//!   tftp-hpa's in.tftpd;
//! - iPXE script requests/s and p50/p99 over HTTP.
//!
//! `eval "$(deploy/dev/stack.sh env)"; cargo bench -p bcm-boot --bench boot`
//! (needs tests/peers/install.sh's dnsmasq, tftpd-hpa and curl). One JSON
//! line per figure.

use dhcproto::v4::{Architecture, DhcpOption, DhcpOptions, HType, Message, MessageType, Opcode};
use dhcproto::{Decodable, Decoder, Encodable, Encoder};
use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const NS: &str = "bcmbench";
const HOST_IF: &str = "bcmbh0";
const SERVER: Ipv4Addr = Ipv4Addr::new(10, 79, 0, 1);
const CLIENT_IP: &str = "10.79.0.2/24";
const DISCOVERS: usize = 20_000;
const IN_FLIGHT: usize = 64;

fn sh(cmd: &str) {
    let ok = Command::new("bash")
        .args(["-c", cmd])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "{cmd}");
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn discover(xid: u32, mac: [u8; 6]) -> Vec<u8> {
    let mut m = Message::new_with_id(
        xid,
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::UNSPECIFIED,
        &mac,
    );
    m.set_opcode(Opcode::BootRequest).set_htype(HType::Eth);
    let mut o = DhcpOptions::new();
    o.insert(DhcpOption::MessageType(MessageType::Discover));
    o.insert(DhcpOption::ClassIdentifier(
        b"PXEClient:Arch:00000:UNDI:002001".to_vec(),
    ));
    o.insert(DhcpOption::ClientSystemArchitecture(Architecture::from(0)));
    m.set_opts(o);
    let mut out = vec![];
    m.encode(&mut Encoder::new(&mut out)).expect("encode");
    out
}

/// The client side, run inside the namespace by the bench itself:
/// `boot --dhcp-client <server>`; prints `answered seconds p50 p99`.
async fn dhcp_client(server: &str) {
    let sock = std::net::UdpSocket::bind("0.0.0.0:68").expect("bind 68");
    sock.set_broadcast(true).expect("broadcast");
    sock.set_nonblocking(true).expect("nonblocking");
    let sock = tokio::net::UdpSocket::from_std(sock).expect("tokio");
    let server: SocketAddr = format!("{server}:67").parse().expect("server");
    let mac = [0x52, 0x54, 0x00, 0xbe, 0x00, 0x01];
    let mut sent: HashMap<u32, Instant> = HashMap::new();
    let mut lat = vec![];
    let mut next = 0usize;
    let start = Instant::now();
    let mut buf = vec![0u8; 2048];
    while lat.len() < DISCOVERS && start.elapsed() < Duration::from_secs(120) {
        while sent.len() < IN_FLIGHT && next < DISCOVERS + DISCOVERS / 10 {
            let xid = next as u32 + 1;
            next += 1;
            let _ = sock.send_to(&discover(xid, mac), server).await;
            sent.insert(xid, Instant::now());
        }
        match tokio::time::timeout(Duration::from_millis(200), sock.recv_from(&mut buf)).await {
            Ok(Ok((len, _))) => {
                if let Ok(m) = Message::decode(&mut Decoder::new(&buf[..len])) {
                    if let Some(t) = sent.remove(&m.xid()) {
                        lat.push(t.elapsed().as_secs_f64() * 1000.0);
                    }
                }
            }
            _ => {
                // Lost ones time out and are resent as new requests.
                sent.retain(|_, t| t.elapsed() < Duration::from_millis(500));
                if next >= DISCOVERS + DISCOVERS / 10 && sent.is_empty() {
                    break;
                }
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    lat.sort_by(f64::total_cmp);
    println!(
        "{} {} {} {}",
        lat.len(),
        secs,
        percentile(&lat, 0.5),
        percentile(&lat, 0.99)
    );
}

fn run_client() -> (usize, f64, f64, f64) {
    let me = std::env::current_exe().expect("exe");
    let out = Command::new("ip")
        .args(["netns", "exec", NS])
        .arg(me)
        .args(["--dhcp-client", &SERVER.to_string()])
        .output()
        .expect("client");
    let text = String::from_utf8_lossy(&out.stdout);
    let f: Vec<f64> = text
        .split_whitespace()
        .filter_map(|v| v.parse().ok())
        .collect();
    assert_eq!(
        f.len(),
        4,
        "client said: {text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (f[0] as usize, f[1], f[2], f[3])
}

fn print_dhcp(server: &str, (answered, secs, p50, p99): (usize, f64, f64, f64)) {
    println!(
        "{}",
        serde_json::json!({"figure": "proxy DHCP", "server": server, "discovers_answered": answered,
            "answers_per_second": answered as f64 / secs, "latency_ms": {"p50": p50, "p99": p99},
            "in_flight": IN_FLIGHT})
    );
}

fn tftp_fetches(port: u16, dir: &std::path::Path, n: usize) -> (f64, usize) {
    let start = Instant::now();
    let children: Vec<Child> = (0..n)
        .map(|i| {
            Command::new("curl")
                .args(["-s", "--max-time", "120", "--tftp-blksize", "1468", "-o"])
                .arg(dir.join(format!("f{i}")))
                .arg(format!("tftp://127.0.0.1:{port}/big.bin"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("curl")
        })
        .collect();
    let ok = children
        .into_iter()
        .map(|mut c| c.wait().is_ok_and(|s| s.success()))
        .filter(|ok| *ok)
        .count();
    (start.elapsed().as_secs_f64(), ok)
}

fn free_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .map(|a| a.port())
        .expect("port")
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--dhcp-client") {
        dhcp_client(&args[i + 1]).await;
        return Ok(());
    }
    let nats = std::env::var("NATS_URL").map_err(|_| {
        anyhow::anyhow!("NATS_URL is not set: eval \"$(deploy/dev/stack.sh env)\" first")
    })?;
    let dir = std::env::temp_dir().join(format!("bcm-boot-bench-{}", std::process::id()));
    let boot_dir = dir.join("boot");
    std::fs::create_dir_all(&boot_dir)?;
    std::fs::write(boot_dir.join("undionly.kpxe"), vec![7u8; 74_213])?;
    std::fs::write(boot_dir.join("ipxe.efi"), vec![9u8; 850_528])?;
    std::fs::write(
        boot_dir.join("big.bin"),
        (0..1 << 20).map(|i| (i % 251) as u8).collect::<Vec<u8>>(),
    )?;

    let _ = Command::new("ip").args(["netns", "del", NS]).status();
    let _ = Command::new("ip").args(["link", "del", HOST_IF]).status();
    sh(&format!(
        "set -e; ip netns add {NS}; ip link add {HOST_IF} type veth peer name eth0 netns {NS}
         ip addr add {SERVER}/24 dev {HOST_IF}; ip link set {HOST_IF} up
         ip -n {NS} link set lo up; ip -n {NS} addr add {CLIENT_IP} dev eth0; ip -n {NS} link set eth0 up"
    ));

    // Ours, in-process, bound to the veth like a boot VLAN.
    let namespace = format!("bench{}", std::process::id());
    let cfg = bcm_boot::BootConfig {
        site: "s1".into(),
        bus: bcm_bus::BusConfig {
            url: nats,
            namespace: Some(namespace),
            shards: 16,
            nkey_file: None,
        },
        server_ip: SERVER,
        dhcp: bcm_boot::DhcpConfig {
            listen: Ipv4Addr::UNSPECIFIED,
            interface: Some(HOST_IF.into()),
            ..Default::default()
        },
        tftp_listen: SocketAddr::from(([127, 0, 0, 1], free_port())),
        boot_files: boot_dir.clone(),
        bios_file: "undionly.kpxe".into(),
        uefi_x64_file: "ipxe.efi".into(),
        uefi_arm64_file: "ipxe-arm64.efi".into(),
        http_listen: "127.0.0.1:0".parse()?,
        http_port: None,
        lease_ttl_secs: 6,
        script_link_ttl_secs: 120,
        join_key: Default::default(),
        holder: Some("bench".into()),
        image_cache: dir.join("cache"),
        images: vec![],
        http_proxy: None,
        upstream_proxy: None,
        telemetry: Default::default(),
        quorum_anchor_file: None,
    };
    let stop = tokio_util::sync::CancellationToken::new();
    let running = bcm_boot::start(&cfg, stop.clone()).await?;
    let bus = bcm_bus::Bus::connect(&cfg.bus).await?;
    let mac = "52:54:00:be:00:01";
    let entry = serde_json::to_vec(&bcm_boot::entries::BootEntry {
        node_id: None,
        kernel: "ramdisk/vmlinuz".into(),
        initrd: "ramdisk/initrd.img".into(),
        cmdline: "console=ttyS0".into(),
        expires_at: bcm_boot::entries::now_secs() + 3600,
    })?;
    let site: bcm_core::SiteId = "s1".parse()?;
    let kv = bus
        .jetstream()
        .get_key_value(bus.subjects().kv_bucket("boot_entries", &site))
        .await?;
    kv.put(
        bcm_boot::entries::Mac::parse(mac).expect("mac").key(),
        entry.into(),
    )
    .await?;
    let m = bcm_boot::entries::Mac::parse(mac).expect("mac");
    while !running.lease.is_active() || running.entries.live(&m).is_none() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ours = tokio::task::spawn_blocking(run_client).await?;
    print_dhcp("bcm-boot", ours);

    // iPXE scripts over HTTP, each behind a one-time link as a DHCP answer
    // would mint it.
    let http = reqwest::Client::new();
    let live = running.entries.live(&m).expect("entry");
    let mut lat = vec![];
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..32 {
        let (http, nonces, live, base) = (
            http.clone(),
            running.nonces.clone(),
            live.clone(),
            format!("http://{}/ipxe", running.http),
        );
        tasks.spawn(async move {
            let mut mine = vec![];
            let begin = Instant::now();
            while begin.elapsed() < Duration::from_secs(5) {
                let t = Instant::now();
                let url = format!("{base}/{}", nonces.mint(m, &live));
                if http
                    .get(&url)
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success())
                {
                    mine.push(t.elapsed().as_secs_f64() * 1000.0);
                }
            }
            mine
        });
    }
    while let Some(Ok(mine)) = tasks.join_next().await {
        lat.extend(mine);
    }
    let secs = start.elapsed().as_secs_f64();
    lat.sort_by(f64::total_cmp);
    println!(
        "{}",
        serde_json::json!({"figure": "iPXE script over HTTP", "server": "bcm-boot", "concurrency": 32,
            "requests_per_second": lat.len() as f64 / secs,
            "latency_ms": {"p50": percentile(&lat, 0.5), "p99": percentile(&lat, 0.99)}})
    );

    // TFTP: 200 parallel 1 MiB fetches.
    let out = dir.join("out");
    std::fs::create_dir_all(&out)?;
    let (secs, ok) = tokio::task::spawn_blocking({
        let (port, out) = (running.tftp.port(), out.clone());
        move || tftp_fetches(port, &out, 200)
    })
    .await?;
    println!(
        "{}",
        serde_json::json!({"figure": "TFTP 200 parallel fetches of 1 MiB", "server": "bcm-boot",
            "succeeded": ok, "seconds": secs, "mib_per_second": ok as f64 / secs})
    );
    stop.cancel();
    for t in running.tasks {
        let _ = t.await;
    }

    // tftp-hpa on the same files.
    let port = free_port();
    let mut tftpd = Command::new("in.tftpd")
        .args(["-L", "-s"])
        .arg(&boot_dir)
        .args(["-a", &format!("127.0.0.1:{port}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (secs, ok) = tokio::task::spawn_blocking({
        let out = out.clone();
        move || tftp_fetches(port, &out, 200)
    })
    .await?;
    let _ = tftpd.kill();
    let _ = tftpd.wait();
    println!(
        "{}",
        serde_json::json!({"figure": "TFTP 200 parallel fetches of 1 MiB", "server": "tftp-hpa in.tftpd",
            "succeeded": ok, "seconds": secs, "mib_per_second": ok as f64 / secs})
    );

    // dnsmasq in proxy mode, same interface, same client.
    let conf = dir.join("dnsmasq.conf");
    std::fs::write(
        &conf,
        format!(
            "port=0\ninterface={HOST_IF}\nbind-interfaces\ndhcp-range={},proxy,255.255.255.0\n\
             pxe-service=x86PC,\"boot\",undionly.kpxe\ndhcp-leasefile={}/leases\n",
            Ipv4Addr::new(10, 79, 0, 0),
            dir.display()
        ),
    )?;
    let mut dnsmasq = Command::new("dnsmasq")
        .args(["-k", "-u", "root", "-C"])
        .arg(&conf)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let theirs = tokio::task::spawn_blocking(run_client).await?;
    let _ = dnsmasq.kill();
    let _ = dnsmasq.wait();
    print_dhcp("dnsmasq proxy mode", theirs);

    let _ = Command::new("ip").args(["netns", "del", NS]).status();
    let _ = Command::new("ip").args(["link", "del", HOST_IF]).status();
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
