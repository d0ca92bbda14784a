//! `deploy.image`: a signed manifest (URL, format, size, sha256, a raw
//! image's block map) is checked against the trusted keys BEFORE the disk
//! is opened; the image streams over HTTP(S) (through `site.httpProxy`
//! when configured), hashed on a thread of its own while it is written
//! (`offload`), qcow2 converted on the fly; a raw image with a block map
//! has only its runs of data fetched (HTTP ranges), each checked against
//! its own signed sha256. Writes are pushed towards the medium as they go;
//! ranges the image leaves unallocated are zeroed; the disk is flushed and
//! read back around the page cache (O_DIRECT into aligned buffers, two
//! reads in flight), chunk by chunk, against what was written. A raw
//! image's target sha256 is the manifest's once the chunk check proves the
//! target holds what was checked (the whole stream's sha256, or each run's
//! and zeros between them); a qcow2 image's virtual disk is hashed on its
//! own thread as it is read back. A wrong hash, a short or long image or
//! run, or a read-back mismatch zeroes everything written and fails with
//! the reason.

use std::collections::HashMap;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::sync::mpsc::sync_channel;

use ed25519_dalek::VerifyingKey;
use reqwest::blocking::Client;

use crate::disks::{self, AlignedBuf, DirectReader, Disk};
use crate::offload::Sha256Thread;
use crate::qcow2;

/// The image formats, and a deploy profile's image: the signed manifest.
pub use bcm_core::deploy::{DataRange, ImageFormat as Format, ImageRef as Manifest};

/// The format's name in the signed manifest.
fn format_name(f: Format) -> &'static str {
    match f {
        Format::Raw => "raw",
        Format::Qcow2 => "qcow2",
        Format::Iso => "iso",
    }
}

/// Why a deploy failed.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("the image manifest is not signed; nothing was written")]
    Unsigned,
    #[error("an iso is an installer for an agentless pool's virtual media; bcd streams raw or qcow2 disk images; nothing was written")]
    NotADiskImage,
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
    if m.format == Format::Iso {
        return Err(ImageError::NotADiskImage);
    }
    let sig = m.signature.as_deref().ok_or(ImageError::Unsigned)?;
    let runs: Option<Vec<(u64, u64, &str)>> = m.data_ranges.as_ref().map(|r| {
        r.iter()
            .map(|d| (d.offset, d.length, d.sha256.as_str()))
            .collect()
    });
    let index = bcm_pki::image::verify_manifest(
        keys,
        sig,
        &bcm_pki::image::ManifestFields {
            url: &m.url,
            format: format_name(m.format),
            size_bytes: m.size_bytes,
            sha256: &m.sha256,
            data_ranges: runs.as_deref(),
        },
    )
    .ok_or(ImageError::Untrusted)?;
    // Signed is not well-formed: a signer's runs out of order or past the
    // image would mislead the writes below.
    if let Some(ranges) = &m.data_ranges {
        bcm_core::deploy::check_data_ranges(m.format, m.size_bytes, ranges).map_err(|e| {
            ImageError::Io(format!("the signed block map: {e}; nothing was written"))
        })?;
    }
    Ok(index)
}

/// A written chunk's fingerprint for its read-back: XXH3-128, which finds
/// what a medium lost or changed at memory speed. What proves the image is
/// the one signed is the sha256 of the whole stream, checked against the
/// manifest; the read-back proves the disk holds what was written.
type ChunkDigest = u128;

fn digest(data: &[u8]) -> ChunkDigest {
    xxhash_rust::xxh3::xxh3_128(data)
}

/// Whether every byte is zero: 4 KiB at a time, each folded without a
/// branch per byte (so it vectorizes), stopping at the first that is not.
fn is_zero(data: &[u8]) -> bool {
    data.chunks(4096)
        .all(|block| block.iter().fold(0u8, |acc, b| acc | b) == 0)
}

/// Bytes written between two pushes of the dirty pages towards the medium.
const WRITEBACK_EVERY: u64 = 64 << 20;

/// What was written, chunk by chunk, for the read-back and the cleanup.
struct Written {
    chunk: u64,
    digests: HashMap<u64, ChunkDigest>,
    bytes: u64,
    /// Bytes written since the dirty pages were last pushed.
    unpushed: u64,
}

impl Written {
    fn record(&mut self, file: &std::fs::File, guest: u64, data: &[u8]) -> std::io::Result<()> {
        if is_zero(data) {
            // A run of zeros is a hole: zeroed (fast) with the others.
            return Ok(());
        }
        file.write_all_at(data, guest)?;
        // Writes are chunk-aligned and at most one chunk long.
        self.digests.insert(guest / self.chunk, digest(data));
        self.bytes += data.len() as u64;
        self.unpushed += data.len() as u64;
        if self.unpushed >= WRITEBACK_EVERY {
            disks::start_writeback(file);
            self.unpushed = 0;
        }
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
    /// The site's forward proxy, when the site has one.
    pub proxy: Option<String>,
    /// The image in the boot server's cache (a catalog image): tried
    /// first, straight (the boot network reaches its boot server), then
    /// the manifest's URL. The manifest checks the bytes either way.
    pub cached_url: Option<String>,
    /// Most bytes of qcow2 clusters held before the L2 table naming them.
    pub max_held_bytes: Option<u64>,
}

/// Deploys the image the manifest names onto `disk`: the manifest checked
/// before anything is opened, the image streamed, hashed and (qcow2)
/// converted as it arrives, its holes zeroed, the disk flushed and read
/// back. Anything wrong after the first write zeroes what was written.
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
    let started = std::time::Instant::now();
    // A block-mapped raw image's runs come as HTTP ranges, the first asked
    // for here; a server that answers it with the whole image streams it.
    let runs = match (m.format, &m.data_ranges) {
        (Format::Raw, Some(runs)) => Some(runs.as_slice()),
        _ => None,
    };
    let first = runs.and_then(|r| r.first());
    let (source, source_url, client) = fetch(m, opts, first)?;
    let ranged = runs.filter(|_| {
        source
            .as_ref()
            .is_none_or(|r| r.status() == reqwest::StatusCode::PARTIAL_CONTENT)
    });
    let file = disks::open_write(disk)
        .map_err(|e| ImageError::Io(format!("open {}: {e}", disk.path.display())))?;
    let mut sink = Sink::new(m, disk, &file, opts);
    let fetched = match (ranged, source) {
        (Some(runs), first) => {
            let fetch_run = |run: &DataRange| get_run(&client, &source_url, run, m.size_bytes);
            stream_runs(first, &fetch_run, runs, &mut sink, progress)
                .and_then(|()| sink.finish_runs())
        }
        (None, Some(mut whole)) => stream(&mut whole, &mut sink, progress)
            .and_then(|sha| sink.finish(sha))
            .and_then(|done| {
                // A block-mapped image streamed whole (the server ignored
                // the range) lands what the map says or nothing: no data
                // outside its runs.
                match runs {
                    Some(runs) => sink.check_within_runs(runs).map(|()| done),
                    None => Ok(done),
                }
            }),
        (None, None) => Err("no image stream".to_string()),
    };
    let streamed = fetched.and_then(|(virtual_size, sha)| {
        zero_holes(&file, disk, &sink.written, virtual_size)?;
        disks::flush(&file, disk.is_block).map_err(|e| format!("flush: {e}"))?;
        // Read back around the page cache, chunk by chunk. A raw
        // image's bytes are the target's, in order: once every chunk
        // read back is the one written (and every hole zeros), the
        // target holds what was checked against the manifest (the whole
        // stream's sha256, or each run's and zeros between them), and
        // its sha256 is the manifest's, not taken again. A qcow2
        // image's virtual disk is hashed as it is read back.
        let target_sha = match m.format {
            Format::Raw => {
                read_back(disk, &sink.written, virtual_size, TargetHash::Proven)?;
                sha.clone()
            }
            _ => {
                read_back(disk, &sink.written, virtual_size, TargetHash::Take)?.unwrap_or_default()
            }
        };
        Ok((virtual_size, sha, target_sha))
    });
    let (virtual_size, sha, target_sha) = match streamed {
        Ok(done) => done,
        Err(why) => {
            sink.written.zero_all(&file, u64::MAX);
            return Err(ImageError::Rejected(why, sink.written.bytes));
        }
    };
    let millis = started.elapsed().as_millis() as u64;
    Ok(DeployReport {
        disk: disk.name.clone(),
        serial: disk.serial.clone(),
        format: m.format,
        image_sha256: sha,
        bytes_downloaded: sink.downloaded,
        virtual_size_bytes: virtual_size,
        bytes_written: sink.written.bytes,
        target_sha256: target_sha,
        millis,
        bytes_per_sec: sink.downloaded * 1000 / millis.max(1),
        signed_by_key,
        // An image of zeros only (a block map without runs) came from
        // nowhere.
        source: (ranged.is_none_or(|r| !r.is_empty())).then_some(source_url),
        data_ranges_checked: ranged.map(<[DataRange]>::len),
        user_data: None,
        sim: false,
    })
}

/// The image's HTTP(S) response (for a block-mapped image, to the range of
/// its first run; none when it has no run at all), where it came from (the
/// site's cache when it has the image, else the manifest's URL, through the
/// site's forward proxy when set) and the client that asked.
fn fetch(
    m: &Manifest,
    opts: &DeployOptions,
    first_run: Option<&DataRange>,
) -> Result<(Option<reqwest::blocking::Response>, String, Client), ImageError> {
    let ask = |client: &Client, url: &str| {
        let req = client.get(url);
        match first_run {
            Some(run) => req.header(reqwest::header::RANGE, range_header(run)),
            None => req,
        }
        .send()
    };
    let no_runs = m.format == Format::Raw && m.data_ranges.as_ref().is_some_and(Vec::is_empty);
    if let Some(cached) = &opts.cached_url {
        let client = Client::builder()
            .connect_timeout(std::time::Duration::from_secs(10))
            .timeout(None)
            .no_proxy()
            .build();
        if no_runs {
            if let Ok(client) = client {
                return Ok((None, cached.clone(), client));
            }
        }
        match client.and_then(|c| ask(&c, cached).map(|r| (r, c))) {
            Ok((r, c)) if r.status().is_success() => return Ok((Some(r), cached.clone(), c)),
            Ok((r, _)) => {
                tracing::info!(url = %cached, status = %r.status(), "the site's cache does not have the image; fetching it from its URL")
            }
            Err(e) => {
                tracing::info!(url = %cached, error = %e, "the site's cache did not answer; fetching the image from its URL")
            }
        }
    }
    let fetch_err = |why: String| ImageError::Fetch {
        url: m.url.clone(),
        why,
    };
    let mut client = Client::builder()
        .connect_timeout(std::time::Duration::from_secs(30))
        .timeout(None);
    if let Some(p) = &opts.proxy {
        client = client.proxy(reqwest::Proxy::all(p).map_err(|e| fetch_err(e.to_string()))?);
    }
    let client = client.build().map_err(|e| fetch_err(e.to_string()))?;
    if no_runs {
        return Ok((None, m.url.clone(), client));
    }
    let resp = ask(&client, &m.url).map_err(|e| fetch_err(e.to_string()))?;
    if !resp.status().is_success() {
        return Err(fetch_err(format!("HTTP {}", resp.status())));
    }
    Ok((Some(resp), m.url.clone(), client))
}

/// The `Range` header asking for one run.
fn range_header(run: &DataRange) -> String {
    format!(
        "bytes={}-{}",
        run.offset,
        run.offset + run.length.saturating_sub(1)
    )
}

/// One run of a block-mapped image: a `206 Partial Content` answer whose
/// `Content-Range` is the run's, or why not.
fn get_run(
    client: &Client,
    url: &str,
    run: &DataRange,
    size_bytes: u64,
) -> Result<reqwest::blocking::Response, String> {
    let resp = client
        .get(url)
        .header(reqwest::header::RANGE, range_header(run))
        .send()
        .map_err(|e| format!("fetching {url} at {}+{}: {e}", run.offset, run.length))?;
    check_run_answer(&resp, run, size_bytes).map(|()| resp)
}

/// A range answer is the run asked for, of an image of the manifest's
/// size: `206` with the run's `Content-Range` (a server that ignores the
/// range, answers another or serves another file would put the wrong bytes
/// at the run's offset).
fn check_run_answer(
    resp: &reqwest::blocking::Response,
    run: &DataRange,
    size_bytes: u64,
) -> Result<(), String> {
    if resp.status() != reqwest::StatusCode::PARTIAL_CONTENT {
        return Err(format!(
            "asked for the run at {}+{}, the server answered HTTP {}",
            run.offset,
            run.length,
            resp.status()
        ));
    }
    let want = format!(
        "bytes {}-{}/{size_bytes}",
        run.offset,
        run.offset + run.length.saturating_sub(1)
    );
    let got = resp
        .headers()
        .get(reqwest::header::CONTENT_RANGE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if got != want {
        return Err(format!(
            "asked for the run at {}+{}, the server answered Content-Range {got:?}",
            run.offset, run.length
        ));
    }
    Ok(())
}

/// The buffers a stream reads into: one filled while others are hashed.
const STREAM_BUFFERS: usize = 4;
const STREAM_BUFFER: usize = 1 << 20;

/// Reads the whole image into the sink, reporting progress; the image's
/// sha256 (hex), hashed on its own thread while the sink writes.
fn stream(
    source: &mut impl Read,
    sink: &mut Sink<'_>,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<String, String> {
    let hasher = Sha256Thread::spawn(vec![vec![0u8; STREAM_BUFFER]; STREAM_BUFFERS])
        .map_err(|e| format!("starting the hashing thread: {e}"))?;
    loop {
        let mut buf = hasher.buffer().map_err(|e| e.to_string())?;
        let n = fill(source, &mut buf).map_err(|e| format!("reading the image: {e}"))?;
        if n == 0 {
            break;
        }
        sink.feed(&buf[..n])?;
        progress(sink.downloaded, sink.manifest.size_bytes);
        hasher.hash(buf, n).map_err(|e| e.to_string())?;
        if n < STREAM_BUFFER {
            break;
        }
    }
    hasher.finish().map(hex::encode).map_err(|e| e.to_string())
}

/// Reads a block-mapped image's runs into the sink, each from its own
/// range answer (the first already asked for), hashed on its own thread
/// as the sink writes; each run's sha256 checked against the block map's
/// as soon as it is hashed.
fn stream_runs(
    first: Option<reqwest::blocking::Response>,
    fetch_run: &dyn Fn(&DataRange) -> Result<reqwest::blocking::Response, String>,
    runs: &[DataRange],
    sink: &mut Sink<'_>,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(), String> {
    let total: u64 = runs.iter().map(|r| r.length).sum();
    let hasher = Sha256Thread::spawn(vec![vec![0u8; STREAM_BUFFER]; STREAM_BUFFERS])
        .map_err(|e| format!("starting the hashing thread: {e}"))?;
    let mut next = first;
    let mut checked = RunCheck { runs, next: 0 };
    for (i, run) in runs.iter().enumerate() {
        // A run the hashing thread has finished is checked before the next
        // is asked for: a bad run fails the deploy within a few MiB (the
        // thread is at most its buffers behind), not after the last run.
        checked.check(hasher.finished_cuts())?;
        let mut body = match next.take() {
            Some(first) => {
                check_run_answer(&first, run, sink.manifest.size_bytes)?;
                first
            }
            None => fetch_run(run)?,
        };
        sink.seek_raw(run.offset)?;
        let mut got = 0u64;
        while got < run.length {
            let mut buf = hasher.buffer().map_err(|e| e.to_string())?;
            let want = (run.length - got).min(STREAM_BUFFER as u64) as usize;
            let n = fill(&mut body, &mut buf[..want])
                .map_err(|e| format!("reading the run at {}: {e}", run.offset))?;
            if n == 0 {
                break;
            }
            sink.feed(&buf[..n])?;
            progress(sink.downloaded, total);
            hasher.hash(buf, n).map_err(|e| e.to_string())?;
            got += n as u64;
        }
        let mut more = [0u8; 1];
        if got < run.length || fill(&mut body, &mut more).unwrap_or(0) > 0 {
            return Err(format!(
                "run {i} at {}: the answer is {} than the block map's {} bytes",
                run.offset,
                if got < run.length {
                    "shorter"
                } else {
                    "longer"
                },
                run.length
            ));
        }
        hasher.cut().map_err(|e| e.to_string())?;
    }
    checked.check(hasher.finish_cuts().map_err(|e| e.to_string())?)?;
    if checked.next != runs.len() {
        return Err(format!(
            "{} runs hashed of the block map's {}",
            checked.next,
            runs.len()
        ));
    }
    Ok(())
}

/// A block map's runs checked against their signed sha256, in order, as
/// their digests come back from the hashing thread.
struct RunCheck<'a> {
    runs: &'a [DataRange],
    /// The index of the next run to check.
    next: usize,
}

impl RunCheck<'_> {
    fn check(&mut self, digests: Vec<[u8; 32]>) -> Result<(), String> {
        for d in digests {
            let (i, run) = (self.next, self.runs.get(self.next));
            let run = run.ok_or_else(|| {
                format!("more runs hashed than the block map's {}", self.runs.len())
            })?;
            let got = hex::encode(d);
            if got != run.sha256 {
                return Err(format!(
                    "run {i} at {}+{}: sha256 {got} does not match the block map's {}",
                    run.offset, run.length, run.sha256
                ));
            }
            self.next += 1;
        }
        Ok(())
    }
}

/// Reads until `buf` is full or the stream ends; how much it read.
fn fill(source: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match source.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Where the image's bytes go as they arrive: hashed, counted, and written
/// to the disk chunk by chunk (raw) or cluster by cluster (qcow2, converted
/// on the fly).
struct Sink<'a> {
    manifest: &'a Manifest,
    disk: &'a Disk,
    file: &'a std::fs::File,
    written: Written,
    downloaded: u64,
    /// A raw image's chunk being filled, and where it goes.
    raw_fill: Vec<u8>,
    raw_at: u64,
    conv: qcow2::Converter,
    /// The qcow2 cluster size, once its header arrived.
    qcow_chunk: u64,
}

/// The granularity of a raw image's writes and read-back.
const RAW_CHUNK: u64 = 1 << 20;
// A block map's runs start on a chunk, so a run's writes are whole chunks
// of its own (only the image's last may be short).
const _: () = assert!(RAW_CHUNK == bcm_core::deploy::DATA_RANGE_ALIGN);

impl<'a> Sink<'a> {
    fn new(
        manifest: &'a Manifest,
        disk: &'a Disk,
        file: &'a std::fs::File,
        opts: &DeployOptions,
    ) -> Self {
        Self {
            manifest,
            disk,
            file,
            written: Written {
                chunk: RAW_CHUNK,
                digests: HashMap::new(),
                bytes: 0,
                unpushed: 0,
            },
            downloaded: 0,
            raw_fill: Vec::with_capacity(RAW_CHUNK as usize),
            raw_at: 0,
            conv: qcow2::Converter::new(opts.max_held_bytes.unwrap_or(256 << 20)),
            qcow_chunk: 0,
        }
    }

    fn feed(&mut self, data: &[u8]) -> Result<(), String> {
        self.downloaded += data.len() as u64;
        if self.downloaded > self.manifest.size_bytes {
            return Err(format!(
                "the image is longer than the manifest's {} bytes",
                self.manifest.size_bytes
            ));
        }
        match self.manifest.format {
            Format::Raw => self.feed_raw(data),
            Format::Qcow2 => self.feed_qcow2(data),
            Format::Iso => Err(ImageError::NotADiskImage.to_string()),
        }
    }

    fn feed_raw(&mut self, mut rest: &[u8]) -> Result<(), String> {
        while !rest.is_empty() {
            let take = (RAW_CHUNK as usize - self.raw_fill.len()).min(rest.len());
            self.raw_fill.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
            if self.raw_fill.len() as u64 == RAW_CHUNK {
                self.written
                    .record(self.file, self.raw_at, &self.raw_fill)
                    .map_err(|e| format!("writing: {e}"))?;
                self.raw_at += RAW_CHUNK;
                self.raw_fill.clear();
            }
        }
        Ok(())
    }

    fn feed_qcow2(&mut self, data: &[u8]) -> Result<(), String> {
        let (file, written) = (self.file, &mut self.written);
        let mut sink = |o: qcow2::Output<'_>| -> std::io::Result<()> {
            let qcow2::Output::Data { guest, data } = o;
            // Every output is one whole cluster at a cluster-aligned guest
            // offset: record at cluster granularity.
            written.chunk = data.len() as u64;
            written.record(file, guest, data)
        };
        self.conv
            .feed(data, &mut sink)
            .map_err(|e| format!("qcow2: {e}"))?;
        if self.qcow_chunk == 0 {
            if let Some(h) = self.conv.header() {
                self.qcow_chunk = h.cluster_size;
                if h.virtual_size > self.disk.size_bytes {
                    return Err(format!(
                        "the target {} ({} bytes) is smaller than the image ({} bytes)",
                        self.disk.name, self.disk.size_bytes, h.virtual_size
                    ));
                }
            }
        }
        Ok(())
    }

    /// Moves a raw image's writes to `offset` (the start of a block map's
    /// run), writing out the chunk being filled first.
    fn seek_raw(&mut self, offset: u64) -> Result<(), String> {
        if !self.raw_fill.is_empty() {
            self.written
                .record(self.file, self.raw_at, &self.raw_fill)
                .map_err(|e| format!("writing: {e}"))?;
            self.raw_fill.clear();
        }
        self.raw_at = offset;
        Ok(())
    }

    /// Whether every chunk the whole stream wrote (its zeros are not
    /// written) lies inside one of the block map's runs.
    fn check_within_runs(&self, runs: &[DataRange]) -> Result<(), String> {
        let chunk = self.written.chunk;
        let outside = self
            .written
            .digests
            .keys()
            .map(|idx| idx * chunk)
            .filter(|at| {
                // The runs are in order: the one that could hold `at` is
                // the last that starts at or before it.
                let i = runs.partition_point(|r| r.offset <= *at);
                !(i > 0 && *at < runs[i - 1].offset + runs[i - 1].length)
            })
            .min();
        match outside {
            None => Ok(()),
            Some(at) => Err(format!(
                "the image has data at {at}, outside every run of its signed block map"
            )),
        }
    }

    /// After a block-mapped image's last run: its size and the manifest's
    /// sha256, which each run's checked sha256 and the zeros between them
    /// prove (the read-back checks the zeros on the target).
    fn finish_runs(&mut self) -> Result<(u64, String), String> {
        self.seek_raw(0)?;
        Ok((self.manifest.size_bytes, self.manifest.sha256.clone()))
    }

    /// After the last byte, with the stream's sha256: the image's virtual
    /// size and its sha256, once its length and hash are the manifest's.
    fn finish(&mut self, sha: String) -> Result<(u64, String), String> {
        if !self.raw_fill.is_empty() {
            self.written
                .record(self.file, self.raw_at, &self.raw_fill)
                .map_err(|e| format!("writing: {e}"))?;
        }
        let m = self.manifest;
        if self.downloaded != m.size_bytes {
            return Err(format!(
                "the image is {} bytes, the manifest says {}",
                self.downloaded, m.size_bytes
            ));
        }
        if sha != m.sha256 {
            return Err(format!(
                "image sha256 {sha} does not match the manifest's {}",
                m.sha256
            ));
        }
        let virtual_size = match m.format {
            Format::Raw => m.size_bytes,
            Format::Qcow2 => {
                let conv = std::mem::replace(&mut self.conv, qcow2::Converter::new(0));
                let h = conv.finish().map_err(|e| format!("qcow2: {e}"))?;
                self.written.chunk = self.qcow_chunk;
                h.virtual_size
            }
            Format::Iso => return Err(ImageError::NotADiskImage.to_string()),
        };
        Ok((virtual_size, sha))
    }
}

/// Zeroes, in runs, what the image leaves unallocated.
fn zero_holes(
    file: &std::fs::File,
    disk: &Disk,
    written: &Written,
    virtual_size: u64,
) -> Result<(), String> {
    let chunks = virtual_size.div_ceil(written.chunk);
    let mut run: Option<u64> = None;
    for idx in 0..=chunks {
        let hole = idx < chunks && !written.digests.contains_key(&idx);
        match (hole, run) {
            (true, None) => run = Some(idx),
            (false, Some(start)) => {
                let off = start * written.chunk;
                let end = (idx * written.chunk).min(virtual_size);
                disks::zero_fast(file, disk.is_block, off, end - off)
                    .map_err(|e| format!("zeroing unallocated ranges: {e}"))?;
                run = None;
            }
            _ => {}
        }
    }
    Ok(())
}

/// Whether the read-back takes the target's sha256.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TargetHash {
    /// Hash the whole target as it is read.
    Take,
    /// The chunk-by-chunk check proves the target equals a stream whose
    /// sha256 is known: only check.
    Proven,
}

/// Reads the target back around the page cache, each chunk against what
/// was written (zeros where nothing was); with [`TargetHash::Take`], the
/// sha256 of the whole target, hashed on its own thread. The blocks are
/// read by threads, each a block ahead on its own lane (block `i` on lane
/// `i % lanes`: [`READ_LANES`] where blocks are only checked, one where
/// they are hashed too), so reads stay in flight while a block is checked;
/// they are checked (and hashed) in order.
fn read_back(
    disk: &Disk,
    written: &Written,
    virtual_size: u64,
    target_hash: TargetHash,
) -> Result<Option<String>, String> {
    let reader = DirectReader::open(disk).map_err(|e| format!("read-back open: {e}"))?;
    let hasher = match target_hash {
        TargetHash::Take => Some(
            Sha256Thread::spawn((0..2).map(|_| AlignedBuf::new()).collect())
                .map_err(|e| format!("starting the hashing thread: {e}"))?,
        ),
        TargetHash::Proven => None,
    };
    // A chunk (1 MiB, or a qcow2 cluster: a power of two of at most 2 MiB)
    // divides a block, so no chunk straddles two.
    let chunk = written.chunk.max(1);
    let block = disks::IO_BLOCK as u64;
    let blocks = virtual_size.div_ceil(block);
    // Where the blocks are hashed as well, the hashing thread takes the
    // second core: one reader stays a block ahead.
    let lanes = match target_hash {
        TargetHash::Proven => READ_LANES,
        TargetHash::Take => 1,
    } as u64;
    std::thread::scope(|scope| -> Result<(), String> {
        let mut lane_ends = Vec::with_capacity(lanes as usize);
        for lane in 0..lanes {
            let (filled_tx, filled) = sync_channel::<ReadBlock>(1);
            let (free, free_rx) = sync_channel::<AlignedBuf>(LANE_BUFFERS);
            for _ in 0..LANE_BUFFERS {
                let _ = free.send(AlignedBuf::new());
            }
            let reader = &reader;
            std::thread::Builder::new()
                .name("bcd-read-back".into())
                .spawn_scoped(scope, move || {
                    // Stops when the checker hangs up (done, or a mismatch).
                    let mut b = lane;
                    while b < blocks {
                        let Ok(mut buf) = free_rx.recv() else { return };
                        let at = b * block;
                        let n = (virtual_size - at).min(block) as usize;
                        let read = reader.read_block(at, n, &mut buf);
                        if filled_tx.send((at, n, buf, read)).is_err() {
                            return;
                        }
                        b += lanes;
                    }
                })
                .map_err(|e| format!("starting a read-back thread: {e}"))?;
            lane_ends.push((filled, free));
        }
        for b in 0..blocks {
            let (filled, free) = &lane_ends[(b % lanes) as usize];
            let (at, n, buf, read) = filled
                .recv()
                .map_err(|_| "a read-back thread stopped".to_owned())?;
            read.map_err(|e| format!("read-back: {e}"))?;
            for (i, piece) in buf.as_ref()[..n].chunks(chunk as usize).enumerate() {
                let idx = at / chunk + i as u64;
                let same = match written.digests.get(&idx) {
                    Some(d) => digest(piece) == *d,
                    None => is_zero(piece),
                };
                if !same {
                    return Err(format!(
                        "read-back of the target differs from what was written at offset {}",
                        idx * chunk
                    ));
                }
            }
            let next = match &hasher {
                Some(h) => {
                    h.hash(buf, n).map_err(|e| e.to_string())?;
                    h.buffer().map_err(|e| e.to_string())?
                }
                None => buf,
            };
            // A lane that finished has hung up: nothing more to give it.
            let _ = free.send(next);
        }
        Ok(())
    })?;
    match hasher {
        Some(h) => h
            .finish()
            .map(hex::encode)
            .map(Some)
            .map_err(|e| e.to_string()),
        None => Ok(None),
    }
}

/// Threads reading the target back where it is only checked: two reads in
/// flight keep the device busy while a block is checked.
const READ_LANES: usize = 2;
/// Buffers of each read-back lane: it reads its next block while the one
/// before waits to be checked.
const LANE_BUFFERS: usize = 2;

/// A block read back: its offset, length, buffer and whether it was read.
type ReadBlock = (u64, usize, AlignedBuf, std::io::Result<()>);
