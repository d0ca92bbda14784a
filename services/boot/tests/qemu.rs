//! Real PXE boots through our boot service, in network namespaces this test
//! creates (root): a LAN bridge with two taps, `dnsmasq` in its own
//! namespace handing out addresses and IPv6 router advertisements only, and
//! `bcm-boot` in another, bound to 67/4011/69/HTTP on 10.77.0.3 (it reaches
//! the test's NATS through a veth to the host and a TCP forwarder).
//!
//! - BIOS (SeaBIOS + QEMU's iPXE ROM): our proxy offer sends iPXE straight to
//!   its script over HTTP; the kernel and initrd come from our pre-warmed
//!   image cache; the ramdisk prints the marker from its command line.
//! - At the same time a VM whose MAC has no entry gets no offer from us and
//!   never boots the ramdisk.
//! - UEFI native PXE (OVMF with the NIC ROM removed): `ipxe.efi` over our
//!   TFTP, then iPXE, the script and the ramdisk. (Our offer carries PXE
//!   discovery control 8, so OVMF takes the boot file from it and does not
//!   need port 4011; the packet tests cover 4011.)
//!
//! QEMU runs under TCG (KVM here is PVM-backed and hangs Debian kernels).
//! `tests/boot-e2e/build.sh` installs QEMU, OVMF, iPXE and dnsmasq and
//! builds the kernel and initramfs; the test command runs it.

mod support;

use sha2::Digest as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn sh(cmd: &str) -> Output {
    let o = Command::new("bash")
        .args(["-c", cmd])
        .output()
        .expect("bash");
    assert!(
        o.status.success(),
        "{cmd}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// Everything the test started, torn down on drop even when it fails.
struct Topology {
    lan: String,
    dhcp: String,
    boot: String,
    host_veth: String,
    children: Vec<Child>,
}

impl Topology {
    fn new(tag: u32) -> Topology {
        let t = Topology {
            lan: format!("bcml{tag}"),
            dhcp: format!("bcmd{tag}"),
            boot: format!("bcmb{tag}"),
            host_veth: format!("bcmh{tag}"),
            children: vec![],
        };
        t.teardown_net();
        let (lan, dhcp, boot, hv) = (&t.lan, &t.dhcp, &t.boot, &t.host_veth);
        let net = tag % 250;
        sh(&format!(
            "set -e
            ip netns add {lan}; ip netns add {dhcp}; ip netns add {boot}
            ip -n {lan} link set lo up
            ip -n {lan} link add br0 type bridge; ip -n {lan} link set br0 up
            for h in {dhcp} {boot}; do
              ip link add v-$h netns {lan} type veth peer name eth0 netns $h
              ip -n {lan} link set v-$h master br0 up
              ip -n $h link set lo up; ip -n $h link set eth0 up
            done
            ip -n {dhcp} addr add 10.77.0.2/24 dev eth0
            ip -n {dhcp} addr add fd77::2/64 dev eth0 nodad
            ip -n {boot} addr add 10.77.0.3/24 dev eth0
            for tap in tap0 tap1; do
              ip -n {lan} tuntap add $tap mode tap
              ip -n {lan} link set $tap master br0 up
            done
            ip link add {hv} type veth peer name up0 netns {boot}
            ip addr add 10.78.{net}.1/30 dev {hv}; ip link set {hv} up
            ip -n {boot} addr add 10.78.{net}.2/30 dev up0; ip -n {boot} link set up0 up"
        ));
        t
    }

    fn host_ip(&self, tag: u32) -> String {
        format!("10.78.{}.1", tag % 250)
    }

    fn teardown_net(&self) {
        let _ = Command::new("bash")
            .args([
                "-c",
                &format!(
                    "ip netns del {} 2>/dev/null; ip netns del {} 2>/dev/null; ip netns del {} 2>/dev/null; ip link del {} 2>/dev/null; true",
                    self.lan, self.dhcp, self.boot, self.host_veth
                ),
            ])
            .status();
    }

    fn spawn(&mut self, ns: &str, args: &[&str], log: &Path) -> usize {
        let log = std::fs::File::create(log).expect("log");
        let child = Command::new("ip")
            .args(["netns", "exec", ns])
            .args(args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawn");
        self.children.push(child);
        self.children.len() - 1
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.teardown_net();
    }
}

/// Forwards TCP from `listen` (the host end of the veth) to `to` (NATS).
async fn forward(listen: String, to: String) -> String {
    let l = tokio::net::TcpListener::bind(format!("{listen}:0"))
        .await
        .expect("forwarder");
    let addr = l.local_addr().expect("addr").to_string();
    tokio::spawn(async move {
        while let Ok((mut a, _)) = l.accept().await {
            let to = to.clone();
            tokio::spawn(async move {
                if let Ok(mut b) = tokio::net::TcpStream::connect(&to).await {
                    let _ = tokio::io::copy_bidirectional(&mut a, &mut b).await;
                }
            });
        }
    });
    addr
}

fn sha256_hex(p: &Path) -> String {
    hex::encode(sha2::Sha256::digest(std::fs::read(p).expect("artifact")))
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

async fn wait_for(within: Duration, mut done: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < within {
        if done() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    done()
}

fn qemu(tap: &str, mac: &str, serial: &Path, uefi_vars: Option<&Path>) -> Vec<String> {
    // No `timeout` wrapper: `ip netns exec` execs QEMU itself, so the pid
    // the topology kills on drop is QEMU's (a wrapper would orphan it).
    let mut a: Vec<String> = [
        "qemu-system-x86_64",
        "-accel",
        "tcg",
        "-m",
        "512",
        "-smp",
        "1",
        "-nographic",
        "-monitor",
        "none",
        "-no-reboot",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    a.push("-serial".into());
    a.push(format!("file:{}", serial.display()));
    a.push("-netdev".into());
    a.push(format!("tap,id=n0,ifname={tap},script=no,downscript=no"));
    a.push("-device".into());
    match uefi_vars {
        None => {
            a.push(format!("virtio-net-pci,netdev=n0,mac={mac},bootindex=1"));
            a.extend(["-boot".into(), "n".into()]);
        }
        Some(vars) => {
            // romfile= drops QEMU's iPXE ROM: OVMF's own PXE client runs.
            a.push(format!(
                "virtio-net-pci,netdev=n0,mac={mac},bootindex=1,romfile="
            ));
            a.extend([
                "-machine".into(),
                "q35".into(),
                "-drive".into(),
                "if=pflash,format=raw,readonly=on,file=/usr/share/OVMF/OVMF_CODE_4M.fd".into(),
                "-drive".into(),
                format!("if=pflash,format=raw,file={}", vars.display()),
            ]);
        }
    }
    a
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qemu_machines_pxe_boot_through_our_proxy_dhcp_tftp_and_http() {
    let art = std::env::var_os("BCM_PXE_E2E_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.bcm/boot-e2e"));
    for need in [
        art.join("vmlinuz"),
        art.join("initrd.img"),
        "/usr/lib/ipxe/ipxe.efi".into(),
        "/usr/share/OVMF/OVMF_CODE_4M.fd".into(),
    ] {
        assert!(
            need.exists(),
            "{} is missing: run tests/boot-e2e/build.sh (the test command does)",
            need.display()
        );
    }
    let env = bcm_testkit::TestEnv::start().await.expect("env");
    let dir = support::Scratch::new("qemu");
    let tag = std::process::id() % 10_000;
    let mut topo = Topology::new(tag);
    let d = &dir.0;

    // The forwarder takes the server's address; the service brings the
    // credentials the test's URL carries.
    let (server, user) = bcm_bus::split_credentials(&env.bus_config.url);
    let nats = server.trim_start_matches("nats://").to_owned();
    let relay = forward(topo.host_ip(tag), nats).await;
    let creds = user
        .map(|(name, password)| format!("{name}:{password}@"))
        .unwrap_or_default();

    std::fs::write(
        d.join("dnsmasq.conf"),
        format!(
            "port=0\ninterface=eth0\nbind-interfaces\ndhcp-range=10.77.0.100,10.77.0.150,255.255.255.0,10m\n\
             dhcp-leasefile={}/dnsmasq.leases\nlog-dhcp\nenable-ra\ndhcp-range=::,constructor:eth0,ra-only\n",
            d.display()
        ),
    )
    .expect("dnsmasq.conf");
    let dnsmasq_conf = d.join("dnsmasq.conf").display().to_string();
    let dnsmasq_log = format!("--log-facility={}/dnsmasq.log", d.display());
    let dhcp_ns = topo.dhcp.clone();
    topo.spawn(
        &dhcp_ns,
        &[
            "dnsmasq",
            "-k",
            "-u",
            "root",
            "-C",
            &dnsmasq_conf,
            &dnsmasq_log,
        ],
        &d.join("dnsmasq.out"),
    );

    // Debian's ipxe.efi is a symlink to /boot, which TFTP rightly refuses
    // (a link out of the root): serve copies, as a deployment would.
    let boot_files = d.join("tftp");
    std::fs::create_dir_all(&boot_files).expect("tftp root");
    for f in ["undionly.kpxe", "ipxe.efi", "snponly.efi"] {
        std::fs::copy(Path::new("/usr/lib/ipxe").join(f), boot_files.join(f)).expect("iPXE build");
    }
    let config = format!(
        r#"site = "s1"
server_ip = "10.77.0.3"
tftp_listen = "0.0.0.0:69"
http_listen = "0.0.0.0:8081"
boot_files = "{boot_files}"
image_cache = "{cache}"
lease_ttl_secs = 3
holder = "qemu-test"
[[images]]
name = "ramdisk/vmlinuz"
url = "file://{art}/vmlinuz"
sha256 = "{k}"
[[images]]
name = "ramdisk/initrd.img"
url = "file://{art}/initrd.img"
sha256 = "{i}"
[bus]
url = "nats://{creds}{relay}"
namespace = "{ns}"
[dhcp]
listen = "0.0.0.0"
interface = "eth0"
[telemetry]
log_format = "json"
log_filter = "info,bcm_boot=debug"
"#,
        cache = d.join("cache").display(),
        boot_files = boot_files.display(),
        art = art.display(),
        k = sha256_hex(&art.join("vmlinuz")),
        i = sha256_hex(&art.join("initrd.img")),
        ns = env.bus_config.namespace.clone().expect("namespace"),
    );
    std::fs::write(d.join("boot.toml"), config).expect("config");
    let boot_bin = env!("CARGO_BIN_EXE_bcm-boot");
    let boot_cfg = d.join("boot.toml").display().to_string();
    let boot_ns = topo.boot.clone();
    topo.spawn(
        &boot_ns,
        &[boot_bin, "--config", &boot_cfg],
        &d.join("boot.log"),
    );
    let boot_log = d.join("boot.log");
    assert!(
        wait_for(Duration::from_secs(30), || read(&boot_log)
            .contains("took the site boot lease"))
        .await,
        "the boot service did not start:\n{}",
        read(&boot_log)
    );

    let marker = format!("E2E-{}", bcm_core::CommandId::generate());
    support::command(
        &env,
        "site.bootEntry.set",
        serde_json::json!({"bootEntry": {"macs": ["52:54:00:77:00:01", "52:54:00:77:00:03"],
            "kernel": "ramdisk/vmlinuz", "initrd": "ramdisk/initrd.img",
            "cmdline": format!("console=ttyS0 bcm.marker={marker}"), "expiresInSecs": 900}}),
    )
    .await;
    assert!(
        wait_for(Duration::from_secs(20), || read(&boot_log)
            .contains("site command applied"))
        .await,
        "the boot entry was not applied:\n{}",
        read(&boot_log)
    );

    // BIOS with an entry, and a MAC without one, at the same time.
    let lan = topo.lan.clone();
    let started = Instant::now();
    let bios_serial = d.join("bios.serial");
    let bios = qemu("tap0", "52:54:00:77:00:01", &bios_serial, None);
    let bios_args: Vec<&str> = bios.iter().map(String::as_str).collect();
    let bios_vm = topo.spawn(&lan, &bios_args, &d.join("bios.qemu"));
    let stranger_serial = d.join("stranger.serial");
    let stranger = qemu("tap1", "52:54:00:77:00:02", &stranger_serial, None);
    let stranger_args: Vec<&str> = stranger.iter().map(String::as_str).collect();
    let stranger_vm = topo.spawn(&lan, &stranger_args, &d.join("stranger.qemu"));

    let booted = wait_for(Duration::from_secs(240), || {
        read(&bios_serial).contains(&format!("BCM-RAMDISK-UP {marker}"))
    })
    .await;
    assert!(
        booted,
        "the BIOS VM did not boot our ramdisk.\nserial:\n{}\nboot log:\n{}\ndnsmasq:\n{}",
        read(&bios_serial),
        read(&boot_log),
        read(&d.join("dnsmasq.log"))
    );
    eprintln!(
        "BIOS: ramdisk up {:?} after QEMU started",
        started.elapsed()
    );
    let log = read(&boot_log);
    assert!(
        log.contains("52:54:00:77:00:01") && log.contains("proxy DHCP answer"),
        "{log}"
    );
    assert!(log.contains("iPXE script served"), "{log}");
    // The stranger keeps trying for a while; it never gets our answer.
    let left = Duration::from_secs(30).saturating_sub(started.elapsed());
    tokio::time::sleep(left).await;
    let _ = topo.children[stranger_vm].kill();
    let _ = topo.children[bios_vm].kill();
    assert!(
        !read(&stranger_serial).contains("BCM-RAMDISK-UP"),
        "the stranger booted"
    );
    let log = read(&boot_log);
    assert!(
        !log.lines()
            .any(|l| l.contains("proxy DHCP answer") && l.contains("52:54:00:77:00:02")),
        "we answered a MAC without an entry"
    );

    // UEFI native PXE: 4011, TFTP ipxe.efi, then iPXE and the script.
    let vars = d.join("uefi.vars.fd");
    std::fs::copy("/usr/share/OVMF/OVMF_VARS_4M.fd", &vars).expect("OVMF vars");
    let uefi_serial = d.join("uefi.serial");
    let uefi = qemu("tap0", "52:54:00:77:00:03", &uefi_serial, Some(&vars));
    let uefi_args: Vec<&str> = uefi.iter().map(String::as_str).collect();
    let started = Instant::now();
    topo.spawn(&lan, &uefi_args, &d.join("uefi.qemu"));
    let booted = wait_for(Duration::from_secs(240), || {
        read(&uefi_serial).contains(&format!("BCM-RAMDISK-UP {marker}"))
    })
    .await;
    assert!(
        booted,
        "the UEFI VM did not boot our ramdisk.\nserial:\n{}\nboot log:\n{}",
        read(&uefi_serial),
        read(&boot_log)
    );
    eprintln!(
        "UEFI native PXE: ramdisk up {:?} after QEMU started",
        started.elapsed()
    );
    let log = read(&boot_log);
    assert!(
        log.lines()
            .any(|l| l.contains("TFTP read") && l.contains("ipxe.efi")),
        "ipxe.efi came over our TFTP: {log}"
    );
    assert!(
        log.lines().any(|l| l.contains("proxy DHCP answer")
            && l.contains("52:54:00:77:00:03")
            && l.contains(r#""file":"ipxe.efi""#)),
        "OVMF was offered ipxe.efi: {log}"
    );
}
