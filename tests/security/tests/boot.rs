//! Boot without leaks (issue 18, finding 3), against a real boot service on
//! loopback and real DHCP packets:
//! - naming a MAC over HTTP yields nothing: the iPXE script (with the join
//!   token on its kernel line) is served only behind the one-time link a
//!   proxy DHCP answer named, once;
//! - one site's machines cannot take each other's boot entries: a MAC is
//!   unique within a site, a set or clear for a MAC another node's live
//!   entry holds is `CONFLICT` and changes nothing, and enrolling a MAC
//!   another node of the site holds (in any spelling) is refused.

use bcm_contracts::commands::{BootEntryClearParams, BootEntrySetParams, BootEntrySpec};
use bcm_contracts::{CloudEvent, Command, CommandEnvelope, CommandResult};
use bcm_testkit::TestEnv;
use futures::StreamExt;
use serde_json::json;
use std::net::Ipv4Addr;
use std::time::Duration;

const MAC: &str = "52:54:00:5e:c0:01";
const TOKEN: &str = "bcmj_secret-of-node-a";

struct Scratch(std::path::PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn boot_service(
    env: &TestEnv,
) -> (
    Scratch,
    bcm_boot::Running,
    tokio_util::sync::CancellationToken,
) {
    let dir = std::env::temp_dir().join(format!(
        "bcm-security-boot-{}-{}",
        std::process::id(),
        ulid::Ulid::new()
    ));
    std::fs::create_dir_all(dir.join("boot")).expect("boot dir");
    let cfg = bcm_boot::BootConfig {
        site: "s1".into(),
        bus: env.bus_config.clone(),
        server_ip: Ipv4Addr::LOCALHOST,
        dhcp: bcm_boot::DhcpConfig {
            listen: Ipv4Addr::LOCALHOST,
            interface: None,
            port: 0,
            pxe_port: 0,
            client_port: 9,
            broadcast: Ipv4Addr::LOCALHOST,
        },
        tftp_listen: "127.0.0.1:0".parse().expect("addr"),
        boot_files: dir.join("boot"),
        bios_file: "undionly.kpxe".into(),
        uefi_x64_file: "ipxe.efi".into(),
        uefi_arm64_file: "ipxe-arm64.efi".into(),
        http_listen: "127.0.0.1:0".parse().expect("addr"),
        http_port: None,
        script_link_ttl_secs: 120,
        join_key: bcm_pki::JoinKeyConfig::with_key(env.join_key.for_site("s1")),
        lease_ttl_secs: 3,
        holder: Some("security".into()),
        image_cache: dir.join("cache"),
        images: vec![],
        http_proxy: None,
        upstream_proxy: None,
        telemetry: Default::default(),
        quorum_anchor_file: None,
    };
    let stop = tokio_util::sync::CancellationToken::new();
    let running = bcm_boot::start(&cfg, stop.clone())
        .await
        .expect("boot service");
    for _ in 0..200 {
        if running.lease.is_active() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(running.lease.is_active(), "the boot service took the lease");
    (Scratch(dir), running, stop)
}

/// Sends a `site.*` command for `node` and waits for its result.
async fn site_command(
    env: &TestEnv,
    node: Option<bcm_core::NodeId>,
    command: Command,
) -> CommandResult {
    let site: bcm_core::SiteId = "s1".parse().expect("site");
    let cmd = CommandEnvelope {
        command_id: format!("cmd_{}", ulid::Ulid::new().to_string().to_lowercase()),
        site_id: site.clone(),
        node_id: node,
        command,
        issued_at: chrono::Utc::now(),
        deadline: None,
        authority: None,
    };
    let mut results = env
        .state
        .inner
        .bus
        .client()
        .subscribe(env.subjects().result(&site, &cmd.command_id))
        .await
        .expect("subscribe");
    let ev = CloudEvent::new(
        format!("cmd-{}", cmd.command_id),
        bcm_contracts::events::types::command(cmd.kind()),
        None,
        None,
        cmd.clone(),
    );
    env.publish_raw(
        &env.subjects().command(&site, cmd.kind().as_str()),
        &serde_json::to_vec(&ev).expect("json"),
    )
    .await
    .expect("publish");
    let msg = tokio::time::timeout(Duration::from_secs(20), results.next())
        .await
        .expect("a result in time")
        .expect("a result");
    let ev: CloudEvent<CommandResult> = serde_json::from_slice(&msg.payload).expect("result");
    ev.data
}

fn set(mac: &str, cmdline: &str) -> Command {
    Command::BootEntrySet(BootEntrySetParams {
        boot_entry: BootEntrySpec {
            macs: vec![mac.to_owned()],
            kernel: "ramdisk/vmlinuz".into(),
            initrd: "ramdisk/initrd.img".into(),
            cmdline: cmdline.to_owned(),
            expires_in_secs: 600,
        },
    })
}

fn node() -> bcm_core::NodeId {
    bcm_core::NodeId::generate()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mac_alone_or_a_replayed_link_yields_no_script() {
    let env = TestEnv::start().await.expect("env");
    let (_dir, boot, _stop) = boot_service(&env).await;
    let r = site_command(&env, Some(node()), set(MAC, &format!("bcm.join={TOKEN}"))).await;
    assert!(r.ok, "{r:?}");
    let mac = bcm_boot::entries::Mac::parse(MAC).expect("mac");
    bcm_testkit::eventually(Duration::from_secs(10), || async {
        Ok(boot.entries.live(&mac).map(|_| ()))
    })
    .await
    .expect("the entry arrived");
    let http = reqwest::Client::new();
    let base = format!("http://{}", boot.http);
    let fetch = |url: String| {
        let http = http.clone();
        async move {
            let r = http.get(&url).send().await.expect("answered");
            (r.status().as_u16(), r.text().await.expect("body"))
        }
    };

    // The attacker names the MAC, in every spelling, and guesses links.
    for guess in [
        format!("{base}/ipxe/{MAC}"),
        format!("{base}/ipxe/525400"),
        format!("{base}/ipxe/5254005ec001"),
        format!("{base}/ipxe/52-54-00-5E-C0-01"),
        format!("{base}/ipxe/{}", "f".repeat(32)),
        format!("{base}/ipxe/"),
    ] {
        let (status, body) = fetch(guess.clone()).await;
        assert!(status == 404, "{guess}: {status} {body}");
        assert!(!body.contains(TOKEN), "{guess} leaked the token: {body}");
    }

    // The machine asks over DHCP, as iPXE does, and gets the script once.
    let link = bcm_sim::pxe::script_link(boot.pxe, MAC)
        .await
        .expect("a proxy DHCP answer");
    assert!(
        !link.contains("5e:c0:01") && !link.contains("5ec001"),
        "{link}"
    );
    let (status, script) = fetch(link.clone()).await;
    assert_eq!(status, 200, "{script}");
    assert!(
        script.contains(TOKEN),
        "the machine gets its token: {script}"
    );
    // Whoever replays the link (it crossed the boot network in the clear)
    // gets nothing.
    let (status, replayed) = fetch(link).await;
    assert_eq!(status, 404, "{replayed}");
    assert!(!replayed.contains(TOKEN), "{replayed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_nodes_entry_is_never_overwritten_or_cleared() {
    let env = TestEnv::start().await.expect("env");
    let (_dir, boot, _stop) = boot_service(&env).await;
    let (a, b) = (node(), node());
    let mac = bcm_boot::entries::Mac::parse(MAC).expect("mac");
    let r = site_command(&env, Some(a), set(MAC, "bcm.join=of-a")).await;
    assert!(r.ok, "{r:?}");

    // Node b's workflow (or a forged command) claims a's MAC, in another
    // spelling: refused, and a's entry stands.
    let r = site_command(&env, Some(b), set("52-54-00-5E-C0-01", "bcm.join=of-b")).await;
    assert!(!r.ok && !r.retryable, "{r:?}");
    assert!(
        r.error.as_deref().unwrap_or("").starts_with("CONFLICT"),
        "{r:?}"
    );
    let r = site_command(
        &env,
        Some(b),
        Command::BootEntryClear(BootEntryClearParams {
            macs: vec![MAC.into()],
        }),
    )
    .await;
    assert!(!r.ok, "b cleared a's entry: {r:?}");
    assert!(
        r.error.as_deref().unwrap_or("").starts_with("CONFLICT"),
        "{r:?}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let live = boot.entries.live(&mac).expect("a's entry stands");
    assert_eq!(live.node_id.as_deref(), Some(a.to_string().as_str()));
    assert_eq!(live.cmdline, "bcm.join=of-a");

    // a renews and clears its own; then b may take the MAC.
    let r = site_command(&env, Some(a), set(MAC, "bcm.join=of-a-again")).await;
    assert!(r.ok, "{r:?}");
    let r = site_command(
        &env,
        Some(a),
        Command::BootEntryClear(BootEntryClearParams {
            macs: vec![MAC.into()],
        }),
    )
    .await;
    assert!(r.ok, "{r:?}");
    let r = site_command(&env, Some(b), set(MAC, "bcm.join=of-b")).await;
    assert!(r.ok, "{r:?}");
    bcm_testkit::eventually(Duration::from_secs(10), || async {
        match boot.entries.live(&mac) {
            Some(e) if e.node_id == Some(b.to_string()) => Ok(Some(())),
            _ => Ok(None),
        }
    })
    .await
    .expect("b's entry");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mac_is_enrolled_once_per_site() {
    let env = TestEnv::start().await.expect("env");
    let enroll = |address: String, mac: &'static str| {
        let env = &env;
        async move {
            env.post(
                "/api/compute/metal/enroll",
                Some(&env.admin_token),
                &json!({"tenantId": "a", "poolId": "a-pool", "macs": [mac],
                    "hardwareProfile": "sim", "bmc": {"driver": "sim", "address": address, "username": "admin", "password": "pw"}}),
            )
            .await
            .expect("answered")
        }
    };
    let (s, first) = enroll("sim://mac-1".into(), "52:54:00:5e:c0:02").await;
    assert_eq!(s, 200, "{first}");
    let nodes_before = env
        .get(
            "/api/compute/metal/nodes?tenantId=a",
            Some(&env.admin_token),
        )
        .await
        .expect("list");
    let (s, second) = enroll("sim://mac-2".into(), "52:54:00:5E:C0:02").await;
    assert_eq!(s, 409, "{second}");
    assert_eq!(second["code"], "CONFLICT", "{second}");
    let nodes_after = env
        .get(
            "/api/compute/metal/nodes?tenantId=a",
            Some(&env.admin_token),
        )
        .await
        .expect("list");
    assert_eq!(nodes_before, nodes_after, "nothing was stored");
    // Another MAC is fine.
    let (s, third) = enroll("sim://mac-3".into(), "52:54:00:5e:c0:03").await;
    assert_eq!(s, 200, "{third}");
}
