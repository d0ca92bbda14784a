//! The proxy DHCP sockets (67 and 4011): receive, drop everything while
//! this process does not hold the site boot lease, ask [`crate::dhcp`] for
//! the reply, send it. A malformed or foreign datagram is dropped with a
//! debug line and a counter, never a crash.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use tokio::net::UdpSocket;
use tokio_util::sync::CancellationToken;

use crate::dhcp::{self, Port, ProxyConfig};
use crate::entries::Entries;
use crate::lease::Lease;
use crate::nonces::Nonces;
use crate::DhcpConfig;

/// A UDP socket bound to `addr` (optionally to `interface`), with
/// SO_REUSEADDR and, for DHCP, SO_BROADCAST.
pub fn udp_socket(
    addr: SocketAddr,
    interface: Option<&str>,
    broadcast: bool,
) -> std::io::Result<std::net::UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let s = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    s.set_reuse_address(true)?;
    if broadcast {
        s.set_broadcast(true)?;
    }
    if let Some(dev) = interface {
        s.bind_device(Some(dev.as_bytes()))?;
    }
    s.bind(&addr.into())?;
    s.set_nonblocking(true)?;
    Ok(s.into())
}

/// The bound DHCP and PXE sockets and what answering needs.
pub struct DhcpServer {
    dhcp: UdpSocket,
    pxe: UdpSocket,
    proxy: ProxyConfig,
    broadcast: Ipv4Addr,
    entries: Arc<Entries>,
    nonces: Arc<Nonces>,
    lease: Arc<Lease>,
}

impl DhcpServer {
    /// Binds both ports.
    pub fn bind(
        cfg: &DhcpConfig,
        proxy: ProxyConfig,
        entries: Arc<Entries>,
        nonces: Arc<Nonces>,
        lease: Arc<Lease>,
    ) -> std::io::Result<Self> {
        let bind = |port| {
            udp_socket(
                SocketAddr::from((cfg.listen, port)),
                cfg.interface.as_deref(),
                true,
            )
            .and_then(UdpSocket::from_std)
        };
        Ok(Self {
            dhcp: bind(cfg.port)?,
            pxe: bind(cfg.pxe_port)?,
            proxy,
            broadcast: cfg.broadcast,
            entries,
            nonces,
            lease,
        })
    }

    /// The DHCP and PXE addresses.
    pub fn local_addrs(&self) -> std::io::Result<(SocketAddr, SocketAddr)> {
        Ok((self.dhcp.local_addr()?, self.pxe.local_addr()?))
    }

    /// Serves both ports until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        let me = Arc::new(self);
        let a = tokio::spawn(me.clone().serve(Port::Dhcp, shutdown.clone()));
        let b = tokio::spawn(me.serve(Port::Pxe, shutdown));
        let _ = tokio::join!(a, b);
    }

    async fn serve(self: Arc<Self>, port: Port, shutdown: CancellationToken) {
        let socket = match port {
            Port::Dhcp => &self.dhcp,
            Port::Pxe => &self.pxe,
        };
        let mut buf = vec![0u8; 2048];
        loop {
            let received = tokio::select! {
                _ = shutdown.cancelled() => return,
                r = socket.recv_from(&mut buf) => r,
            };
            let (len, from) = match received {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(error = %e, ?port, "DHCP receive failed");
                    continue;
                }
            };
            let SocketAddr::V4(from) = from else { continue };
            if !self.lease.is_active() {
                metrics::counter!("bcm_boot_dhcp_dropped_total", "reason" => "standby")
                    .increment(1);
                tracing::trace!(%from, "not the site's active boot server; not answering");
                continue;
            }
            let link = |m: &crate::entries::Mac| {
                let entry = self.entries.live(m)?;
                Some(self.nonces.mint(*m, &entry))
            };
            match dhcp::answer(
                &self.proxy,
                &buf[..len],
                port,
                from,
                |m| self.entries.live(m).is_some(),
                link,
            ) {
                Ok(mut reply) => {
                    if reply.to.ip().is_broadcast() {
                        reply.to = SocketAddrV4::new(self.broadcast, reply.to.port());
                    }
                    match socket.send_to(&reply.bytes, reply.to).await {
                        Ok(_) => {
                            metrics::counter!("bcm_boot_dhcp_answers_total").increment(1);
                            tracing::info!(mac = %reply.mac, to = %reply.to, file = %reply.file, ?port, "proxy DHCP answer");
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, to = %reply.to, "sending a proxy DHCP answer failed")
                        }
                    }
                }
                Err(why) => {
                    metrics::counter!("bcm_boot_dhcp_dropped_total", "reason" => "ignored")
                        .increment(1);
                    tracing::debug!(%from, ?port, %why, "dropped a DHCP request");
                }
            }
        }
    }
}
