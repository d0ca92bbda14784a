//! Proxy DHCP decisions, pure: a received datagram in, at most one reply
//! out. It answers only PXE (`PXEClient…`) and UEFI HTTP boot
//! (`HTTPClient…`) clients whose MAC has a live boot entry, never offers an
//! address (`yiaddr` is always 0.0.0.0), always names itself as next server
//! (`siaddr`; Debian's iPXE ignores an offer without it) and picks the boot
//! file by client architecture (option 93). A client already running iPXE
//! (user class `iPXE`, or option 175) gets the HTTP URL of its script, so
//! there is no chain-loading loop; that URL carries a per-boot nonce the
//! caller mints ([`crate::nonces`]), never the MAC. Everything else is dropped with a reason.

use dhcproto::v4::{DhcpOption, DhcpOptions, HType, Message, MessageType, Opcode, OptionCode};
use dhcproto::{Decodable, Decoder, Encodable, Encoder};
use std::net::{Ipv4Addr, SocketAddrV4};

use crate::entries::Mac;

/// The largest datagram considered (a DHCP message fits one Ethernet frame).
pub const MAX_PACKET: usize = 1500;

/// Which socket a request arrived on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Port {
    /// The DHCP server port (67): DISCOVER and REQUEST, answered by broadcast.
    Dhcp,
    /// The PXE boot server port (4011): REQUEST/INFORM, answered to the sender.
    Pxe,
}

/// Where this server is and what it serves.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// Our address on the boot network: `siaddr`, option 54, and the host of
    /// every URL.
    pub server_ip: Ipv4Addr,
    /// The HTTP port of the boot service.
    pub http_port: u16,
    /// TFTP boot files per firmware.
    pub bios_file: String,
    pub uefi_x64_file: String,
    pub uefi_arm64_file: String,
    /// The client port replies go to (68; configurable for tests).
    pub client_port: u16,
}

impl ProxyConfig {
    fn http(&self, path: &str) -> String {
        format!("http://{}:{}{path}", self.server_ip, self.http_port)
    }

    /// The iPXE script URL behind the per-boot `nonce`.
    pub fn script_url(&self, nonce: &str) -> String {
        self.http(&format!("/ipxe/{nonce}"))
    }
}

/// Why a datagram got no answer (for the log line and the counters).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Drop {
    #[error("not a DHCP message: {0}")]
    Malformed(String),
    #[error("not a BOOTREQUEST")]
    NotRequest,
    #[error("not an Ethernet client hardware address")]
    NotEthernet,
    #[error("not a PXE or HTTP boot client (option 60 {0:?})")]
    NotPxe(String),
    #[error("message type {0:?} is not answered by a proxy")]
    Ignored(String),
    #[error("no live boot entry for {0}")]
    UnknownMac(Mac),
    #[error("architecture {0} has no boot file here")]
    UnknownArch(u16),
}

/// What the client is, from its request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Client {
    pub mac: Mac,
    pub kind: MessageType,
    pub arch: Option<u16>,
    pub http_client: bool,
    pub ipxe: bool,
}

/// A reply to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub bytes: Vec<u8>,
    pub to: SocketAddrV4,
    pub mac: Mac,
    pub file: String,
}

fn text(opt: Option<&DhcpOption>) -> Option<String> {
    match opt {
        Some(DhcpOption::ClassIdentifier(b)) | Some(DhcpOption::UserClass(b)) => {
            Some(String::from_utf8_lossy(b).into_owned())
        }
        _ => None,
    }
}

/// Reads what matters of a request, or why it is not ours to answer.
pub fn classify(msg: &Message, port: Port) -> Result<Client, Drop> {
    if msg.opcode() != Opcode::BootRequest {
        return Err(Drop::NotRequest);
    }
    if msg.htype() != HType::Eth || msg.hlen() != 6 {
        return Err(Drop::NotEthernet);
    }
    let mac = Mac::from_bytes(&msg.chaddr()[..6]).ok_or(Drop::NotEthernet)?;
    let vendor = text(msg.opts().get(OptionCode::ClassIdentifier)).unwrap_or_default();
    let http_client = vendor.starts_with("HTTPClient");
    if !vendor.starts_with("PXEClient") && !http_client {
        return Err(Drop::NotPxe(vendor));
    }
    let kind = msg
        .opts()
        .msg_type()
        .ok_or_else(|| Drop::Malformed("no message type (option 53)".into()))?;
    let answered = match port {
        Port::Dhcp => matches!(kind, MessageType::Discover | MessageType::Request),
        Port::Pxe => matches!(kind, MessageType::Request | MessageType::Inform),
    };
    if !answered {
        return Err(Drop::Ignored(format!("{kind:?}")));
    }
    let arch = match msg.opts().get(OptionCode::ClientSystemArchitecture) {
        Some(DhcpOption::ClientSystemArchitecture(a)) => Some(u16::from(*a)),
        _ => None,
    };
    let ipxe = text(msg.opts().get(OptionCode::UserClass)).is_some_and(|u| u.contains("iPXE"))
        || msg.opts().get(OptionCode::Unknown(175)).is_some();
    Ok(Client {
        mac,
        kind,
        arch,
        http_client,
        ipxe,
    })
}

/// The boot file for a firmware client (iPXE gets its script's link
/// instead): an HTTP URL for UEFI HTTP boot, else the TFTP file of its
/// firmware.
pub fn boot_file(cfg: &ProxyConfig, c: &Client) -> Result<String, Drop> {
    let arch = c.arch.unwrap_or(0);
    let tftp = match arch {
        0 => &cfg.bios_file,
        6 | 7 | 9 => &cfg.uefi_x64_file,
        11 => &cfg.uefi_arm64_file,
        16 => return Ok(cfg.http(&format!("/boot/{}", cfg.uefi_x64_file))),
        19 => return Ok(cfg.http(&format!("/boot/{}", cfg.uefi_arm64_file))),
        other => return Err(Drop::UnknownArch(other)),
    };
    if c.http_client {
        Ok(cfg.http(&format!("/boot/{tftp}")))
    } else {
        Ok(tftp.clone())
    }
}

/// The fixed length of options whose value is a number, an address or a
/// flag: dhcproto reads them by type, so a lying length would shift every
/// later option (and trips its debug assertions).
fn fixed_len(code: u8) -> Option<usize> {
    Some(match code {
        1 | 2 | 24 | 28 | 32 | 35 | 38 | 50 | 51 | 54 | 58 | 59 | 91 | 108 | 118 | 152..=155 => 4,
        13 | 22 | 26 | 57 | 93 => 2,
        94 => 3,
        19 | 20 | 23 | 27 | 29 | 30 | 31 | 34 | 36 | 37 | 39 | 46 | 52 | 53 | 116 | 156 | 157 => 1,
        80 => 0,
        _ => return None,
    })
}

/// Checks the fixed header and the options' framing before any parser sees
/// them: every option inside the datagram, fixed-size options of their
/// size, an FQDN of at least its three header bytes.
pub fn well_formed(packet: &[u8]) -> Result<(), Drop> {
    const HEADER: usize = 236;
    const COOKIE: [u8; 4] = [99, 130, 83, 99];
    if packet.len() < HEADER + 4 || packet[HEADER..HEADER + 4] != COOKIE {
        return Err(Drop::Malformed(format!(
            "{} bytes without a DHCP header and magic cookie",
            packet.len()
        )));
    }
    let mut i = HEADER + 4;
    while i < packet.len() {
        let code = packet[i];
        match code {
            0 => i += 1,
            255 => return Ok(()),
            _ => {
                let len = *packet
                    .get(i + 1)
                    .ok_or_else(|| Drop::Malformed(format!("option {code} has no length")))?
                    as usize;
                if i + 2 + len > packet.len() {
                    return Err(Drop::Malformed(format!(
                        "option {code} runs past the datagram"
                    )));
                }
                if fixed_len(code).is_some_and(|want| want != len) || (code == 81 && len < 3) {
                    return Err(Drop::Malformed(format!("option {code} has length {len}")));
                }
                i += 2 + len;
            }
        }
    }
    Err(Drop::Malformed("no end option".into()))
}

/// Decides the reply to one datagram received on `port` from `from`;
/// `has_entry` says whether a MAC has a live boot entry, and `mint_link`
/// gives an iPXE client's per-boot script nonce (`None`: the entry is gone).
pub fn answer(
    cfg: &ProxyConfig,
    packet: &[u8],
    port: Port,
    from: SocketAddrV4,
    has_entry: impl Fn(&Mac) -> bool,
    mint_link: impl FnOnce(&Mac) -> Option<String>,
) -> Result<Reply, Drop> {
    if packet.len() > MAX_PACKET {
        return Err(Drop::Malformed(format!("{} bytes", packet.len())));
    }
    well_formed(packet)?;
    // dhcproto is not ours; a parser bug must not take the server down.
    let msg = std::panic::catch_unwind(|| Message::decode(&mut Decoder::new(packet)))
        .map_err(|_| Drop::Malformed("the DHCP parser gave up".into()))?
        .map_err(|e| Drop::Malformed(e.to_string()))?;
    let client = classify(&msg, port)?;
    if !has_entry(&client.mac) {
        return Err(Drop::UnknownMac(client.mac));
    }
    let file = if client.ipxe {
        let nonce = mint_link(&client.mac).ok_or(Drop::UnknownMac(client.mac))?;
        cfg.script_url(&nonce)
    } else {
        boot_file(cfg, &client)?
    };

    let mut reply = Message::default();
    reply
        .set_opcode(Opcode::BootReply)
        .set_htype(HType::Eth)
        .set_xid(msg.xid())
        .set_flags(msg.flags())
        .set_ciaddr(msg.ciaddr())
        .set_yiaddr(Ipv4Addr::UNSPECIFIED)
        .set_siaddr(cfg.server_ip)
        .set_giaddr(msg.giaddr())
        .set_chaddr(&msg.chaddr()[..6])
        .set_sname_str(cfg.server_ip.to_string())
        .set_fname_str(&file);
    let mut opts = DhcpOptions::new();
    opts.insert(DhcpOption::MessageType(match client.kind {
        MessageType::Discover => MessageType::Offer,
        _ => MessageType::Ack,
    }));
    opts.insert(DhcpOption::ServerIdentifier(cfg.server_ip));
    opts.insert(DhcpOption::ClassIdentifier(if client.http_client {
        b"HTTPClient".to_vec()
    } else {
        b"PXEClient".to_vec()
    }));
    if let Some(DhcpOption::ClientMachineIdentifier(id)) =
        msg.opts().get(OptionCode::ClientMachineIdentifier)
    {
        opts.insert(DhcpOption::ClientMachineIdentifier(id.clone()));
    }
    if !client.http_client {
        // PXE_DISCOVERY_CONTROL = 8: take the boot file from this reply,
        // no boot server discovery, no menu.
        opts.insert(DhcpOption::VendorExtensions(vec![6, 1, 8, 255]));
    }
    opts.insert(DhcpOption::BootfileName(file.clone().into_bytes()));
    reply.set_opts(opts);
    let mut bytes = Vec::with_capacity(400);
    reply
        .encode(&mut Encoder::new(&mut bytes))
        .map_err(|e| Drop::Malformed(format!("encoding the reply: {e}")))?;

    let to = if !msg.giaddr().is_unspecified() {
        // Relayed: back to the relay agent's server port.
        SocketAddrV4::new(msg.giaddr(), 67)
    } else if port == Port::Pxe {
        // The client has an address by now and waits on its own port.
        from
    } else if !msg.ciaddr().is_unspecified() {
        SocketAddrV4::new(msg.ciaddr(), cfg.client_port)
    } else {
        SocketAddrV4::new(Ipv4Addr::BROADCAST, cfg.client_port)
    };
    Ok(Reply {
        bytes,
        to,
        mac: client.mac,
        file,
    })
}
