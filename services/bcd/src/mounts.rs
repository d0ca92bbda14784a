//! What of a disk the running OS has mounted, and remounting it read-only:
//! `bcd node` wipes the disks of the machine it runs on (an adopted
//! machine, which has no BMC to boot it a ramdisk), so before it writes a
//! disk every file system on it is synced and remounted read-only. The
//! kernel then writes nothing of its own back over the wipe (a FAT or an
//! ext4 journal flushed after the read-back would leave a signature
//! behind). The file systems of a disk are those on it, on its
//! partitions, and on what is built over them (device-mapper: LVM,
//! dm-crypt; md), found through `holders` in sysfs. A file system that
//! cannot be remounted (files open for writing, the root of a busy OS) is
//! named in the log and the wipe goes on: the disk is erased either way,
//! though what the kernel writes to it after the read-back is not read.

use std::ffi::CString;
use std::path::Path;

/// A mounted file system: its source device and its mount point.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mounted {
    pub source: String,
    pub target: String,
}

/// The names `/proc/mounts` may give what is on `disk`: the disk, each of
/// its partitions (`/sys/class/block/<disk>/<part>/partition`), and every
/// device built over them (`holders`, followed to the end), a
/// device-mapper one also as `mapper/<its dm name>`; e.g. `vda`, `vda2`,
/// `dm-0`, `mapper/vg-root`.
pub fn names_of(disk: &str) -> Vec<String> {
    let sys = Path::new("/sys/class/block");
    let mut names = vec![disk.to_owned()];
    if let Ok(entries) = std::fs::read_dir(sys.join(disk)) {
        for e in entries.flatten() {
            if e.path().join("partition").exists() {
                names.push(e.file_name().to_string_lossy().into_owned());
            }
        }
    }
    let mut i = 0;
    while i < names.len() && names.len() < 256 {
        if let Ok(holders) = std::fs::read_dir(sys.join(&names[i]).join("holders")) {
            for h in holders.flatten() {
                let h = h.file_name().to_string_lossy().into_owned();
                if !names.contains(&h) {
                    if let Ok(dm) = std::fs::read_to_string(sys.join(&h).join("dm/name")) {
                        names.push(format!("mapper/{}", dm.trim()));
                    }
                    names.push(h);
                }
            }
        }
        i += 1;
    }
    names
}

/// The mounts of `/proc/mounts` (`mounts`) whose source is one of `names`
/// (`/dev/<name>`), deepest mount point first so a remount of a parent
/// never precedes its child's. The octal escapes of a mount point (`\040`
/// for a space) are decoded.
pub fn on(mounts: &str, names: &[String]) -> Vec<Mounted> {
    let mut found: Vec<Mounted> = mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (source, target) = (f.next()?, f.next()?);
            let name = source.strip_prefix("/dev/")?;
            names.iter().any(|n| n == name).then(|| Mounted {
                source: source.to_owned(),
                target: unescape(target),
            })
        })
        .collect();
    found.sort_by_key(|m| std::cmp::Reverse(m.target.len()));
    found
}

fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], octal) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Syncs and remounts read-only every file system on `disk` (its kernel
/// name); returns what could not be, with why. A disk that is a plain file
/// (tests) has none.
pub fn remount_read_only(disk: &str) -> Vec<String> {
    let Ok(mounts) = std::fs::read_to_string("/proc/mounts") else {
        return vec![];
    };
    let found = on(&mounts, &names_of(disk));
    // SAFETY: sync(2) takes nothing.
    unsafe { libc::sync() };
    let mut refused = vec![];
    for m in found {
        let (Ok(src), Ok(dst)) = (
            CString::new(m.source.clone()),
            CString::new(m.target.clone()),
        ) else {
            continue;
        };
        // SAFETY: C strings we own; a remount changes only the flags.
        let rc = unsafe {
            libc::mount(
                src.as_ptr(),
                dst.as_ptr(),
                std::ptr::null(),
                libc::MS_REMOUNT | libc::MS_RDONLY,
                std::ptr::null(),
            )
        };
        if rc == 0 {
            tracing::info!(source = %m.source, target = %m.target, "remounted read-only before the wipe");
        } else {
            let why = std::io::Error::last_os_error();
            tracing::warn!(source = %m.source, target = %m.target, error = %why, "could not remount read-only; wiping anyway");
            refused.push(format!("{} on {}: {why}", m.source, m.target));
        }
    }
    refused
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_mounts_of_a_disk_and_its_partitions_deepest_first() {
        let mounts = "proc /proc proc rw 0 0\n\
            /dev/vda1 /mnt vfat rw 0 0\n\
            /dev/vdb1 /data ext4 rw 0 0\n\
            /dev/vda2 /mnt/with\\040space ext4 rw 0 0\n\
            /dev/vda10 /other ext4 rw 0 0\n\
            garbage\n";
        let names = vec!["vda".to_owned(), "vda1".to_owned(), "vda2".to_owned()];
        assert_eq!(
            on(mounts, &names),
            vec![
                Mounted {
                    source: "/dev/vda2".into(),
                    target: "/mnt/with space".into()
                },
                Mounted {
                    source: "/dev/vda1".into(),
                    target: "/mnt".into()
                },
            ]
        );
        assert!(on(mounts, &["sda".to_owned()]).is_empty());
        assert_eq!(unescape("a\\"), "a\\");
        assert_eq!(unescape("\\09x"), "\\09x");
    }
}
