//! Proxy DHCP over real UDP sockets with a scripted PXE client: answers
//! carry no address and name the right boot file per firmware; non-PXE
//! clients, unknown MACs, cleared entries and garbage get no answer; the
//! decision function survives 10,000 random, truncated and oversized
//! packets, and so does the running server.

mod support;

use dhcproto::v4::{DhcpOption, MessageType, OptionCode};
use proptest::prelude::*;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Duration;
use support::{entry, file, vendor, Client, Request};

const ANSWER: Duration = Duration::from_secs(2);
const SILENCE: Duration = Duration::from_millis(700);
const MAC: [u8; 6] = [0x52, 0x54, 0x00, 0xaa, 0x00, 0x01];
const MAC_TEXT: &str = "52:54:00:aa:00:01";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pxe_clients_with_an_entry_get_a_proxy_answer_and_never_an_address() {
    let env = bcm_testkit::TestEnv::start().await.expect("env");
    let client = Client::new().await;
    let (_dir, boot) = support::started(&env, "dhcp", client.port()).await;
    boot.active().await;
    let dhcp = boot.running.dhcp;
    let pxe = boot.running.pxe;

    // No entry yet: silence.
    assert!(client
        .ask(dhcp, &Request::pxe(MAC, 0).bytes(), SILENCE)
        .await
        .is_none());
    entry(&env, &boot, MAC_TEXT).await;

    // BIOS PXE DISCOVER → OFFER with undionly.kpxe over TFTP.
    let offer = client
        .ask(dhcp, &Request::pxe(MAC, 0).bytes(), ANSWER)
        .await
        .expect("an offer");
    assert_eq!(offer.opts().msg_type(), Some(MessageType::Offer));
    assert_eq!(offer.yiaddr(), Ipv4Addr::UNSPECIFIED, "never an address");
    assert_eq!(
        offer.siaddr(),
        Ipv4Addr::LOCALHOST,
        "next-server always set"
    );
    assert_eq!(offer.xid(), 0x1234_5678);
    assert_eq!(&offer.chaddr()[..6], &MAC);
    assert_eq!(file(&offer), "undionly.kpxe");
    assert_eq!(vendor(&offer), "PXEClient");
    assert!(matches!(
        offer.opts().get(OptionCode::VendorExtensions),
        Some(DhcpOption::VendorExtensions(v)) if v == &vec![6, 1, 8, 255]
    ));
    assert!(matches!(
        offer.opts().get(OptionCode::ServerIdentifier),
        Some(DhcpOption::ServerIdentifier(ip)) if *ip == Ipv4Addr::LOCALHOST
    ));

    // UEFI x64 REQUEST on 4011 → ACK with ipxe.efi, back to the sender.
    let mut req = Request::pxe(MAC, 7);
    req.kind = MessageType::Request;
    let ack = client
        .ask(pxe, &req.bytes(), ANSWER)
        .await
        .expect("an ack on 4011");
    assert_eq!(ack.opts().msg_type(), Some(MessageType::Ack));
    assert_eq!(ack.yiaddr(), Ipv4Addr::UNSPECIFIED);
    assert_eq!(file(&ack), "ipxe.efi");

    // iPXE itself (user class iPXE) → its script over HTTP, no loop,
    // behind a link of its own: never the MAC, never the same twice.
    let mut ipxe = Request::pxe(MAC, 0);
    ipxe.user_class = Some("iPXE");
    let script = client
        .ask(dhcp, &ipxe.bytes(), ANSWER)
        .await
        .expect("an offer to iPXE");
    let prefix = format!("http://127.0.0.1:{}/ipxe/", boot.running.http.port());
    let link = file(&script);
    let nonce = link.strip_prefix(&prefix).expect("a script link");
    assert_eq!(nonce.len(), 32, "{link}");
    assert!(nonce.chars().all(|c| c.is_ascii_hexdigit()), "{link}");
    assert!(!link.contains(MAC_TEXT) && !link.contains("525400aa0001"));
    assert_eq!(script.siaddr(), Ipv4Addr::LOCALHOST);
    let again = client
        .ask(dhcp, &ipxe.bytes(), ANSWER)
        .await
        .expect("a second offer to iPXE");
    assert_ne!(file(&again), link, "each answer has its own link");

    // UEFI HTTP boot (HTTPClient, arch 16) → an HTTP URL of ipxe.efi.
    let mut http = Request::pxe(MAC, 16);
    http.vendor = Some("HTTPClient:Arch:00016:UNDI:003001");
    let h = client
        .ask(dhcp, &http.bytes(), ANSWER)
        .await
        .expect("an offer to an HTTP boot client");
    assert_eq!(vendor(&h), "HTTPClient");
    assert_eq!(
        file(&h),
        format!(
            "http://127.0.0.1:{}/boot/ipxe.efi",
            boot.running.http.port()
        )
    );

    // Not a PXE client, another MAC, an unknown architecture: silence.
    let mut plain = Request::pxe(MAC, 0);
    plain.vendor = Some("MSFT 5.0");
    assert!(client.ask(dhcp, &plain.bytes(), SILENCE).await.is_none());
    let mut no_vendor = Request::pxe(MAC, 0);
    no_vendor.vendor = None;
    assert!(client
        .ask(dhcp, &no_vendor.bytes(), SILENCE)
        .await
        .is_none());
    let other = Request::pxe([0x52, 0x54, 0, 0xaa, 0, 0x02], 0);
    assert!(client.ask(dhcp, &other.bytes(), SILENCE).await.is_none());
    let mut release = Request::pxe(MAC, 0);
    release.kind = MessageType::Release;
    assert!(client.ask(dhcp, &release.bytes(), SILENCE).await.is_none());

    // Cleared: silence again.
    support::command(
        &env,
        "site.bootEntry.clear",
        serde_json::json!({"macs": [MAC_TEXT]}),
    )
    .await;
    let m = bcm_boot::entries::Mac::parse(MAC_TEXT).expect("mac");
    for _ in 0..100 {
        if boot.running.entries.live(&m).is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(client
        .ask(dhcp, &Request::pxe(MAC, 0).bytes(), SILENCE)
        .await
        .is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ipxe_script_opens_once_behind_its_link_and_never_by_mac() {
    let env = bcm_testkit::TestEnv::start().await.expect("env");
    let client = Client::new().await;
    let (_dir, boot) = support::started(&env, "script", client.port()).await;
    boot.active().await;
    entry(&env, &boot, MAC_TEXT).await;
    let base = format!("http://{}", boot.running.http);
    let http = reqwest::Client::new();
    let get = |url: String| {
        let http = http.clone();
        async move {
            let r = http.get(url).send().await.expect("script");
            let status = r.status().as_u16();
            (status, r.text().await.expect("text"))
        }
    };
    let mut ipxe = Request::pxe(MAC, 0);
    ipxe.user_class = Some("iPXE");
    let link = file(
        &client
            .ask(boot.running.dhcp, &ipxe.bytes(), ANSWER)
            .await
            .expect("an offer to iPXE"),
    );

    // The MAC alone, in any spelling, and a made-up link: nothing.
    for guess in [
        format!("{base}/ipxe/{MAC_TEXT}"),
        format!("{base}/ipxe/525400aa0001"),
        format!("{base}/ipxe/{}", "0".repeat(32)),
    ] {
        let (status, body) = get(guess.clone()).await;
        assert_eq!(status, 404, "{guess}: {body}");
        assert!(
            !body.contains("tok-123") && !body.contains("kernel"),
            "{body}"
        );
        assert!(body.trim_end().ends_with("exit"), "{body}");
    }

    // The link: the script, once.
    let (status, body) = get(link.clone()).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.starts_with("#!ipxe\n"), "{body}");
    assert!(
        body.contains(&format!(
            "kernel {base}/images/ramdisk/vmlinuz initrd=initrd.img console=ttyS0 bcm.join=tok-123"
        )),
        "{body}"
    );
    assert!(body.contains(&format!("initrd {base}/images/ramdisk/initrd.img\n")));
    assert!(body.trim_end().ends_with("boot"));
    let (status, replayed) = get(link).await;
    assert_eq!(status, 404, "a replayed link: {replayed}");
    assert!(!replayed.contains("tok-123"), "{replayed}");

    // A link made for an entry that was replaced since opens nothing.
    let stale = file(
        &client
            .ask(boot.running.dhcp, &ipxe.bytes(), ANSWER)
            .await
            .expect("an offer to iPXE"),
    );
    let m = bcm_boot::entries::Mac::parse(MAC_TEXT).expect("mac");
    let before = boot.running.entries.live(&m).expect("entry").expires_at;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    entry(&env, &boot, MAC_TEXT).await;
    for _ in 0..200 {
        if boot
            .running
            .entries
            .live(&m)
            .is_some_and(|e| e.expires_at != before)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let (status, body) = get(stale).await;
    assert_eq!(status, 404, "a link of a replaced entry: {body}");

    // UEFI HTTP boot fetches the same files as TFTP, with the same checks.
    let efi = http
        .get(format!("{base}/boot/ipxe.efi"))
        .send()
        .await
        .expect("efi");
    assert_eq!(efi.status(), 200);
    assert_eq!(efi.bytes().await.expect("bytes").len(), 850_528);
    let out = http
        .get(format!("{base}/boot/..%2F..%2Fetc%2Fpasswd"))
        .send()
        .await
        .expect("escape");
    assert!(
        out.status() == 403 || out.status() == 404,
        "{}",
        out.status()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_gets_no_answer_and_no_crash() {
    let env = bcm_testkit::TestEnv::start().await.expect("env");
    let client = Client::new().await;
    let (_dir, boot) = support::started(&env, "garbage", client.port()).await;
    boot.active().await;
    entry(&env, &boot, MAC_TEXT).await;
    let valid = Request::pxe(MAC, 0).bytes();
    let mut rng: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for i in 0..10_000usize {
        let packet: Vec<u8> = match i % 4 {
            0 => (0..(next() % 600) as usize).map(|_| next() as u8).collect(),
            1 => valid[..(next() as usize % valid.len())].to_vec(),
            2 => {
                let mut p = valid.clone();
                for _ in 0..4 {
                    let at = next() as usize % p.len();
                    p[at] = next() as u8;
                }
                p
            }
            _ => vec![next() as u8; 1500 + (next() % 8000) as usize],
        };
        let _ = client.socket.send_to(&packet, boot.running.dhcp).await;
        let _ = client.socket.send_to(&packet, boot.running.pxe).await;
    }
    // Drain whatever the mutated-but-valid packets earned; none has an address.
    let mut buf = vec![0u8; 2048];
    while let Ok(Ok((len, _))) = tokio::time::timeout(
        Duration::from_millis(500),
        client.socket.recv_from(&mut buf),
    )
    .await
    {
        use dhcproto::Decodable as _;
        let m = dhcproto::v4::Message::decode(&mut dhcproto::Decoder::new(&buf[..len]))
            .expect("our replies decode");
        assert_eq!(m.yiaddr(), Ipv4Addr::UNSPECIFIED);
    }
    // Still serving.
    let offer = client
        .ask(boot.running.dhcp, &valid, ANSWER)
        .await
        .expect("the server still answers");
    assert_eq!(offer.yiaddr(), Ipv4Addr::UNSPECIFIED);
}

fn proxy() -> bcm_boot::dhcp::ProxyConfig {
    bcm_boot::dhcp::ProxyConfig {
        server_ip: Ipv4Addr::new(10, 77, 0, 3),
        http_port: 8081,
        bios_file: "undionly.kpxe".into(),
        uefi_x64_file: "ipxe.efi".into(),
        uefi_arm64_file: "ipxe-arm64.efi".into(),
        client_port: 68,
    }
}

fn from() -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 68)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 10_000, .. ProptestConfig::default() })]

    /// Any bytes at all: no panic, and any reply offers no address.
    #[test]
    fn any_datagram_is_answered_without_an_address_or_not_at_all(bytes in proptest::collection::vec(any::<u8>(), 0..2000)) {
        for port in [bcm_boot::dhcp::Port::Dhcp, bcm_boot::dhcp::Port::Pxe] {
            if let Ok(r) = bcm_boot::dhcp::answer(&proxy(), &bytes, port, from(), |_| true, |_| Some("n".into())) {
                use dhcproto::Decodable as _;
                let m = dhcproto::v4::Message::decode(&mut dhcproto::Decoder::new(&r.bytes)).expect("decodes");
                prop_assert_eq!(m.yiaddr(), Ipv4Addr::UNSPECIFIED);
            }
        }
    }

    /// A valid DISCOVER with bytes flipped: still never an address, and a
    /// non-PXE vendor class is never answered.
    #[test]
    fn mutated_discovers_never_get_an_address(flips in proptest::collection::vec((0usize..400, any::<u8>()), 1..8), arch in 0u16..20) {
        let mut p = Request::pxe(MAC, arch).bytes();
        for (at, v) in flips {
            let i = at % p.len();
            p[i] = v;
        }
        if let Ok(r) = bcm_boot::dhcp::answer(&proxy(), &p, bcm_boot::dhcp::Port::Dhcp, from(), |_| true, |_| Some("n".into())) {
            use dhcproto::Decodable as _;
            let m = dhcproto::v4::Message::decode(&mut dhcproto::Decoder::new(&r.bytes)).expect("decodes");
            prop_assert_eq!(m.yiaddr(), Ipv4Addr::UNSPECIFIED);
            prop_assert_eq!(m.siaddr(), Ipv4Addr::new(10, 77, 0, 3));
        }
    }
}

#[test]
fn relayed_requests_go_back_to_the_relay() {
    let mut req = Request::pxe(MAC, 0);
    req.giaddr = Ipv4Addr::new(10, 1, 2, 1);
    let r = bcm_boot::dhcp::answer(
        &proxy(),
        &req.bytes(),
        bcm_boot::dhcp::Port::Dhcp,
        from(),
        |_| true,
        |_| Some("n".into()),
    )
    .expect("answered");
    assert_eq!(r.to, SocketAddrV4::new(Ipv4Addr::new(10, 1, 2, 1), 67));
    let direct = bcm_boot::dhcp::answer(
        &proxy(),
        &Request::pxe(MAC, 0).bytes(),
        bcm_boot::dhcp::Port::Dhcp,
        from(),
        |_| true,
        |_| Some("n".into()),
    )
    .expect("answered");
    assert_eq!(direct.to, SocketAddrV4::new(Ipv4Addr::BROADCAST, 68));
    // arm64 UEFI gets its own build.
    let arm = bcm_boot::dhcp::answer(
        &proxy(),
        &Request::pxe(MAC, 11).bytes(),
        bcm_boot::dhcp::Port::Dhcp,
        from(),
        |_| true,
        |_| Some("n".into()),
    )
    .expect("answered");
    assert_eq!(arm.file, "ipxe-arm64.efi");
}
