//! A simulated machine's PXE client, speaking to a real boot service as
//! iPXE does: a DHCP REQUEST to the proxy's PXE port (vendor class
//! `PXEClient`, user class `iPXE`), whose answer names the one-time link of
//! its script. Retried on silence, as firmware retries.

use dhcproto::v4::{DhcpOption, DhcpOptions, HType, Message, MessageType, Opcode, OptionCode};
use dhcproto::{Decodable, Decoder, Encodable, Encoder};
use std::net::SocketAddr;
use std::time::Duration;

/// Why no link came back.
#[derive(Debug, thiserror::Error)]
pub enum PxeError {
    #[error("{0:?} is not a MAC address")]
    Mac(String),
    #[error("DHCP socket: {0}")]
    Io(#[from] std::io::Error),
    #[error("encoding the request: {0}")]
    Encode(String),
    #[error("no answer after {0} tries")]
    Silent(u32),
}

fn mac_bytes(mac: &str) -> Result<[u8; 6], PxeError> {
    let hex: String = mac.chars().filter(|c| *c != ':' && *c != '-').collect();
    hex::decode(&hex)
        .ok()
        .and_then(|b| <[u8; 6]>::try_from(b).ok())
        .ok_or_else(|| PxeError::Mac(mac.to_owned()))
}

/// The script URL the proxy DHCP at `server` names for `mac`.
pub async fn script_link(server: SocketAddr, mac: &str) -> Result<String, PxeError> {
    const TRIES: u32 = 4;
    let chaddr = mac_bytes(mac)?;
    let bind = if server.is_ipv4() {
        SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, 0))
    } else {
        SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, 0))
    };
    let socket = tokio::net::UdpSocket::bind(bind).await?;
    let xid: u32 = rand::random();
    let mut msg = Message::default();
    msg.set_opcode(Opcode::BootRequest)
        .set_htype(HType::Eth)
        .set_xid(xid)
        .set_chaddr(&chaddr);
    let mut opts = DhcpOptions::new();
    opts.insert(DhcpOption::MessageType(MessageType::Request));
    opts.insert(DhcpOption::ClassIdentifier(
        b"PXEClient:Arch:00007:UNDI:003016".to_vec(),
    ));
    opts.insert(DhcpOption::UserClass(b"iPXE".to_vec()));
    msg.set_opts(opts);
    let mut bytes = Vec::with_capacity(300);
    msg.encode(&mut Encoder::new(&mut bytes))
        .map_err(|e| PxeError::Encode(e.to_string()))?;
    let mut buf = vec![0u8; 1500];
    for attempt in 0..TRIES {
        socket.send_to(&bytes, server).await?;
        let wait = Duration::from_secs(1 << attempt.min(3));
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let got = tokio::time::timeout_at(deadline, socket.recv_from(&mut buf)).await;
            let Ok(Ok((len, _))) = got else { break };
            let Ok(reply) = Message::decode(&mut Decoder::new(&buf[..len])) else {
                tracing::debug!("sim machine: dropped an undecodable DHCP answer");
                continue;
            };
            if reply.xid() != xid || reply.opcode() != Opcode::BootReply {
                continue;
            }
            let file = match reply.opts().get(OptionCode::BootfileName) {
                Some(DhcpOption::BootfileName(f)) => String::from_utf8_lossy(f).into_owned(),
                _ => String::from_utf8_lossy(reply.fname().unwrap_or_default())
                    .trim_end_matches('\0')
                    .to_owned(),
            };
            if file.starts_with("http://") || file.starts_with("https://") {
                return Ok(file);
            }
        }
    }
    Err(PxeError::Silent(TRIES))
}
