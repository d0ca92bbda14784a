//! qcow2 → raw in one sequential pass, for streaming an image from HTTP
//! straight to disk with no scratch space (a ramdisk has none). Clusters
//! arrive in file order; the header, the L1 table and each L2 table map
//! host clusters to guest offsets, and a data cluster that arrives before
//! the L2 table naming it is held in memory (bounded) until it is named.
//! Images qemu-img writes put metadata first, so little is ever held.
//! Refused with a clear reason: backing files, encryption, external data
//! files, extended L2 entries and compressed clusters. Hand-written because
//! the qcow2 crates need random access to the file.

use std::collections::HashMap;

/// Why an image cannot be converted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Qcow2Error {
    #[error("not a qcow2 image (bad magic)")]
    BadMagic,
    #[error("qcow2 version {0} is not supported")]
    Version(u32),
    #[error("qcow2 image uses {0}, which streaming cannot honour")]
    Unsupported(&'static str),
    #[error("qcow2 cluster_bits {0} is out of range")]
    ClusterBits(u32),
    #[error("qcow2 metadata is inconsistent: {0}")]
    Corrupt(String),
    #[error(
        "qcow2 layout holds more than {0} MiB of data before naming it; convert the image to raw"
    )]
    TooMuchHeld(u64),
    #[error("the image ended before {0} data clusters it names arrived")]
    Truncated(usize),
}

/// The parsed header fields that matter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub cluster_size: u64,
    pub virtual_size: u64,
    pub l1_entries: u64,
    pub l1_offset: u64,
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn be64(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(x)
}

/// The bytes of the header needed to parse it.
pub const HEADER_BYTES: usize = 112;

/// Parses a qcow2 header (the first [`HEADER_BYTES`] of the file).
pub fn parse_header(b: &[u8]) -> Result<Header, Qcow2Error> {
    if b.len() < 72 || be32(b, 0) != 0x5146_49fb {
        return Err(Qcow2Error::BadMagic);
    }
    let version = be32(b, 4);
    if version != 2 && version != 3 {
        return Err(Qcow2Error::Version(version));
    }
    if be64(b, 8) != 0 {
        return Err(Qcow2Error::Unsupported("a backing file"));
    }
    let cluster_bits = be32(b, 20);
    if !(9..=21).contains(&cluster_bits) {
        return Err(Qcow2Error::ClusterBits(cluster_bits));
    }
    if be32(b, 32) != 0 {
        return Err(Qcow2Error::Unsupported("encryption"));
    }
    if version == 3 {
        if b.len() < 104 {
            return Err(Qcow2Error::Corrupt("short v3 header".into()));
        }
        let incompatible = be64(b, 72);
        if incompatible & 0b10 != 0 {
            return Err(Qcow2Error::Unsupported("the corrupt bit"));
        }
        if incompatible & 0b100 != 0 {
            return Err(Qcow2Error::Unsupported("an external data file"));
        }
        if incompatible & 0b1_0000 != 0 {
            return Err(Qcow2Error::Unsupported("extended L2 entries"));
        }
        if incompatible & !0b1_1111 != 0 {
            return Err(Qcow2Error::Unsupported("unknown incompatible features"));
        }
    }
    Ok(Header {
        cluster_size: 1 << cluster_bits,
        virtual_size: be64(b, 24),
        l1_entries: be32(b, 36) as u64,
        l1_offset: be64(b, 40),
    })
}

const OFFSET_MASK: u64 = 0x00ff_ffff_ffff_fe00;
const COMPRESSED: u64 = 1 << 62;

/// What to do with the guest image.
#[derive(Debug, PartialEq, Eq)]
pub enum Output<'a> {
    /// Write this cluster's data at this guest offset.
    Data { guest: u64, data: &'a [u8] },
}

/// The streaming converter: feed it the file's bytes in order.
pub struct Converter {
    header: Option<Header>,
    /// Bytes of the current cluster (or of the header before it is known).
    buf: Vec<u8>,
    /// File offset of `buf[0]`.
    at: u64,
    l1: Vec<u8>,
    /// L2 table host offset → index in L1.
    l2_tables: HashMap<u64, u64>,
    /// Data cluster host offset → guest offsets.
    data: HashMap<u64, Vec<u64>>,
    /// Clusters seen before anything named them.
    held: HashMap<u64, Vec<u8>>,
    held_bytes: u64,
    max_held: u64,
    /// All-zero clusters seen before anything named them (not held: the
    /// guest range reads as zeros anyway).
    zero_seen: std::collections::HashSet<u64>,
    pending_named: usize,
}

impl Converter {
    /// A converter that holds at most `max_held` bytes of unnamed clusters.
    pub fn new(max_held: u64) -> Self {
        Self {
            header: None,
            buf: vec![],
            at: 0,
            l1: vec![],
            l2_tables: HashMap::new(),
            data: HashMap::new(),
            held: HashMap::new(),
            held_bytes: 0,
            max_held,
            zero_seen: Default::default(),
            pending_named: 0,
        }
    }

    /// The header, once the first bytes arrived.
    pub fn header(&self) -> Option<&Header> {
        self.header.as_ref()
    }

    /// Feeds the next bytes of the file; `out` receives guest writes.
    pub fn feed(
        &mut self,
        mut bytes: &[u8],
        out: &mut dyn FnMut(Output<'_>) -> std::io::Result<()>,
    ) -> Result<(), FeedError> {
        while !bytes.is_empty() {
            let want = match &self.header {
                None => HEADER_BYTES,
                Some(h) => h.cluster_size as usize,
            };
            let take = (want - self.buf.len()).min(bytes.len());
            self.buf.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.buf.len() < want {
                break;
            }
            if self.header.is_none() {
                let h = parse_header(&self.buf)?;
                if !h.l1_offset.is_multiple_of(h.cluster_size) || h.l1_offset == 0 {
                    return Err(Qcow2Error::Corrupt("unaligned L1 table".into()).into());
                }
                self.header = Some(h);
                // Keep the header bytes: they are the start of cluster 0.
                continue;
            }
            let cluster = std::mem::take(&mut self.buf);
            let host = self.at;
            self.at += cluster.len() as u64;
            self.cluster(host, cluster, out)?;
        }
        Ok(())
    }

    fn cluster(
        &mut self,
        host: u64,
        data: Vec<u8>,
        out: &mut dyn FnMut(Output<'_>) -> std::io::Result<()>,
    ) -> Result<(), FeedError> {
        let Some(h) = self.header.clone() else {
            return Ok(());
        };
        let cs = h.cluster_size;
        let l1_len = h.l1_entries * 8;
        if host >= h.l1_offset && host < h.l1_offset + l1_len {
            let need = (l1_len - (host - h.l1_offset)).min(cs) as usize;
            self.l1.extend_from_slice(&data[..need]);
            if self.l1.len() as u64 == l1_len {
                for i in 0..h.l1_entries {
                    let e = be64(&self.l1, (i * 8) as usize) & OFFSET_MASK;
                    if e != 0 {
                        if !e.is_multiple_of(cs) || e < self.at {
                            // An L2 table before the L1 table that names it
                            // would have to have been held: refuse plainly.
                            return Err(Qcow2Error::Corrupt(format!(
                                "L2 table at {e} precedes the L1 table or is unaligned"
                            ))
                            .into());
                        }
                        self.l2_tables.insert(e, i);
                    }
                }
            }
            return Ok(());
        }
        if let Some(l1_index) = self.l2_tables.remove(&host) {
            let per = cs / 8;
            for j in 0..per {
                let e = be64(&data, (j * 8) as usize);
                let guest = (l1_index * per + j) * cs;
                if e & COMPRESSED != 0 {
                    return Err(Qcow2Error::Unsupported("compressed clusters").into());
                }
                let off = e & OFFSET_MASK;
                // Bit 0 (v3) "reads as zeros", or unallocated: nothing to
                // write; the caller zeroes what was never written.
                if off == 0 || e & 1 != 0 || guest >= h.virtual_size {
                    continue;
                }
                if !off.is_multiple_of(cs) {
                    return Err(Qcow2Error::Corrupt(format!("unaligned data cluster {off}")).into());
                }
                if let Some(held) = self.held.remove(&off) {
                    self.held_bytes -= held.len() as u64;
                    out(Output::Data { guest, data: &held }).map_err(FeedError::Io)?;
                    continue;
                }
                if off < self.at && self.zero_seen.contains(&off) {
                    continue;
                }
                if off < self.at {
                    // Seen and not held (metadata, or a shared cluster
                    // already written: internal snapshots are refused).
                    if !self.data.contains_key(&off) {
                        return Err(Qcow2Error::Corrupt(format!(
                            "data cluster {off} precedes the L2 table that names it and was not held"
                        ))
                        .into());
                    }
                }
                self.data.entry(off).or_default().push(guest);
                self.pending_named += 1;
            }
            return Ok(());
        }
        if let Some(guests) = self.data.remove(&host) {
            for guest in guests {
                self.pending_named -= 1;
                out(Output::Data { guest, data: &data }).map_err(FeedError::Io)?;
            }
            return Ok(());
        }
        if host == 0 {
            return Ok(()); // the header cluster
        }
        if data.iter().all(|b| *b == 0) {
            self.zero_seen.insert(host);
            return Ok(());
        }
        self.held_bytes += data.len() as u64;
        if self.held_bytes > self.max_held {
            return Err(Qcow2Error::TooMuchHeld(self.max_held >> 20).into());
        }
        self.held.insert(host, data);
        Ok(())
    }

    /// Ends the stream: every named cluster must have arrived.
    pub fn finish(self) -> Result<Header, Qcow2Error> {
        let h = self.header.ok_or(Qcow2Error::BadMagic)?;
        if self.pending_named > 0 || !self.l2_tables.is_empty() {
            return Err(Qcow2Error::Truncated(
                self.pending_named + self.l2_tables.len(),
            ));
        }
        Ok(h)
    }
}

/// A feed failure: the image, or writing its output.
#[derive(Debug, thiserror::Error)]
pub enum FeedError {
    #[error(transparent)]
    Image(#[from] Qcow2Error),
    #[error("writing the target: {0}")]
    Io(std::io::Error),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_what_it_cannot_stream() {
        assert_eq!(
            parse_header(
                b"not a qcow2 at all, definitely not one, no, not at all, nope, really no"
            ),
            Err(Qcow2Error::BadMagic)
        );
        let mut h = vec![0u8; HEADER_BYTES];
        h[..4].copy_from_slice(&0x5146_49fbu32.to_be_bytes());
        h[4..8].copy_from_slice(&3u32.to_be_bytes());
        h[20..24].copy_from_slice(&16u32.to_be_bytes());
        h[40..48].copy_from_slice(&(3u64 << 16).to_be_bytes());
        assert!(parse_header(&h).is_ok());
        let mut b = h.clone();
        b[8..16].copy_from_slice(&512u64.to_be_bytes());
        assert_eq!(
            parse_header(&b),
            Err(Qcow2Error::Unsupported("a backing file"))
        );
        let mut e = h.clone();
        e[32..36].copy_from_slice(&1u32.to_be_bytes());
        assert_eq!(parse_header(&e), Err(Qcow2Error::Unsupported("encryption")));
        let mut x = h.clone();
        x[72..80].copy_from_slice(&0b100u64.to_be_bytes());
        assert_eq!(
            parse_header(&x),
            Err(Qcow2Error::Unsupported("an external data file"))
        );
        let mut v = h;
        v[4..8].copy_from_slice(&7u32.to_be_bytes());
        assert_eq!(parse_header(&v), Err(Qcow2Error::Version(7)));
    }
}
