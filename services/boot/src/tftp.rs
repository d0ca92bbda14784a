//! Read-only TFTP for the iPXE builds (`undionly.kpxe`, `ipxe.efi`,
//! `snponly.efi`, …) from one directory. The protocol (RFC 1350, options
//! 2347/2348/2349, windowsize 7440) is async-tftp's; this module owns what
//! is ours and hides the library behind [`TftpServer`], so it can be
//! replaced without touching the rest:
//!
//! - paths are checked before anything is opened: absolute paths, `..`,
//!   anything but plain names, and symlinks leading out of the root are
//!   refused with a TFTP error (access violation), never served;
//! - write requests are refused;
//! - short retransmit timeouts: async-tftp ignores a client's error packet,
//!   so UEFI's `tsize` probe (which aborts the first transfer with an error)
//!   would otherwise keep a transfer retransmitting for minutes;
//! - files are kept in memory once read (iPXE builds are a few hundred KiB)
//!   and re-read when their size or modification time changes.

use crate::BootError;
use async_tftp::packet;
use async_tftp::server::{Handler, TftpServerBuilder};
use futures_lite::io::Cursor;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// The largest file served (a kernel is ~10 MiB; TFTP is for iPXE).
pub const MAX_FILE: u64 = 64 * 1024 * 1024;

type Cached = (SystemTime, u64, Arc<[u8]>);

/// Serves files under `root`, read-only.
#[derive(Clone)]
pub struct RootHandler {
    root: PathBuf,
    cache: Arc<Mutex<HashMap<PathBuf, Cached>>>,
}

/// Why a path is refused, as the TFTP error the client gets.
pub fn checked_path(root: &Path, requested: &Path) -> Result<PathBuf, packet::Error> {
    let mut clean = PathBuf::new();
    for c in requested.components() {
        match c {
            Component::Normal(part) => clean.push(part),
            // `./x` is harmless; everything else leaves or names the root.
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => {
                return Err(packet::Error::PermissionDenied)
            }
        }
    }
    if clean.as_os_str().is_empty() {
        return Err(packet::Error::FileNotFound);
    }
    let full = root.join(&clean);
    // Resolves symlinks: a link inside the root pointing out is refused.
    let real = full
        .canonicalize()
        .map_err(|_| packet::Error::FileNotFound)?;
    if !real.starts_with(root) {
        return Err(packet::Error::PermissionDenied);
    }
    Ok(real)
}

impl RootHandler {
    /// A handler for `root` (which must exist).
    pub fn new(root: &Path) -> std::io::Result<Self> {
        Ok(Self {
            root: root.canonicalize()?,
            cache: Arc::default(),
        })
    }

    /// The bytes of a checked file (from memory when unchanged).
    pub fn read(&self, requested: &Path) -> Result<Arc<[u8]>, packet::Error> {
        let path = checked_path(&self.root, requested)?;
        let meta = std::fs::metadata(&path).map_err(|_| packet::Error::FileNotFound)?;
        if !meta.is_file() {
            return Err(packet::Error::FileNotFound);
        }
        if meta.len() > MAX_FILE {
            return Err(packet::Error::Msg("file too large for TFTP".into()));
        }
        let mtime = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((t, len, bytes)) = cache.get(&path) {
            if *t == mtime && *len == meta.len() {
                return Ok(bytes.clone());
            }
        }
        let bytes: Arc<[u8]> = std::fs::read(&path)
            .map_err(|_| packet::Error::FileNotFound)?
            .into();
        cache.insert(path, (mtime, meta.len(), bytes.clone()));
        Ok(bytes)
    }
}

impl Handler for RootHandler {
    type Reader = Cursor<Arc<[u8]>>;
    type Writer = futures_lite::io::Sink;

    async fn read_req_open(
        &mut self,
        client: &SocketAddr,
        path: &Path,
    ) -> Result<(Self::Reader, Option<u64>), packet::Error> {
        match self.read(path) {
            Ok(bytes) => {
                tracing::debug!(%client, path = %path.display(), bytes = bytes.len(), "TFTP read");
                metrics::counter!("bcm_boot_tftp_reads_total", "outcome" => "ok").increment(1);
                let len = bytes.len() as u64;
                Ok((Cursor::new(bytes), Some(len)))
            }
            Err(e) => {
                tracing::info!(%client, path = %path.display(), error = ?e, "TFTP read refused");
                metrics::counter!("bcm_boot_tftp_reads_total", "outcome" => "refused").increment(1);
                Err(e)
            }
        }
    }

    async fn write_req_open(
        &mut self,
        client: &SocketAddr,
        path: &Path,
        _size: Option<u64>,
    ) -> Result<Self::Writer, packet::Error> {
        tracing::info!(%client, path = %path.display(), "TFTP write refused (read-only)");
        Err(packet::Error::IllegalOperation)
    }
}

/// Settings of the TFTP server.
#[derive(Debug, Clone)]
pub struct TftpSettings {
    /// Per-packet retransmit timeout.
    pub timeout: Duration,
    /// Retransmits before a transfer is dropped.
    pub retries: u32,
}

impl Default for TftpSettings {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(1),
            retries: 4,
        }
    }
}

/// A bound TFTP server.
pub struct TftpServer {
    inner: async_tftp::server::TftpServer<RootHandler>,
}

impl TftpServer {
    /// Binds `socket` (already bound, e.g. to an interface) serving `root`.
    pub async fn new(
        socket: std::net::UdpSocket,
        root: &Path,
        settings: &TftpSettings,
    ) -> Result<Self, BootError> {
        let handler = RootHandler::new(root)?;
        let tftp = |e: async_tftp::Error| BootError::Tftp(e.to_string());
        let inner = TftpServerBuilder::with_handler(handler)
            .std_socket(socket)
            .map_err(tftp)?
            .timeout(settings.timeout)
            .max_send_retries(settings.retries)
            .build()
            .await
            .map_err(tftp)?;
        Ok(Self { inner })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> Result<SocketAddr, BootError> {
        self.inner
            .listen_addr()
            .map_err(|e| BootError::Tftp(e.to_string()))
    }

    /// Serves until `stop` is cancelled, on a thread of its own.
    ///
    /// async-tftp runs its transfers on async-io. Polled from a tokio task,
    /// every packet's readiness crossed threads: async-io's reactor thread
    /// saw it and woke the tokio worker that polls the executor.
    /// `async_io::block_on` makes the thread that runs the transfers poll
    /// the reactor itself when it has nothing else to do
    /// (`cargo bench -p bcm-boot --bench boot`, docs/performance.md).
    ///
    /// TFTP is lock-step: every block waits for this thread's turn on a
    /// core before it is sent. On a busy host one thread serving every
    /// transfer waits behind everything else runnable (in the bench, the
    /// 200 clients; at a site, the services beside it), where tftp-hpa runs
    /// a process per transfer. So the thread asks for a higher priority
    /// (nice −10; root or CAP_SYS_NICE) and serves at the normal one where
    /// it is refused.
    pub async fn serve(self, stop: tokio_util::sync::CancellationToken) -> Result<(), BootError> {
        let (done, served) = tokio::sync::oneshot::channel();
        let inner = self.inner;
        std::thread::Builder::new()
            .name("bcm-tftp".into())
            .spawn(move || {
                raise_priority();
                let ran = async_io::block_on(futures_lite::future::or(
                    async {
                        inner
                            .serve()
                            .await
                            .map_err(|e| BootError::Tftp(e.to_string()))
                    },
                    async {
                        stop.cancelled().await;
                        Ok(())
                    },
                ));
                let _ = done.send(ran);
            })
            .map_err(|e| BootError::Tftp(format!("starting its thread: {e}")))?;
        served
            .await
            .unwrap_or_else(|_| Err(BootError::Tftp("its thread ended without a word".into())))
    }
}

/// Raises the calling thread's priority to nice −10, where allowed.
fn raise_priority() {
    // SAFETY: gettid and setpriority only read their integer arguments;
    // PRIO_PROCESS with a thread id changes that thread alone on Linux.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, -10) };
    if rc != 0 {
        tracing::info!(error = %std::io::Error::last_os_error(),
            "the TFTP thread runs at the normal priority (raising it needs root or CAP_SYS_NICE)");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_outside_the_root_are_refused() {
        let dir = std::env::temp_dir().join(format!("bcm-tftp-unit-{}", std::process::id()));
        let root = dir.join("root");
        std::fs::create_dir_all(root.join("sub")).expect("dirs");
        std::fs::write(root.join("sub/a.efi"), b"x").expect("file");
        std::fs::write(dir.join("secret"), b"s").expect("secret");
        let _ = std::os::unix::fs::symlink(dir.join("secret"), root.join("link"));
        let root = root.canonicalize().expect("root");
        assert!(checked_path(&root, Path::new("sub/a.efi")).is_ok());
        assert!(checked_path(&root, Path::new("./sub/a.efi")).is_ok());
        for bad in ["../secret", "/etc/passwd", "sub/../../secret", "link"] {
            assert!(
                matches!(
                    checked_path(&root, Path::new(bad)),
                    Err(packet::Error::PermissionDenied)
                ),
                "{bad}"
            );
        }
        assert!(matches!(
            checked_path(&root, Path::new("missing")),
            Err(packet::Error::FileNotFound)
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
