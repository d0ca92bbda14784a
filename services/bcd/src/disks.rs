//! The machine's disks: discovery from `/sys/block` (or the devices and
//! plain files named on the command line, for tests), their identity
//! (model, serial, transport, rotational), and the I/O primitives the wipe
//! and the image writer share: writing zeros, flushing every cache between
//! us and the medium, and reading back around the page cache (O_DIRECT, or
//! dropped pages where a file system refuses O_DIRECT).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
const BLKFLSBUF: libc::c_ulong = 0x1261;
const BLKZEROOUT: libc::c_ulong = 0x127f;

/// The I/O block for zeroing and reading back.
pub const IO_BLOCK: usize = 4 << 20;
const ALIGN: usize = 4096;

pub use bcm_contracts::outputs::Transport;

/// A disk bcd may inspect, wipe or write.
#[derive(Debug, Clone)]
pub struct Disk {
    pub name: String,
    pub path: PathBuf,
    pub size_bytes: u64,
    pub model: String,
    pub serial: String,
    pub rotational: bool,
    pub transport: Transport,
    pub is_block: bool,
}

impl Disk {
    /// The disk as the inventory reports it.
    pub fn info(&self) -> bcm_contracts::outputs::DiskInfo {
        bcm_contracts::outputs::DiskInfo {
            name: self.name.clone(),
            path: self.path.display().to_string(),
            size_bytes: self.size_bytes,
            model: self.model.clone(),
            serial: self.serial.clone(),
            rotational: self.rotational,
            transport: self.transport,
        }
    }
}

/// A sysfs attribute as text: trimmed, without the NUL characters some
/// firmware pads its strings with (the control plane cannot store them, and
/// a signed result cannot be cleaned after signing); `None` when absent or
/// empty.
pub(crate) fn sys(path: impl AsRef<Path>) -> Option<String> {
    std::fs::read_to_string(path).ok().and_then(|s| clean(&s))
}

/// `text` trimmed and without NUL characters; `None` when nothing is left.
pub(crate) fn clean(text: &str) -> Option<String> {
    let s: String = text.chars().filter(|c| *c != '\0').collect();
    let s = s.trim();
    (!s.is_empty()).then(|| s.to_owned())
}

/// The disks of this machine: `explicit` paths when given (block devices or
/// plain files), else every whole disk in `/sys/block` that is not a loop,
/// RAM, optical, floppy or device-mapper device.
pub fn discover(explicit: &[PathBuf]) -> io::Result<Vec<Disk>> {
    if !explicit.is_empty() {
        return explicit.iter().map(|p| describe(p)).collect();
    }
    let mut out = vec![];
    let mut names: Vec<String> = std::fs::read_dir("/sys/block")?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    for name in names {
        let skip = ["loop", "ram", "zram", "sr", "fd", "dm-", "md", "nbd"];
        if skip.iter().any(|p| name.starts_with(p)) {
            continue;
        }
        if sys(format!("/sys/block/{name}/removable")).as_deref() == Some("1") {
            continue;
        }
        out.push(describe(&PathBuf::from(format!("/dev/{name}")))?);
    }
    Ok(out)
}

/// Describes one block device or plain file.
pub fn describe(path: &Path) -> io::Result<Disk> {
    let meta = std::fs::metadata(path)?;
    let is_block = meta.file_type().is_block_device();
    let canonical = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
    let name = canonical
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if !is_block {
        if !meta.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is neither a block device nor a file", path.display()),
            ));
        }
        return Ok(Disk {
            serial: format!("file:{}", canonical.display()),
            name,
            path: path.to_owned(),
            size_bytes: meta.len(),
            model: "plain file".into(),
            rotational: false,
            transport: Transport::File,
            is_block,
        });
    }
    let base = format!("/sys/block/{name}");
    let transport = if name.starts_with("nvme") {
        Transport::Nvme
    } else if name.starts_with("vd") {
        Transport::Virtio
    } else if name.starts_with("loop") {
        Transport::Loop
    } else if name.starts_with("sd") || name.starts_with("hd") {
        let dev = std::fs::canonicalize(format!("{base}/device")).unwrap_or_default();
        if dev.to_string_lossy().contains("/ata") {
            Transport::Ata
        } else {
            Transport::Scsi
        }
    } else {
        Transport::Other
    };
    let serial = sys(format!("{base}/device/serial"))
        .or_else(|| sys(format!("{base}/serial")))
        .or_else(|| sys(format!("{base}/device/wwid")))
        .or_else(|| sys(format!("{base}/wwid")))
        .or_else(|| sys(format!("{base}/loop/backing_file")).map(|f| format!("loop:{f}")))
        .unwrap_or_else(|| format!("unknown:{name}"));
    let file = File::open(path)?;
    Ok(Disk {
        model: sys(format!("{base}/device/model")).unwrap_or_default(),
        serial,
        rotational: sys(format!("{base}/queue/rotational")).as_deref() == Some("1"),
        size_bytes: size_of(&file, true)?,
        transport,
        name,
        path: path.to_owned(),
        is_block,
    })
}

/// The size of an open disk.
pub fn size_of(file: &File, is_block: bool) -> io::Result<u64> {
    if !is_block {
        return Ok(file.metadata()?.len());
    }
    let mut size: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer we own.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64, &mut size as *mut u64) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(size)
}

/// Opens a disk for writing.
pub fn open_write(disk: &Disk) -> io::Result<File> {
    OpenOptions::new().write(true).read(true).open(&disk.path)
}

/// Flushes our writes to the medium and drops every cached page of the
/// disk, so what is read next comes from the device.
pub fn flush(file: &File, is_block: bool) -> io::Result<()> {
    file.sync_all()?;
    if is_block {
        // SAFETY: BLKFLSBUF takes no argument.
        unsafe { libc::ioctl(file.as_raw_fd(), BLKFLSBUF, 0) };
    }
    // SAFETY: advisory call on our own descriptor.
    unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    Ok(())
}

/// Writes zeros over `[offset, offset + len)` with plain writes (no
/// discard, no "write zeroes" offload that a device may only pretend to
/// honour): the read-back then checks what the medium holds.
pub fn write_zeros(file: &File, offset: u64, len: u64) -> io::Result<()> {
    let zeros = vec![0u8; IO_BLOCK];
    let mut done = 0u64;
    while done < len {
        let n = ((len - done) as usize).min(IO_BLOCK);
        file.write_all_at(&zeros[..n], offset + done)?;
        done += n as u64;
    }
    Ok(())
}

/// Zeroes a range the fast way where the device offers it (BLKZEROOUT on a
/// block device, a punched hole in a file), else with writes. For ranges
/// an image leaves unallocated; never for a wipe.
pub fn zero_fast(file: &File, is_block: bool, offset: u64, len: u64) -> io::Result<()> {
    if len == 0 {
        return Ok(());
    }
    let rc = if is_block {
        let range: [u64; 2] = [offset, len];
        // SAFETY: BLKZEROOUT reads two u64 from the pointer we own.
        unsafe { libc::ioctl(file.as_raw_fd(), BLKZEROOUT, range.as_ptr()) }
    } else {
        // SAFETY: fallocate on our own descriptor.
        unsafe {
            libc::fallocate(
                file.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                offset as libc::off_t,
                len as libc::off_t,
            )
        }
    };
    if rc == 0 {
        Ok(())
    } else {
        write_zeros(file, offset, len)
    }
}

/// `IO_BLOCK` bytes at a 4 KiB aligned address inside an owned allocation:
/// what O_DIRECT reads into, and (moved, the allocation stays where it is)
/// what a reader hands to a hashing thread and gets back.
pub struct AlignedBuf {
    raw: Vec<u8>,
    start: usize,
}

impl AlignedBuf {
    pub fn new() -> Self {
        let raw = vec![0u8; IO_BLOCK + ALIGN];
        let start = raw.as_ptr().align_offset(ALIGN);
        Self { raw, start }
    }

    fn block_mut(&mut self) -> &mut [u8] {
        &mut self.raw[self.start..self.start + IO_BLOCK]
    }
}

impl Default for AlignedBuf {
    fn default() -> Self {
        Self::new()
    }
}

impl AsRef<[u8]> for AlignedBuf {
    /// The aligned block.
    fn as_ref(&self) -> &[u8] {
        &self.raw[self.start..self.start + IO_BLOCK]
    }
}

/// Reads a disk around the page cache.
pub struct DirectReader {
    file: File,
    direct: bool,
    buf: AlignedBuf,
}

impl DirectReader {
    /// Opens `disk` with O_DIRECT, or (a file system that refuses it) with
    /// cached reads whose pages are dropped before each read.
    pub fn open(disk: &Disk) -> io::Result<Self> {
        let direct = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(&disk.path);
        let (file, direct) = match direct {
            Ok(f) => (f, true),
            Err(_) => (File::open(&disk.path)?, false),
        };
        Ok(Self {
            file,
            direct,
            buf: AlignedBuf::new(),
        })
    }

    /// Reads `[offset, offset + len)` into a chunk handed to `each`, at
    /// most [`IO_BLOCK`] at a time. `offset` must be 4 KiB aligned.
    pub fn read_range(
        &mut self,
        offset: u64,
        len: u64,
        mut each: impl FnMut(&[u8]),
    ) -> io::Result<()> {
        let mut buf = std::mem::take(&mut self.buf);
        let mut done = 0u64;
        let read = loop {
            if done >= len {
                break Ok(());
            }
            let n = ((len - done) as usize).min(IO_BLOCK);
            if let Err(e) = self.read_block(offset + done, n, &mut buf) {
                break Err(e);
            }
            each(&buf.as_ref()[..n]);
            done += n as u64;
        };
        self.buf = buf;
        read
    }

    /// Reads the `n` (at most [`IO_BLOCK`]) bytes at `at` (4 KiB aligned)
    /// into the first `n` bytes of `buf`'s block.
    pub fn read_block(&self, at: u64, n: usize, buf: &mut AlignedBuf) -> io::Result<()> {
        // O_DIRECT needs an aligned length: read whole 4 KiB blocks.
        let padded = (n.div_ceil(ALIGN) * ALIGN).min(IO_BLOCK);
        let block = &mut buf.block_mut()[..padded];
        if !self.direct {
            // SAFETY: advisory call on our own descriptor.
            unsafe {
                libc::posix_fadvise(
                    self.file.as_raw_fd(),
                    at as libc::off_t,
                    padded as libc::off_t,
                    libc::POSIX_FADV_DONTNEED,
                )
            };
        }
        let mut got = 0;
        while got < n {
            let r = self.file.read_at(&mut block[got..], at + got as u64)?;
            if r == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("short read at {}", at + got as u64),
                ));
            }
            got += r;
        }
        Ok(())
    }
}

/// Starts writing back what is dirty in `file`'s pages without waiting for
/// it, so a long stream of writes reaches the medium while more arrive and
/// the final flush has little left to do.
pub fn start_writeback(file: &File) {
    // SAFETY: advisory call on our own descriptor.
    unsafe { libc::sync_file_range(file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE) };
}

#[cfg(test)]
mod clean_tests {
    use super::clean;

    #[test]
    fn firmware_padding_and_whitespace_go() {
        assert_eq!(clean("S1\0\0\0\n").as_deref(), Some("S1"));
        assert_eq!(clean("  Acme\0 Corp \n").as_deref(), Some("Acme Corp"));
        assert_eq!(clean("\0\0\n"), None);
    }
}
