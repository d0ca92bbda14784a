//! `deploy.image`: a signed manifest (URL, format, size, sha256) is checked
//! against the trusted keys BEFORE the disk is opened; the image streams
//! over HTTP(S) (through `site.httpProxy` when configured), hashed while it
//! is written, qcow2 converted on the fly; ranges the image leaves
//! unallocated are zeroed; the disk is flushed and read back around the
//! page cache, chunk by chunk, against what was written. A wrong hash, a
//! short or long image or a read-back mismatch zeroes everything written
//! and fails with the reason.

use std::collections::HashMap;
use std::io::Read;
use std::os::unix::fs::FileExt;

use ed25519_dalek::VerifyingKey;
use sha2::{Digest, Sha256};

use crate::disks::{self, DirectReader, Disk};
use crate::qcow2;

/// The image formats, and a deploy profile's image: the signed manifest.
pub use bcm_core::deploy::{ImageFormat as Format, ImageRef as Manifest};

/// The format's name in the signed manifest.
fn format_name(f: Format) -> &'static str {
    match f {
        Format::Raw => "raw",
        Format::Qcow2 => "qcow2",
    }
}

/// Why a deploy failed.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("the image manifest is not signed; nothing was written")]
    Unsigned,
    #[error("the image manifest's signature does not verify against any trusted key; nothing was written")]
    Untrusted,
    #[error("fetching {url}: {why}; nothing was written")]
    Fetch { url: String, why: String },
    #[error("the target {disk} ({size} bytes) is smaller than the image ({need} bytes)")]
    TooSmall { disk: String, size: u64, need: u64 },
    #[error("{0}; the {1} bytes written were zeroed")]
    Rejected(String, u64),
    #[error("{0}")]
    Io(String),
}

/// What a deploy did.
pub use bcm_contracts::outputs::DeployReport;

/// Checks the manifest's signature; the index of the key that signed it.
pub fn verify_manifest(m: &Manifest, keys: &[VerifyingKey]) -> Result<usize, ImageError> {
    let sig = m.signature.as_deref().ok_or(ImageError::Unsigned)?;
    bcm_pki::image::verify_manifest(
        keys,
        sig,
        &m.url,
        format_name(m.format),
        m.size_bytes,
        &m.sha256,
    )
    .ok_or(ImageError::Untrusted)
}

type ChunkDigest = [u8; 16];

fn digest(data: &[u8]) -> ChunkDigest {
    let d = Sha256::digest(data);
    let mut out = [0u8; 16];
    out.copy_from_slice(&d[..16]);
    out
}

/// What was written, chunk by chunk, for the read-back and the cleanup.
struct Written {
    chunk: u64,
    digests: HashMap<u64, ChunkDigest>,
    bytes: u64,
}

impl Written {
    fn record(&mut self, file: &std::fs::File, guest: u64, data: &[u8]) -> std::io::Result<()> {
        if data.iter().all(|b| *b == 0) {
            // A run of zeros is a hole: zeroed (fast) with the others.
            return Ok(());
        }
        file.write_all_at(data, guest)?;
        // Writes are chunk-aligned and at most one chunk long.
        self.digests.insert(guest / self.chunk, digest(data));
        self.bytes += data.len() as u64;
        Ok(())
    }

    fn zero_all(&self, file: &std::fs::File, limit: u64) {
        for idx in self.digests.keys() {
            let off = idx * self.chunk;
            let len = self.chunk.min(limit.saturating_sub(off));
            if let Err(e) = disks::write_zeros(file, off, len) {
                tracing::error!(error = %e, offset = off, "zeroing a written chunk failed");
            }
        }
        let _ = file.sync_all();
    }
}

/// Options of a deploy.
#[derive(Debug, Clone, Default)]
pub struct DeployOptions {
    /// `site.httpProxy`, when the site has one.
    pub proxy: Option<String>,
    /// Most bytes of qcow2 clusters held before the L2 table naming them.
    pub max_held_bytes: Option<u64>,
}

/// Deploys the image the manifest names onto `disk`.
pub fn deploy(
    m: &Manifest,
    keys: &[VerifyingKey],
    disk: &Disk,
    opts: &DeployOptions,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<DeployReport, ImageError> {
    let signed_by_key = verify_manifest(m, keys)?;
    if m.format == Format::Raw && m.size_bytes > disk.size_bytes {
        return Err(ImageError::TooSmall {
            disk: disk.name.clone(),
            size: disk.size_bytes,
            need: m.size_bytes,
        });
    }
    let fetch_err = |why: String| ImageError::Fetch {
        url: m.url.clone(),
        why,
    };
    let mut client = reqwest::blocking::Client::builder()
        .connect_timeout(std::time::Duration::from_secs(30))
        .timeout(None);
    if let Some(p) = &opts.proxy {
        client = client.proxy(reqwest::Proxy::all(p).map_err(|e| fetch_err(e.to_string()))?);
    }
    let client = client.build().map_err(|e| fetch_err(e.to_string()))?;
    let mut resp = client
        .get(&m.url)
        .send()
        .map_err(|e| fetch_err(e.to_string()))?;
    if !resp.status().is_success() {
        return Err(fetch_err(format!("HTTP {}", resp.status())));
    }
    let started = std::time::Instant::now();
    let file = disks::open_write(disk)
        .map_err(|e| ImageError::Io(format!("open {}: {e}", disk.path.display())))?;
    let chunk = 1u64 << 20;
    let mut written = Written {
        chunk,
        digests: HashMap::new(),
        bytes: 0,
    };
    let mut hasher = Sha256::new();
    let mut downloaded = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    let mut raw_fill: Vec<u8> = Vec::with_capacity(chunk as usize);
    let mut raw_at = 0u64;
    let mut conv = qcow2::Converter::new(opts.max_held_bytes.unwrap_or(256 << 20));
    let mut qcow_chunk = 0u64;
    let fail = |written: &Written, why: String| -> ImageError {
        written.zero_all(&file, u64::MAX);
        ImageError::Rejected(why, written.bytes)
    };
    loop {
        let n = match resp.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) => return Err(fail(&written, format!("reading the image: {e}"))),
        };
        downloaded += n as u64;
        if downloaded > m.size_bytes {
            return Err(fail(
                &written,
                format!(
                    "the image is longer than the manifest's {} bytes",
                    m.size_bytes
                ),
            ));
        }
        let data = &buf[..n];
        hasher.update(data);
        match m.format {
            Format::Raw => {
                let mut rest = data;
                while !rest.is_empty() {
                    let take = (chunk as usize - raw_fill.len()).min(rest.len());
                    raw_fill.extend_from_slice(&rest[..take]);
                    rest = &rest[take..];
                    if raw_fill.len() as u64 == chunk {
                        if let Err(e) = written.record(&file, raw_at, &raw_fill) {
                            return Err(fail(&written, format!("writing: {e}")));
                        }
                        raw_at += chunk;
                        raw_fill.clear();
                    }
                }
            }
            Format::Qcow2 => {
                let mut sink = |o: qcow2::Output<'_>| -> std::io::Result<()> {
                    let qcow2::Output::Data { guest, data } = o;
                    // Every output is one whole cluster at a cluster-aligned
                    // guest offset: record at cluster granularity.
                    written.chunk = data.len() as u64;
                    written.record(&file, guest, data)
                };
                if let Err(e) = conv.feed(data, &mut sink) {
                    return Err(fail(&written, format!("qcow2: {e}")));
                }
                if qcow_chunk == 0 {
                    if let Some(h) = conv.header() {
                        qcow_chunk = h.cluster_size;
                        if h.virtual_size > disk.size_bytes {
                            return Err(fail(
                                &written,
                                format!(
                                    "the target {} ({} bytes) is smaller than the image ({} bytes)",
                                    disk.name, disk.size_bytes, h.virtual_size
                                ),
                            ));
                        }
                    }
                }
            }
        }
        progress(downloaded, m.size_bytes);
    }
    if !raw_fill.is_empty() {
        if let Err(e) = written.record(&file, raw_at, &raw_fill) {
            return Err(fail(&written, format!("writing: {e}")));
        }
    }
    if downloaded != m.size_bytes {
        return Err(fail(
            &written,
            format!(
                "the image is {downloaded} bytes, the manifest says {}",
                m.size_bytes
            ),
        ));
    }
    let sha = hex::encode(hasher.finalize());
    if sha != m.sha256 {
        return Err(fail(
            &written,
            format!(
                "image sha256 {sha} does not match the manifest's {}",
                m.sha256
            ),
        ));
    }
    let virtual_size = match m.format {
        Format::Raw => m.size_bytes,
        Format::Qcow2 => match conv.finish() {
            Ok(h) => h.virtual_size,
            Err(e) => return Err(fail(&written, format!("qcow2: {e}"))),
        },
    };
    if m.format == Format::Qcow2 {
        written.chunk = qcow_chunk;
    }
    // Zero what the image leaves unallocated, in runs.
    let chunks = virtual_size.div_ceil(written.chunk);
    let mut run: Option<u64> = None;
    for idx in 0..=chunks {
        let hole = idx < chunks && !written.digests.contains_key(&idx);
        match (hole, run) {
            (true, None) => run = Some(idx),
            (false, Some(start)) => {
                let off = start * written.chunk;
                let end = (idx * written.chunk).min(virtual_size);
                if let Err(e) = disks::zero_fast(&file, disk.is_block, off, end - off) {
                    return Err(fail(&written, format!("zeroing unallocated ranges: {e}")));
                }
                run = None;
            }
            _ => {}
        }
    }
    if let Err(e) = disks::flush(&file, disk.is_block) {
        return Err(fail(&written, format!("flush: {e}")));
    }
    // Read back around the page cache, chunk by chunk.
    let target_sha = match read_back(disk, &written, virtual_size) {
        Ok(s) => s,
        Err(why) => return Err(fail(&written, why)),
    };
    let millis = started.elapsed().as_millis() as u64;
    Ok(DeployReport {
        disk: disk.name.clone(),
        serial: disk.serial.clone(),
        format: m.format,
        image_sha256: sha,
        bytes_downloaded: downloaded,
        virtual_size_bytes: virtual_size,
        bytes_written: written.bytes,
        target_sha256: target_sha,
        millis,
        bytes_per_sec: downloaded * 1000 / millis.max(1),
        signed_by_key,
        user_data: None,
        sim: false,
    })
}

fn read_back(disk: &Disk, written: &Written, virtual_size: u64) -> Result<String, String> {
    let mut reader = DirectReader::open(disk).map_err(|e| format!("read-back open: {e}"))?;
    let mut whole = Sha256::new();
    let mut idx = 0u64;
    let mut pending: Vec<u8> = Vec::with_capacity(written.chunk as usize);
    let mut bad: Option<u64> = None;
    let check = |chunk: &[u8], idx: u64, bad: &mut Option<u64>| {
        let expect = written
            .digests
            .get(&idx)
            .copied()
            .unwrap_or_else(|| digest(&vec![0u8; chunk.len()]));
        if digest(chunk) != expect && bad.is_none() {
            *bad = Some(idx);
        }
    };
    reader
        .read_range(0, virtual_size, |data| {
            whole.update(data);
            let mut rest = data;
            while !rest.is_empty() {
                let take = (written.chunk as usize - pending.len()).min(rest.len());
                pending.extend_from_slice(&rest[..take]);
                rest = &rest[take..];
                if pending.len() as u64 == written.chunk {
                    check(&pending, idx, &mut bad);
                    idx += 1;
                    pending.clear();
                }
            }
        })
        .map_err(|e| format!("read-back: {e}"))?;
    if !pending.is_empty() {
        check(&pending, idx, &mut bad);
    }
    if let Some(i) = bad {
        return Err(format!(
            "read-back of the target differs from what was written at offset {}",
            i * written.chunk
        ));
    }
    Ok(hex::encode(whole.finalize()))
}
