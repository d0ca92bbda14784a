//! `boot.kexec`: loads the installed kernel with `kexec_file_load(2)` and
//! reboots into it (`reboot(LINUX_REBOOT_CMD_KEXEC)`), skipping firmware.
//! The kernel and initrd are read from the installed root file system,
//! mounted read-only. The load is checked before the result is posted; the
//! reboot happens after.

use std::ffi::CString;
use std::fs::File;
use std::os::unix::io::AsRawFd;

/// Parameters of `boot.kexec`.
pub use bcm_contracts::commands::KexecParams;

const MOUNT_POINT: &str = "/run/bcd/target";

/// Mounts the root read-only and loads its kernel; `Ok` means a reboot
/// with [`exec`] will start it.
pub fn load(p: &KexecParams) -> Result<(), String> {
    std::fs::create_dir_all(MOUNT_POINT).map_err(|e| format!("{MOUNT_POINT}: {e}"))?;
    let c = |s: &str| CString::new(s).map_err(|_| format!("{s:?} contains NUL"));
    let (dev, mnt, fs) = (c(&p.root_device)?, c(MOUNT_POINT)?, c(&p.fs_type)?);
    // SAFETY: plain C strings we own; a read-only mount.
    let rc = unsafe {
        libc::mount(
            dev.as_ptr(),
            mnt.as_ptr(),
            fs.as_ptr(),
            libc::MS_RDONLY,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(format!(
            "mounting {} ({}) read-only: {}",
            p.root_device,
            p.fs_type,
            std::io::Error::last_os_error()
        ));
    }
    let inside = |rel: &str| format!("{MOUNT_POINT}/{}", rel.trim_start_matches('/'));
    let kernel = File::open(inside(&p.kernel)).map_err(|e| format!("kernel {}: {e}", p.kernel))?;
    let initrd = p
        .initrd
        .as_deref()
        .map(|i| File::open(inside(i)).map_err(|e| format!("initrd {i}: {e}")))
        .transpose()?;
    let cmdline = c(&p.cmdline)?;
    let flags: libc::c_ulong = if initrd.is_none() { 0x4 } else { 0 }; // KEXEC_FILE_NO_INITRAMFS
                                                                       // SAFETY: descriptors and the command line outlive the call; the length
                                                                       // includes the terminating NUL as the syscall requires.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_kexec_file_load,
            kernel.as_raw_fd(),
            initrd.as_ref().map(|f| f.as_raw_fd()).unwrap_or(-1),
            cmdline.as_bytes_with_nul().len(),
            cmdline.as_ptr(),
            flags,
        )
    };
    // SAFETY: unmounting what we mounted.
    unsafe { libc::umount(mnt.as_ptr()) };
    if rc != 0 {
        return Err(format!(
            "kexec_file_load: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// Reboots into the loaded kernel. Returns only on failure.
pub fn exec() -> String {
    // SAFETY: syncs, then asks the kernel to jump into the loaded image.
    unsafe {
        libc::sync();
        libc::reboot(libc::LINUX_REBOOT_CMD_KEXEC);
    }
    format!("reboot(KEXEC): {}", std::io::Error::last_os_error())
}
