//! The profile's user data as a cloud-init NoCloud seed on the installed
//! system. After the image is written, the kernel re-reads the disk's
//! partition table; each partition's file system is mounted in turn until
//! the installed root (one with `/etc`) is found, and
//! `/var/lib/cloud/seed/nocloud/{user-data,meta-data}` are written there
//! (meta-data names the node as the instance). A kernel without partition
//! support (or a disk whose table it did not read) is handled by reading
//! the GPT ourselves and attaching each partition as a loop device with an
//! offset. Without partitions or a root the deploy fails: an OS that cannot
//! read its join token never joins.

use std::ffi::CString;
use std::fs::File;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use crate::disks::Disk;

const BLKRRPART: libc::c_ulong = 0x125f;
const SEED_DIR: &str = "var/lib/cloud/seed/nocloud";
const FS_TYPES: [&str; 4] = ["ext4", "xfs", "btrfs", "vfat"];

/// Where the seed went.
pub use bcm_contracts::outputs::SeedReport;

/// The partitions of a disk, from sysfs, with a device node for each
/// (created from its major:minor when no devtmpfs/udev made one).
fn partitions(disk: &Disk) -> Result<Vec<PathBuf>, String> {
    let base = PathBuf::from("/sys/block").join(&disk.name);
    let mut parts: Vec<String> = std::fs::read_dir(&base)
        .map_err(|e| format!("{}: {e}", base.display()))?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("partition").exists())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    parts.sort();
    let mut out = vec![];
    for p in parts {
        let dev = PathBuf::from("/dev").join(&p);
        if !dev.exists() {
            let numbers = std::fs::read_to_string(base.join(&p).join("dev")).unwrap_or_default();
            let (major, minor) = numbers.trim().split_once(':').unwrap_or(("0", "0"));
            let (major, minor): (u32, u32) =
                (major.parse().unwrap_or(0), minor.parse().unwrap_or(0));
            let path = CString::new(dev.to_string_lossy().as_bytes()).map_err(|e| e.to_string())?;
            // SAFETY: creating a block device node from sysfs's numbers.
            let rc = unsafe {
                libc::mknod(
                    path.as_ptr(),
                    libc::S_IFBLK | 0o600,
                    libc::makedev(major, minor),
                )
            };
            if rc != 0 {
                continue;
            }
        }
        out.push(dev);
    }
    Ok(out)
}

fn mount(dev: &Path, at: &Path, fs: &str) -> bool {
    let (Ok(d), Ok(a), Ok(f)) = (
        CString::new(dev.to_string_lossy().as_bytes()),
        CString::new(at.to_string_lossy().as_bytes()),
        CString::new(fs),
    ) else {
        return false;
    };
    // SAFETY: C strings we own.
    unsafe { libc::mount(d.as_ptr(), a.as_ptr(), f.as_ptr(), 0, std::ptr::null()) == 0 }
}

fn umount(at: &Path) {
    if let Ok(a) = CString::new(at.to_string_lossy().as_bytes()) {
        // SAFETY: unmounting what we mounted.
        unsafe { libc::umount(a.as_ptr()) };
    }
}

/// `(first byte, length)` of every used GPT entry of `disk` (512-byte
/// sectors; the protective MBR is ignored).
pub fn gpt_partitions(disk: &Disk) -> Result<Vec<(u64, u64)>, String> {
    use std::os::unix::fs::FileExt;
    let f = File::open(&disk.path).map_err(|e| format!("{}: {e}", disk.path.display()))?;
    let mut hdr = [0u8; 92];
    f.read_exact_at(&mut hdr, 512)
        .map_err(|e| format!("reading the GPT header: {e}"))?;
    if &hdr[..8] != b"EFI PART" {
        return Err("no GPT on the disk".into());
    }
    let le64 = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or([0; 8]));
    let le32 = |b: &[u8], at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or([0; 4]));
    let (entries_lba, count, size) = (le64(&hdr, 72), le32(&hdr, 80) as u64, le32(&hdr, 84) as u64);
    if !(128..=4096).contains(&size) || count > 1024 {
        return Err("malformed GPT header".into());
    }
    let mut table = vec![0u8; (count * size) as usize];
    f.read_exact_at(&mut table, entries_lba * 512)
        .map_err(|e| format!("reading the GPT entries: {e}"))?;
    let mut out = vec![];
    for e in table.chunks(size as usize) {
        if e[..16].iter().all(|b| *b == 0) {
            continue;
        }
        let (first, last) = (le64(e, 32), le64(e, 40));
        if last >= first && (last + 1) * 512 <= disk.size_bytes {
            out.push((first * 512, (last - first + 1) * 512));
        }
    }
    Ok(out)
}

/// `struct loop_info64` of `<linux/loop.h>`.
#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

const LOOP_SET_FD: libc::c_ulong = 0x4C00;
const LOOP_CLR_FD: libc::c_ulong = 0x4C01;
const LOOP_SET_STATUS64: libc::c_ulong = 0x4C04;
const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LO_FLAGS_AUTOCLEAR: u32 = 4;

/// A loop device over `[offset, offset + len)` of `disk`, detached by the
/// kernel when its last user (our descriptor, then a mount) lets go.
fn attach_partition(disk: &Disk, offset: u64, len: u64) -> Result<(PathBuf, File), String> {
    let ctl = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/loop-control")
        .map_err(|e| format!("/dev/loop-control: {e}"))?;
    // SAFETY: LOOP_CTL_GET_FREE takes no argument.
    let n = unsafe { libc::ioctl(ctl.as_raw_fd(), LOOP_CTL_GET_FREE) };
    if n < 0 {
        return Err(format!(
            "no free loop device: {}",
            std::io::Error::last_os_error()
        ));
    }
    let path = PathBuf::from(format!("/dev/loop{n}"));
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let backing = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&disk.path)
        .map_err(|e| format!("{}: {e}", disk.path.display()))?;
    // SAFETY: LOOP_SET_FD takes the backing descriptor.
    if unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_SET_FD, backing.as_raw_fd()) } != 0 {
        return Err(format!("LOOP_SET_FD: {}", std::io::Error::last_os_error()));
    }
    let info = LoopInfo64 {
        lo_device: 0,
        lo_inode: 0,
        lo_rdevice: 0,
        lo_offset: offset,
        lo_sizelimit: len,
        lo_number: 0,
        lo_encrypt_type: 0,
        lo_encrypt_key_size: 0,
        lo_flags: LO_FLAGS_AUTOCLEAR,
        lo_file_name: [0; 64],
        lo_crypt_name: [0; 64],
        lo_encrypt_key: [0; 32],
        lo_init: [0; 2],
    };
    // SAFETY: the kernel reads the struct we own.
    if unsafe {
        libc::ioctl(
            dev.as_raw_fd(),
            LOOP_SET_STATUS64,
            &info as *const LoopInfo64,
        )
    } != 0
    {
        let e = std::io::Error::last_os_error();
        // SAFETY: detaching what we attached.
        unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_CLR_FD, 0) };
        return Err(format!("LOOP_SET_STATUS64: {e}"));
    }
    Ok((path, dev))
}

/// Where an installed OS's `bcd node` reads the quorum anchor.
const ANCHOR: &str = "etc/bcd/trust/quorum-anchor.json";

/// Writes the NoCloud seed onto the installed root of `disk`, and the
/// quorum anchor this deploy was verified under (`anchor`) where the
/// installed OS's `bcd node` reads it, unless the image pins its own: the
/// OS then checks what a rescue asks of it (`node.powerOff`) as the ramdisk
/// checked the deploy, against the site's approvers and never against
/// anything the control plane sent.
pub fn write_nocloud(
    disk: &Disk,
    user_data: &str,
    node_id: &str,
    anchor: Option<&bcm_quorum::Anchor>,
) -> Result<SeedReport, String> {
    if !disk.is_block {
        return Err(format!(
            "{} is a plain file: no partitions to find the installed root in",
            disk.path.display()
        ));
    }
    let file = File::open(&disk.path).map_err(|e| format!("{}: {e}", disk.path.display()))?;
    // SAFETY: BLKRRPART takes no argument.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), BLKRRPART, 0) };
    if rc != 0 {
        tracing::warn!(error = %std::io::Error::last_os_error(), "re-reading the partition table");
    }
    drop(file);
    let mut parts = partitions(disk)?;
    // The kernel did not (or cannot) read the table: attach each GPT
    // partition as a loop device with an offset. Their descriptors stay
    // open until we are done; autoclear detaches them afterwards.
    let mut held = vec![];
    if parts.is_empty() {
        let gpt = gpt_partitions(disk)
            .map_err(|e| format!("the image left no partitions on {}: {e}", disk.name))?;
        for (offset, len) in gpt {
            let (path, fd) = attach_partition(disk, offset, len)?;
            parts.push(path);
            held.push(fd);
        }
    }
    if parts.is_empty() {
        return Err(format!("the image left no partitions on {}", disk.name));
    }
    let at = PathBuf::from(format!("/run/bcd/seed-{}", std::process::id()));
    std::fs::create_dir_all(&at).map_err(|e| format!("{}: {e}", at.display()))?;
    for part in &parts {
        for fs in FS_TYPES {
            if !mount(part, &at, fs) {
                continue;
            }
            if !at.join("etc").is_dir() {
                umount(&at);
                break; // a file system, but not the root: next partition
            }
            let dir = at.join(SEED_DIR);
            let wrote = std::fs::create_dir_all(&dir)
                .and_then(|()| std::fs::write(dir.join("user-data"), user_data))
                .and_then(|()| {
                    std::fs::write(
                        dir.join("meta-data"),
                        format!("instance-id: {node_id}\nlocal-hostname: {node_id}\n"),
                    )
                })
                .and_then(|()| File::open(dir.join("user-data"))?.sync_all())
                .and_then(|()| write_anchor(&at, anchor));
            umount(&at);
            let _ = std::fs::remove_dir(&at);
            return match wrote {
                Ok(()) => Ok(SeedReport {
                    partition: part.display().to_string(),
                    fs_type: fs.to_owned(),
                    path: format!("/{SEED_DIR}"),
                    user_data_bytes: user_data.len(),
                }),
                Err(e) => Err(format!("writing the seed on {}: {e}", part.display())),
            };
        }
    }
    let _ = std::fs::remove_dir(&at);
    Err(format!(
        "no partition of {} holds an installed root (a file system with /etc)",
        disk.name
    ))
}

/// The anchor at `root/etc/bcd/trust/quorum-anchor.json`, unless a file is
/// there already (the image's own comes first).
fn write_anchor(root: &Path, anchor: Option<&bcm_quorum::Anchor>) -> std::io::Result<()> {
    let Some(anchor) = anchor else {
        return Ok(());
    };
    let path = root.join(ANCHOR);
    if path.exists() {
        tracing::info!(path = %path.display(), "the image pins its own quorum anchor; keeping it");
        return Ok(());
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let json = serde_json::to_vec_pretty(anchor).map_err(std::io::Error::other)?;
    std::fs::write(&path, json)?;
    File::open(&path)?.sync_all()?;
    tracing::info!(path = %path.display(), "wrote the quorum anchor for the installed OS's bcd");
    Ok(())
}
