//! Device erase: NVMe Format NVM with Secure Erase Settings 1 (user data
//! erase) or 2 (cryptographic erase) through the kernel's admin passthrough
//! ioctl. Every other transport fails with the reason: this build does not
//! drive ATA security erase, and virtio, loop and plain-file disks have no
//! erase command at all. A wipe never falls back to another method.

use std::fs::File;
use std::os::unix::io::AsRawFd;

use crate::disks::{Disk, Transport};
use crate::wipe::Method;

/// `struct nvme_passthru_cmd` of `<linux/nvme_ioctl.h>`.
#[repr(C)]
#[derive(Default)]
struct PassthruCmd {
    opcode: u8,
    flags: u8,
    rsvd1: u16,
    nsid: u32,
    cdw2: u32,
    cdw3: u32,
    metadata: u64,
    addr: u64,
    metadata_len: u32,
    data_len: u32,
    cdw10: u32,
    cdw11: u32,
    cdw12: u32,
    cdw13: u32,
    cdw14: u32,
    cdw15: u32,
    timeout_ms: u32,
    result: u32,
}

const NVME_IOCTL_ID: libc::c_ulong = 0x4e40;
const NVME_IOCTL_ADMIN_CMD: libc::c_ulong = 0xC048_4E41;

fn admin(file: &File, cmd: &mut PassthruCmd) -> Result<(), String> {
    // SAFETY: the kernel reads and writes the struct we own, and the data
    // buffer `addr` points to (owned by the caller for the call).
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), NVME_IOCTL_ADMIN_CMD, cmd as *mut _) };
    match rc {
        0 => Ok(()),
        r if r > 0 => Err(format!("NVMe status {r:#x}")),
        _ => Err(std::io::Error::last_os_error().to_string()),
    }
}

fn identify(file: &File, nsid: u32, cns: u32) -> Result<Vec<u8>, String> {
    let mut data = vec![0u8; 4096];
    let mut cmd = PassthruCmd {
        opcode: 0x06,
        nsid,
        addr: data.as_mut_ptr() as u64,
        data_len: 4096,
        cdw10: cns,
        timeout_ms: 10_000,
        ..Default::default()
    };
    admin(file, &mut cmd)?;
    Ok(data)
}

/// Runs the device's own erase for `method`, or says why it cannot.
pub fn device_erase(file: &File, disk: &Disk, method: Method) -> Result<(), String> {
    let what = match method {
        Method::SecureErase => "secure-erase",
        Method::CryptoErase => "crypto-erase",
        Method::Quick => return Err("quick is not a device erase".into()),
    };
    match disk.transport {
        Transport::Nvme => {}
        Transport::Ata => {
            return Err(format!(
                "{what} on ATA disk {}: this bcd build does not drive ATA security erase; nothing was erased",
                disk.name
            ))
        }
        t => {
            return Err(format!(
                "{what} on {} ({t:?}): the device has no erase command; nothing was erased",
                disk.name
            ))
        }
    }
    // SAFETY: NVME_IOCTL_ID takes no argument and returns the namespace id.
    let nsid = unsafe { libc::ioctl(file.as_raw_fd(), NVME_IOCTL_ID) };
    if nsid <= 0 {
        return Err(format!(
            "{what} on {}: not an NVMe namespace ({})",
            disk.name,
            std::io::Error::last_os_error()
        ));
    }
    let nsid = nsid as u32;
    let ctrl = identify(file, 0, 1).map_err(|e| format!("identify controller: {e}"))?;
    let fna = ctrl[524];
    if method == Method::CryptoErase && fna & 0b100 == 0 {
        return Err(format!(
            "crypto-erase on {}: the controller does not support cryptographic erase (FNA {fna:#04x}); nothing was erased",
            disk.name
        ));
    }
    let ns = identify(file, nsid, 0).map_err(|e| format!("identify namespace: {e}"))?;
    let flbas = ns[26] as u32;
    let lbaf = (flbas & 0x0f) | (((flbas >> 5) & 0x3) << 4);
    let ses = if method == Method::CryptoErase { 2 } else { 1 };
    let mut cmd = PassthruCmd {
        opcode: 0x80,
        nsid,
        cdw10: (lbaf & 0x0f) | (ses << 9) | ((lbaf >> 4) << 12),
        timeout_ms: 6 * 3600 * 1000,
        ..Default::default()
    };
    admin(file, &mut cmd).map_err(|e| format!("{what}: format NVM failed: {e}"))
}
