//! NVMe device erases through the kernel's admin passthrough ioctl: Format
//! NVM with Secure Erase Settings 1 (user data erase) or 2 (cryptographic
//! erase), and Sanitize (block or crypto erase) waited on through its
//! status log page. A controller that does not offer the one asked for is
//! `Unsupported` (the wipe tries the pool's next method); one that accepted
//! it and failed is `Failed`.

use std::fs::File;
use std::os::unix::io::AsRawFd;

use crate::disks::{Disk, Transport};
use crate::wipe::EraseError;

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

/// The namespace id of an open NVMe namespace, or why it is not one.
fn namespace(file: &File, disk: &Disk) -> Result<u32, EraseError> {
    if disk.transport != Transport::Nvme {
        return Err(EraseError::Unsupported(format!(
            "{} is not an NVMe disk",
            disk.name
        )));
    }
    // SAFETY: NVME_IOCTL_ID takes no argument and returns the namespace id.
    let nsid = unsafe { libc::ioctl(file.as_raw_fd(), NVME_IOCTL_ID) };
    if nsid <= 0 {
        return Err(EraseError::Unsupported(format!(
            "{}: not an NVMe namespace ({})",
            disk.name,
            std::io::Error::last_os_error()
        )));
    }
    Ok(nsid as u32)
}

/// NVMe Format NVM with Secure Erase Settings 1 (user data erase) or 2
/// (cryptographic erase, where the controller's FNA says it can).
pub fn format(file: &File, disk: &Disk, crypto: bool) -> Result<(), EraseError> {
    let nsid = namespace(file, disk)?;
    let ctrl = identify(file, 0, 1)
        .map_err(|e| EraseError::Unsupported(format!("identify controller: {e}")))?;
    let fna = ctrl[524];
    if crypto && fna & 0b100 == 0 {
        return Err(EraseError::Unsupported(format!(
            "the controller does not support a cryptographic erase in Format NVM (FNA {fna:#04x})"
        )));
    }
    let ns = identify(file, nsid, 0)
        .map_err(|e| EraseError::Unsupported(format!("identify namespace: {e}")))?;
    let flbas = ns[26] as u32;
    let lbaf = (flbas & 0x0f) | (((flbas >> 5) & 0x3) << 4);
    let ses = if crypto { 2 } else { 1 };
    let mut cmd = PassthruCmd {
        opcode: 0x80,
        nsid,
        cdw10: (lbaf & 0x0f) | (ses << 9) | ((lbaf >> 4) << 12),
        timeout_ms: 6 * 3600 * 1000,
        ..Default::default()
    };
    admin(file, &mut cmd).map_err(|e| EraseError::Failed(format!("format NVM failed: {e}")))
}

/// The Sanitize Status log page's SSTAT, and its progress (of 65,536).
fn sanitize_status(file: &File) -> Result<(u16, u16), String> {
    let mut data = vec![0u8; 512];
    let mut cmd = PassthruCmd {
        opcode: 0x02,
        nsid: 0xffff_ffff,
        addr: data.as_mut_ptr() as u64,
        data_len: 512,
        // Log page 0x81, 128 dwords.
        cdw10: 0x81 | (127 << 16),
        timeout_ms: 10_000,
        ..Default::default()
    };
    admin(file, &mut cmd)?;
    let progress = u16::from_le_bytes([data[0], data[1]]);
    let status = u16::from_le_bytes([data[2], data[3]]);
    Ok((status, progress))
}

/// NVMe Sanitize (block erase or crypto erase, as the controller's SANICAP
/// offers), waited on through the Sanitize Status log page. It erases
/// every namespace of the controller.
pub fn sanitize(file: &File, disk: &Disk, crypto: bool) -> Result<(), EraseError> {
    namespace(file, disk)?;
    let ctrl = identify(file, 0, 1)
        .map_err(|e| EraseError::Unsupported(format!("identify controller: {e}")))?;
    let sanicap = u32::from_le_bytes([ctrl[328], ctrl[329], ctrl[330], ctrl[331]]);
    let (bit, action, what) = if crypto {
        (0b001, 4, "crypto erase")
    } else {
        (0b010, 2, "block erase")
    };
    if sanicap & bit == 0 {
        return Err(EraseError::Unsupported(format!(
            "the controller does not offer a sanitize {what} (SANICAP {sanicap:#x})"
        )));
    }
    let mut cmd = PassthruCmd {
        opcode: 0x84,
        cdw10: action,
        timeout_ms: 60_000,
        ..Default::default()
    };
    admin(file, &mut cmd)
        .map_err(|e| EraseError::Failed(format!("sanitize {what} was not accepted: {e}")))?;
    let started = std::time::Instant::now();
    let mut last = u16::MAX;
    loop {
        let (status, progress) = sanitize_status(file)
            .map_err(|e| EraseError::Failed(format!("sanitize status: {e}")))?;
        match status & 0x7 {
            1 | 4 => return Ok(()),
            2 => {
                if progress / 6554 != last / 6554 {
                    tracing::info!(disk = %disk.name, percent = u32::from(progress) * 100 / 65536, "sanitizing");
                    last = progress;
                }
            }
            3 => {
                return Err(EraseError::Failed(format!(
                    "the controller reports the sanitize {what} failed"
                )))
            }
            other => {
                return Err(EraseError::Failed(format!(
                    "the sanitize status reads {other} (never sanitized) after the command"
                )))
            }
        }
        if started.elapsed() > std::time::Duration::from_secs(24 * 3600) {
            return Err(EraseError::Failed(format!(
                "the sanitize {what} did not end within a day"
            )));
        }
        std::thread::sleep(std::time::Duration::from_secs(2));
    }
}
