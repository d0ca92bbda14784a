//! `disk.wipe`: `quick` (both ends of the disk, where partition tables,
//! file-system, RAID and LVM signatures live, plus the secondary
//! superblocks some file systems keep further in), `secure-erase` and
//! `crypto-erase`: on each disk the first method of the pool's list for
//! the mode that the disk can do (NVMe sanitize or format, ATA security
//! erase, SCSI sanitize, else a full overwrite read back byte for byte,
//! where the pool admits it). A disk that can do none of them fails with
//! the reason and is left as it was: never a silent downgrade. Then
//! read-back verification around the page cache of every erased region
//! and sampled stripes. The report lists every disk with its serial, the
//! mode, the method actually used, regions and outcome; the caller signs
//! it.

use std::fs::File;
use std::io;

use bcm_core::erase::{self, EraseFamily, EraseMethod};
use bcm_core::WipeMode;
use rand::Rng;

use crate::disks::{self, DirectReader, Disk};

/// The wipe methods of the spec that erase something.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Quick,
    SecureErase,
    CryptoErase,
}

impl Method {
    /// The method of a wipe mode; `none` erases nothing.
    pub fn of(mode: WipeMode) -> Option<Method> {
        match mode {
            WipeMode::None => None,
            WipeMode::Quick => Some(Method::Quick),
            WipeMode::SecureErase => Some(Method::SecureErase),
            WipeMode::CryptoErase => Some(Method::CryptoErase),
        }
    }

    /// The wipe mode it carries out.
    pub fn mode(self) -> WipeMode {
        match self {
            Method::Quick => WipeMode::Quick,
            Method::SecureErase => WipeMode::SecureErase,
            Method::CryptoErase => WipeMode::CryptoErase,
        }
    }
}

/// How much of each end a quick wipe zeroes.
pub const END_BYTES: u64 = 64 << 20;
/// The size of a sampled stripe.
pub const STRIPE_BYTES: u64 = 1 << 20;
/// Secondary superblocks beyond the head: btrfs mirrors at 64 MiB and
/// 256 GiB (ext4's backups live in block groups the head's zeroed group
/// descriptors no longer point to, and no prober trusts them alone).
const MIRRORS: [u64; 2] = [64 << 20, 256 << 30];

pub use bcm_contracts::outputs::{CheckedRegion as Checked, Region, WipeOutcome};

/// What happened to one disk: the report the wipe's result lists.
pub use bcm_contracts::outputs::DiskWipe as DiskReport;

fn align_down(v: u64) -> u64 {
    v & !4095
}

/// The regions a quick wipe zeroes on a disk of `size` bytes.
pub fn quick_regions(size: u64) -> Vec<Region> {
    let head = END_BYTES.min(size);
    let tail_start = align_down(size.saturating_sub(END_BYTES)).max(head);
    let mut out = vec![Region {
        offset: 0,
        len: head,
    }];
    for m in MIRRORS {
        let end = (m + STRIPE_BYTES).min(tail_start);
        if m >= head && m < end {
            out.push(Region {
                offset: m,
                len: end - m,
            });
        }
    }
    if size > tail_start {
        out.push(Region {
            offset: tail_start,
            len: size - tail_start,
        });
    }
    out
}

/// What a clean region reads as after `used`: zeros after the agent's own
/// writes, or (a device erase) one uniform byte, 0x00 or 0xFF, which some
/// devices return.
fn clean(chunk: &[u8], used: EraseMethod) -> bool {
    match used {
        EraseMethod::Quick | EraseMethod::OverwriteVerified => chunk.iter().all(|b| *b == 0),
        _ => {
            let first = chunk.first().copied().unwrap_or(0);
            (first == 0 || first == 0xff) && chunk.iter().all(|b| *b == first)
        }
    }
}

/// Why a method did not erase a disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EraseError {
    /// The disk cannot do it; nothing was changed (the next admitted
    /// method is tried).
    Unsupported(String),
    /// It began and failed: the wipe stops with this reason.
    Failed(String),
}

/// Which erase commands a disk of `transport` speaks.
pub fn family_of(transport: crate::disks::Transport) -> EraseFamily {
    use crate::disks::Transport;
    match transport {
        Transport::Nvme => EraseFamily::Nvme,
        Transport::Ata => EraseFamily::Ata,
        Transport::Scsi => EraseFamily::Scsi,
        Transport::Virtio | Transport::Loop | Transport::File | Transport::Other => {
            EraseFamily::Overwrite
        }
    }
}

/// The methods an older control plane (no list in the command) admits:
/// the NVMe device erase of the mode, as before lists existed.
fn legacy(method: Method) -> Vec<EraseMethod> {
    match method {
        Method::Quick => vec![EraseMethod::Quick],
        Method::SecureErase => vec![EraseMethod::NvmeFormat],
        Method::CryptoErase => vec![EraseMethod::NvmeCryptoFormat],
    }
}

/// Every byte of the disk written with zeros, with a log line each tenth.
fn overwrite(file: &File, disk: &Disk) -> io::Result<Vec<Region>> {
    const CHUNK: u64 = 256 << 20;
    let mut done = 0u64;
    let mut tenth = 0;
    while done < disk.size_bytes {
        let n = CHUNK.min(disk.size_bytes - done);
        disks::write_zeros(file, done, n)?;
        done += n;
        let now = done * 10 / disk.size_bytes.max(1);
        if now != tenth {
            tenth = now;
            tracing::info!(disk = %disk.name, percent = now * 10, "overwriting");
        }
    }
    Ok(vec![Region {
        offset: 0,
        len: disk.size_bytes,
    }])
}

/// Runs one method on an open disk: the regions it erased.
fn run(file: &File, disk: &Disk, m: EraseMethod) -> Result<Vec<Region>, EraseError> {
    use crate::sgio::Sanitize;
    let whole = || {
        vec![Region {
            offset: 0,
            len: disk.size_bytes,
        }]
    };
    let written =
        |r: io::Result<Vec<Region>>| r.map_err(|e| EraseError::Failed(format!("write: {e}")));
    match m {
        EraseMethod::Quick => written(erase_quick(file, disk)),
        EraseMethod::OverwriteVerified => written(overwrite(file, disk)),
        EraseMethod::NvmeFormat => crate::nvme::format(file, disk, false).map(|_| whole()),
        EraseMethod::NvmeCryptoFormat => crate::nvme::format(file, disk, true).map(|_| whole()),
        EraseMethod::NvmeSanitizeBlock => crate::nvme::sanitize(file, disk, false).map(|_| whole()),
        EraseMethod::NvmeSanitizeCrypto => crate::nvme::sanitize(file, disk, true).map(|_| whole()),
        EraseMethod::AtaSecurityErase => {
            crate::sgio::ata_security_erase(file, false).map(|_| whole())
        }
        EraseMethod::AtaEnhancedSecurityErase => {
            crate::sgio::ata_security_erase(file, true).map(|_| whole())
        }
        EraseMethod::ScsiSanitizeBlock => {
            crate::sgio::scsi_sanitize(file, Sanitize::BlockErase).map(|_| whole())
        }
        EraseMethod::ScsiSanitizeCrypto => {
            crate::sgio::scsi_sanitize(file, Sanitize::CryptoErase).map(|_| whole())
        }
        EraseMethod::ScsiSanitizeOverwrite => {
            crate::sgio::scsi_sanitize(file, Sanitize::Overwrite).map(|_| whole())
        }
    }
}

/// Reads the head, the tail, every wiped region and `stripes` random
/// stripes (inside what was wiped) back from the device.
pub fn verify(
    disk: &Disk,
    method: EraseMethod,
    wiped: &[Region],
    stripes: usize,
) -> io::Result<Vec<Checked>> {
    let mut reader = DirectReader::open(disk)?;
    let mut targets: Vec<(String, Region)> = vec![];
    for (i, r) in wiped.iter().enumerate() {
        let name = if r.offset == 0 {
            "head".to_owned()
        } else if r.offset + r.len == disk.size_bytes {
            "tail".to_owned()
        } else {
            format!("region-{i}")
        };
        targets.push((name, *r));
    }
    let mut rng = rand::thread_rng();
    let candidates: Vec<&Region> = wiped.iter().filter(|r| r.len >= STRIPE_BYTES).collect();
    for i in 0..stripes {
        if candidates.is_empty() {
            break;
        }
        let r = candidates[rng.gen_range(0..candidates.len())];
        let slots = (r.len - STRIPE_BYTES) / 4096;
        let offset = r.offset + rng.gen_range(0..=slots) * 4096;
        targets.push((
            format!("stripe-{}", i + 1),
            Region {
                offset,
                len: STRIPE_BYTES,
            },
        ));
    }
    let mut out = vec![];
    for (name, r) in targets {
        let mut ok = true;
        reader.read_range(r.offset, r.len, |chunk| ok &= clean(chunk, method))?;
        out.push(Checked {
            name,
            offset: r.offset,
            len: r.len,
            ok,
        });
    }
    Ok(out)
}

fn erase_quick(file: &File, disk: &Disk) -> io::Result<Vec<Region>> {
    let regions = quick_regions(disk.size_bytes);
    for r in &regions {
        disks::write_zeros(file, r.offset, r.len)?;
    }
    Ok(regions)
}

/// Wipes one disk with `method`, by the first of `admitted` (the pool's
/// methods for the mode, in order; empty: an older control plane's NVMe
/// erase) that the disk can do, and reads it back.
pub fn wipe_disk(
    disk: &Disk,
    method: Method,
    admitted: &[EraseMethod],
    stripes: usize,
) -> DiskReport {
    let started = std::time::Instant::now();
    let mut report = DiskReport {
        name: disk.name.clone(),
        serial: disk.serial.clone(),
        model: disk.model.clone(),
        size_bytes: disk.size_bytes,
        transport: disk.transport,
        method: method.mode(),
        erase: None,
        wiped_regions: vec![],
        verified_regions: vec![],
        outcome: WipeOutcome::Failed,
        reason: None,
        millis: 0,
    };
    let admitted = if admitted.is_empty() {
        legacy(method)
    } else {
        admitted.to_vec()
    };
    let family = family_of(disk.transport);
    let tries = erase::candidates(&admitted, family);
    let names = |l: &[EraseMethod]| l.iter().map(|m| m.as_str()).collect::<Vec<_>>().join(", ");
    let erased = (|| -> Result<(EraseMethod, Vec<Region>), String> {
        if tries.is_empty() {
            let what = if family == EraseFamily::Overwrite {
                format!("{} ({:?}) has no erase command", disk.name, disk.transport)
            } else {
                format!("{} ({:?}) offers none of them", disk.name, disk.transport)
            };
            return Err(format!(
                "{what}, and the pool admits only {} for {}; nothing was erased",
                names(&admitted),
                method.mode()
            ));
        }
        let file = disks::open_write(disk).map_err(|e| format!("open: {e}"))?;
        let mut refused = vec![];
        for m in &tries {
            match run(&file, disk, *m) {
                Ok(regions) => {
                    disks::flush(&file, disk.is_block).map_err(|e| format!("{m}: flush: {e}"))?;
                    return Ok((*m, regions));
                }
                Err(EraseError::Unsupported(why)) => {
                    tracing::info!(disk = %disk.name, method = %m, %why, "the disk cannot; trying the next admitted method");
                    refused.push(format!("{m}: {why}"));
                }
                Err(EraseError::Failed(why)) => return Err(format!("{m}: {why}")),
            }
        }
        Err(format!(
            "{} can do none of the methods the pool admits for {} ({}); nothing was erased",
            disk.name,
            method.mode(),
            refused.join("; ")
        ))
    })();
    match erased {
        Err(why) => report.reason = Some(why),
        Ok((used, regions)) => {
            report.erase = Some(used);
            let stripes = if method == Method::Quick {
                stripes.min(4)
            } else {
                stripes
            };
            match verify(disk, used, &regions, stripes) {
                Err(e) => report.reason = Some(format!("read-back: {e}")),
                Ok(checked) => {
                    let bad: Vec<&str> = checked
                        .iter()
                        .filter(|c| !c.ok)
                        .map(|c| c.name.as_str())
                        .collect();
                    if bad.is_empty() {
                        report.outcome = WipeOutcome::Verified;
                    } else {
                        report.reason = Some(format!(
                            "read-back found data in {} after {used}: the device did not keep the writes",
                            bad.join(", ")
                        ));
                    }
                    report.verified_regions = checked;
                }
            }
            report.wiped_regions = regions;
        }
    }
    report.millis = started.elapsed().as_millis() as u64;
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quick_regions_cover_both_ends_and_the_mirrors() {
        let gib = 1u64 << 30;
        let r = quick_regions(300 * gib);
        assert_eq!(
            r[0],
            Region {
                offset: 0,
                len: END_BYTES
            }
        );
        assert_eq!(
            r[1],
            Region {
                offset: 64 << 20,
                len: STRIPE_BYTES
            }
        );
        assert_eq!(
            r[2],
            Region {
                offset: 256 * gib,
                len: STRIPE_BYTES
            }
        );
        assert_eq!(
            r[3],
            Region {
                offset: 300 * gib - END_BYTES,
                len: END_BYTES
            }
        );
        // A small disk is zeroed whole, once.
        let r = quick_regions(100 << 20);
        assert_eq!(r.iter().map(|x| x.len).sum::<u64>(), 100 << 20);
        assert!(r.windows(2).all(|w| w[0].offset + w[0].len <= w[1].offset));
        let r = quick_regions(10 << 20);
        assert_eq!(
            r,
            vec![Region {
                offset: 0,
                len: 10 << 20
            }]
        );
    }

    #[test]
    fn clean_means_zeros_for_our_writes_and_uniform_for_device_erase() {
        assert!(clean(&[0; 64], EraseMethod::Quick));
        assert!(!clean(&[0xff; 64], EraseMethod::Quick));
        assert!(!clean(&[0xff; 64], EraseMethod::OverwriteVerified));
        assert!(clean(&[0xff; 64], EraseMethod::NvmeFormat));
        let mut mixed = [0u8; 64];
        mixed[7] = 1;
        assert!(!clean(&mixed, EraseMethod::NvmeCryptoFormat));
    }
}
