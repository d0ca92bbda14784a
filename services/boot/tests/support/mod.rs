//! Shared by the boot service's tests: a boot service on loopback with
//! ephemeral ports (its "broadcast" replies go to the test client's port on
//! 127.0.0.1), a scripted PXE client built with dhcproto, and boot entries
//! made through the real `site.bootEntry.set` command subject.
#![allow(dead_code)] // each test binary uses a part

use bcm_contracts::CloudEvent;
use bcm_contracts::CommandEnvelope;
use bcm_testkit::TestEnv;
use dhcproto::v4::{
    Architecture, DhcpOption, DhcpOptions, HType, Message, MessageType, Opcode, OptionCode,
};
use dhcproto::{Decodable, Decoder, Encodable, Encoder};
use serde_json::json;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;
use tokio::net::UdpSocket;
use tokio_util::sync::CancellationToken;

/// A scratch directory removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        let port = std::net::UdpSocket::bind("127.0.0.1:0")
            .and_then(|s| s.local_addr())
            .map(|a| a.port())
            .unwrap_or(0);
        let dir =
            std::env::temp_dir().join(format!("bcm-boot-{name}-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch");
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The boot files a test serves: random bytes named like the iPXE builds.
pub fn boot_files(dir: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let files: Vec<(String, Vec<u8>)> = [
        ("undionly.kpxe", 74_213usize),
        ("ipxe.efi", 850_528),
        ("big.bin", 1 << 20),
    ]
    .iter()
    .map(|(n, len)| {
        let bytes: Vec<u8> = (0..*len).map(|i| (i * 7 + i / 251) as u8).collect();
        ((*n).to_owned(), bytes)
    })
    .collect();
    std::fs::create_dir_all(dir).expect("boot dir");
    for (n, b) in &files {
        std::fs::write(dir.join(n), b).expect("boot file");
    }
    files
}

/// A test's boot service config: loopback, ephemeral ports.
pub fn config(
    env: &TestEnv,
    dir: &std::path::Path,
    client_port: u16,
    holder: &str,
) -> bcm_boot::BootConfig {
    bcm_boot::BootConfig {
        site: "s1".into(),
        bus: env.bus_config.clone(),
        server_ip: Ipv4Addr::LOCALHOST,
        dhcp: bcm_boot::DhcpConfig {
            listen: Ipv4Addr::LOCALHOST,
            interface: None,
            port: 0,
            pxe_port: 0,
            client_port,
            broadcast: Ipv4Addr::LOCALHOST,
        },
        tftp_listen: "127.0.0.1:0".parse().expect("addr"),
        boot_files: dir.join("boot"),
        bios_file: "undionly.kpxe".into(),
        uefi_x64_file: "ipxe.efi".into(),
        uefi_arm64_file: "ipxe-arm64.efi".into(),
        http_listen: "127.0.0.1:0".parse().expect("addr"),
        http_port: None,
        lease_ttl_secs: 3,
        script_link_ttl_secs: 120,
        join_key: bcm_pki::JoinKeyConfig::with_key(env.join_key.for_site("s1")),
        holder: Some(holder.into()),
        image_cache: dir.join("cache"),
        images: vec![],
        http_proxy: None,
        upstream_proxy: None,
        telemetry: Default::default(),
        quorum_anchor_file: Some(env.anchor_file()),
    }
}

/// A scratch directory with boot files and a boot service on loopback
/// whose client-bound replies go to `client_port`.
pub async fn started(env: &TestEnv, name: &str, client_port: u16) -> (Scratch, Boot) {
    let dir = Scratch::new(name);
    boot_files(&dir.0.join("boot"));
    let boot = Boot::start(&config(env, &dir.0, client_port, "a")).await;
    (dir, boot)
}

/// A running in-process boot service and its stop token.
pub struct Boot {
    pub running: bcm_boot::Running,
    pub stop: CancellationToken,
}

impl Boot {
    pub async fn start(cfg: &bcm_boot::BootConfig) -> Boot {
        let stop = CancellationToken::new();
        let running = bcm_boot::start(cfg, stop.clone())
            .await
            .expect("boot service");
        Boot { running, stop }
    }

    /// Waits until it holds the site lease.
    pub async fn active(&self) {
        for _ in 0..200 {
            if self.running.lease.is_active() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the boot service never took the site lease");
    }
}

impl Drop for Boot {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Publishes a command on the site's command subject.
pub async fn command(env: &TestEnv, kind: &str, params: serde_json::Value) -> String {
    let bus = &env.state.inner.bus;
    let site: bcm_core::SiteId = "s1".parse().expect("site");
    let command = bcm_contracts::Command::from_parts(kind, params).expect("a valid command");
    let cmd = CommandEnvelope {
        command_id: bcm_core::CommandId::generate().to_string(),
        site_id: site.clone(),
        node_id: None,
        command,
        issued_at: chrono::Utc::now(),
        deadline: None,
        authority: None,
    };
    let ev = CloudEvent::new(
        format!("cmd-{}", cmd.command_id),
        bcm_contracts::events::types::command(cmd.kind()),
        None,
        None,
        cmd.clone(),
    );
    bus.publish_durable(
        &bus.subjects().command(&site, kind),
        &ev.id,
        &[],
        serde_json::to_vec(&ev).expect("json").into(),
    )
    .await
    .expect("publish");
    cmd.command_id
}

/// Makes a boot entry for `mac` through `site.bootEntry.set` and waits
/// until `boot` sees it.
pub async fn entry(env: &TestEnv, boot: &Boot, mac: &str) {
    command(
        env,
        "site.bootEntry.set",
        json!({"bootEntry": {"macs": [mac], "kernel": "ramdisk/vmlinuz", "initrd": "ramdisk/initrd.img",
            "cmdline": "console=ttyS0 bcm.join=tok-123", "expiresInSecs": 600}}),
    )
    .await;
    let m = bcm_boot::entries::Mac::parse(mac).expect("mac");
    for _ in 0..200 {
        if boot.running.entries.live(&m).is_some() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the boot entry of {mac} never arrived");
}

/// What a PXE request says about its client.
#[derive(Clone)]
pub struct Request {
    pub mac: [u8; 6],
    pub kind: MessageType,
    pub vendor: Option<&'static str>,
    pub arch: Option<u16>,
    pub user_class: Option<&'static str>,
    pub giaddr: Ipv4Addr,
    pub xid: u32,
}

impl Request {
    pub fn pxe(mac: [u8; 6], arch: u16) -> Request {
        Request {
            mac,
            kind: MessageType::Discover,
            vendor: Some(if arch == 0 {
                "PXEClient:Arch:00000:UNDI:002001"
            } else {
                "PXEClient:Arch:00007:UNDI:003000"
            }),
            arch: Some(arch),
            user_class: None,
            giaddr: Ipv4Addr::UNSPECIFIED,
            xid: 0x1234_5678,
        }
    }

    pub fn bytes(&self) -> Vec<u8> {
        let mut m = Message::new_with_id(
            self.xid,
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            self.giaddr,
            &self.mac,
        );
        m.set_opcode(Opcode::BootRequest).set_htype(HType::Eth);
        let mut opts = DhcpOptions::new();
        opts.insert(DhcpOption::MessageType(self.kind));
        if let Some(v) = self.vendor {
            opts.insert(DhcpOption::ClassIdentifier(v.as_bytes().to_vec()));
        }
        if let Some(a) = self.arch {
            opts.insert(DhcpOption::ClientSystemArchitecture(Architecture::from(a)));
        }
        if let Some(u) = self.user_class {
            opts.insert(DhcpOption::UserClass(u.as_bytes().to_vec()));
        }
        opts.insert(DhcpOption::ClientMachineIdentifier(vec![0; 17]));
        m.set_opts(opts);
        let mut out = vec![];
        m.encode(&mut Encoder::new(&mut out)).expect("encode");
        out
    }
}

/// A scripted PXE client on 127.0.0.1.
pub struct Client {
    pub socket: UdpSocket,
}

impl Client {
    pub async fn new() -> Client {
        Client {
            socket: UdpSocket::bind("127.0.0.1:0").await.expect("client socket"),
        }
    }

    pub fn port(&self) -> u16 {
        self.socket.local_addr().expect("addr").port()
    }

    /// Sends `bytes` to `server`; the decoded reply, if one comes within
    /// `wait`.
    pub async fn ask(&self, server: SocketAddr, bytes: &[u8], wait: Duration) -> Option<Message> {
        self.socket.send_to(bytes, server).await.expect("send");
        let mut buf = vec![0u8; 2048];
        let (len, _) = tokio::time::timeout(wait, self.socket.recv_from(&mut buf))
            .await
            .ok()?
            .ok()?;
        Some(Message::decode(&mut Decoder::new(&buf[..len])).expect("a decodable reply"))
    }
}

/// The boot file name of a reply.
pub fn file(m: &Message) -> String {
    m.fname_str()
        .and_then(Result::ok)
        .unwrap_or_default()
        .trim_end_matches('\0')
        .to_owned()
}

/// Option 60 of a reply.
pub fn vendor(m: &Message) -> String {
    match m.opts().get(OptionCode::ClassIdentifier) {
        Some(DhcpOption::ClassIdentifier(v)) => String::from_utf8_lossy(v).into_owned(),
        _ => String::new(),
    }
}
