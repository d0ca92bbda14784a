//! Device erases of SATA and SAS/SCSI disks through the kernel's SG_IO
//! passthrough: ATA SECURITY ERASE UNIT (wrapped in ATA PASS-THROUGH(16),
//! as libata takes it) and SCSI SANITIZE. Each first asks the device
//! whether it can: a device that cannot (no security feature set, security
//! frozen by the firmware, an unknown opcode) is `Unsupported`, and the
//! wipe tries the next method the pool admits; a device that began an
//! erase and failed is `Failed`, and the wipe stops.

use std::fs::File;
use std::os::unix::io::AsRawFd;

use crate::wipe::EraseError;

/// `struct sg_io_hdr` of `<scsi/sg.h>`.
#[repr(C)]
struct SgIoHdr {
    interface_id: libc::c_int,
    dxfer_direction: libc::c_int,
    cmd_len: libc::c_uchar,
    mx_sb_len: libc::c_uchar,
    iovec_count: libc::c_ushort,
    dxfer_len: libc::c_uint,
    dxferp: *mut libc::c_void,
    cmdp: *const libc::c_uchar,
    sbp: *mut libc::c_uchar,
    timeout: libc::c_uint,
    flags: libc::c_uint,
    pack_id: libc::c_int,
    usr_ptr: *mut libc::c_void,
    status: libc::c_uchar,
    masked_status: libc::c_uchar,
    msg_status: libc::c_uchar,
    sb_len_wr: libc::c_uchar,
    host_status: libc::c_ushort,
    driver_status: libc::c_ushort,
    resid: libc::c_int,
    duration: libc::c_uint,
    info: libc::c_uint,
}

const SG_IO: libc::c_ulong = 0x2285;
const SG_DXFER_NONE: libc::c_int = -1;
const SG_DXFER_TO_DEV: libc::c_int = -2;
const SG_DXFER_FROM_DEV: libc::c_int = -3;
/// A CHECK CONDITION: the sense data says why.
const CHECK_CONDITION: u8 = 0x02;
/// DRIVER_SENSE in `driver_status`: sense data is present, not an error of
/// its own.
const DRIVER_SENSE: u16 = 0x08;

/// The direction of a command's data.
pub enum Data<'a> {
    None,
    In(&'a mut [u8]),
    Out(&'a [u8]),
}

/// The sense key and additional sense code of a failed command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sense {
    pub key: u8,
    pub asc: u8,
    pub ascq: u8,
}

impl Sense {
    /// Reads fixed (0x70/0x71) or descriptor (0x72/0x73) sense data.
    pub fn parse(sb: &[u8]) -> Option<Sense> {
        match sb.first().map(|b| b & 0x7f)? {
            0x70 | 0x71 if sb.len() >= 14 => Some(Sense {
                key: sb[2] & 0x0f,
                asc: sb[12],
                ascq: sb[13],
            }),
            0x72 | 0x73 if sb.len() >= 4 => Some(Sense {
                key: sb[1] & 0x0f,
                asc: sb[2],
                ascq: sb[3],
            }),
            _ => None,
        }
    }

    /// ILLEGAL REQUEST: an opcode or field the device does not know.
    pub fn is_illegal_request(self) -> bool {
        self.key == 0x05
    }

    /// ABORTED COMMAND: an ATA command the drive refused.
    pub fn is_aborted(self) -> bool {
        self.key == 0x0b
    }
}

/// How a passthrough command ended.
#[derive(Debug)]
pub enum SgError {
    /// The ioctl itself failed (not a SCSI generic device).
    Io(String),
    /// The device answered CHECK CONDITION.
    Check(Option<Sense>),
    /// The host adapter or driver reported an error.
    Transport { host: u16, driver: u16, status: u8 },
}

impl std::fmt::Display for SgError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SgError::Io(e) => write!(f, "SG_IO: {e}"),
            SgError::Check(Some(s)) => write!(
                f,
                "check condition (sense key {:#x}, ASC {:#04x}, ASCQ {:#04x})",
                s.key, s.asc, s.ascq
            ),
            SgError::Check(None) => write!(f, "check condition without sense data"),
            SgError::Transport {
                host,
                driver,
                status,
            } => write!(
                f,
                "transport error (host {host:#x}, driver {driver:#x}, status {status:#x})"
            ),
        }
    }
}

/// Sends one command through SG_IO.
pub fn command(file: &File, cdb: &[u8], data: Data<'_>, timeout_ms: u32) -> Result<(), SgError> {
    let mut sense = [0u8; 64];
    let (dir, ptr, len) = match data {
        Data::None => (SG_DXFER_NONE, std::ptr::null_mut(), 0),
        Data::In(b) => (
            SG_DXFER_FROM_DEV,
            b.as_mut_ptr() as *mut libc::c_void,
            b.len(),
        ),
        Data::Out(b) => (SG_DXFER_TO_DEV, b.as_ptr() as *mut libc::c_void, b.len()),
    };
    let mut hdr = SgIoHdr {
        interface_id: b'S' as libc::c_int,
        dxfer_direction: dir,
        cmd_len: cdb.len() as u8,
        mx_sb_len: sense.len() as u8,
        iovec_count: 0,
        dxfer_len: len as u32,
        dxferp: ptr,
        cmdp: cdb.as_ptr(),
        sbp: sense.as_mut_ptr(),
        timeout: timeout_ms,
        flags: 0,
        pack_id: 0,
        usr_ptr: std::ptr::null_mut(),
        status: 0,
        masked_status: 0,
        msg_status: 0,
        sb_len_wr: 0,
        host_status: 0,
        driver_status: 0,
        resid: 0,
        duration: 0,
        info: 0,
    };
    // SAFETY: the header points at the CDB, the sense buffer and the data
    // buffer, all owned by this frame (or the caller) for the whole call.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), SG_IO, &mut hdr as *mut SgIoHdr) };
    if rc != 0 {
        return Err(SgError::Io(std::io::Error::last_os_error().to_string()));
    }
    let written = (hdr.sb_len_wr as usize).min(sense.len());
    if hdr.status == CHECK_CONDITION || (hdr.driver_status & DRIVER_SENSE != 0 && written > 0) {
        return Err(SgError::Check(Sense::parse(&sense[..written])));
    }
    if hdr.status != 0 || hdr.host_status != 0 || (hdr.driver_status & !DRIVER_SENSE) != 0 {
        return Err(SgError::Transport {
            host: hdr.host_status,
            driver: hdr.driver_status,
            status: hdr.status,
        });
    }
    Ok(())
}

/// ATA PASS-THROUGH(16) of a 28-bit command: `protocol` 3 non-data, 4 PIO
/// data-in, 5 PIO data-out; one 512-byte block when there is data.
pub fn ata_cdb(protocol: u8, command: u8, features: u8, count: u8) -> [u8; 16] {
    let flags = match protocol {
        // T_DIR from the device, BYTE_BLOCK, T_LENGTH in the count field.
        4 => 0x0e,
        // T_DIR to the device, BYTE_BLOCK, T_LENGTH in the count field.
        5 => 0x06,
        // No data: CK_COND off.
        _ => 0x00,
    };
    let mut cdb = [0u8; 16];
    cdb[0] = 0x85;
    cdb[1] = protocol << 1;
    cdb[2] = flags;
    cdb[4] = features;
    cdb[6] = count;
    cdb[13] = 0x40;
    cdb[14] = command;
    cdb
}

/// What IDENTIFY DEVICE says of the ATA security feature set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtaSecurity {
    pub supported: bool,
    pub enabled: bool,
    pub locked: bool,
    pub frozen: bool,
    pub count_expired: bool,
    pub enhanced_supported: bool,
    /// Minutes the normal and the enhanced erase take (0: not given).
    pub erase_minutes: u32,
    pub enhanced_erase_minutes: u32,
}

impl AtaSecurity {
    /// Reads words 82, 89, 90 and 128 of IDENTIFY DEVICE data.
    pub fn from_identify(id: &[u8; 512]) -> Self {
        let word = |i: usize| u16::from_le_bytes([id[2 * i], id[2 * i + 1]]);
        let w128 = word(128);
        let minutes = |w: u16| {
            let v = u32::from(w & 0x7fff);
            if v == 0 {
                0
            } else {
                2 * v
            }
        };
        AtaSecurity {
            supported: word(82) & 0x0002 != 0 && w128 & 0x0001 != 0,
            enabled: w128 & 0x0002 != 0,
            locked: w128 & 0x0004 != 0,
            frozen: w128 & 0x0008 != 0,
            count_expired: w128 & 0x0010 != 0,
            enhanced_supported: w128 & 0x0020 != 0,
            erase_minutes: minutes(word(89)),
            enhanced_erase_minutes: minutes(word(90)),
        }
    }

    /// Why this drive cannot run a security erase now, if it cannot.
    pub fn refusal(&self, enhanced: bool) -> Option<String> {
        if !self.supported {
            Some("the drive does not offer the ATA security feature set".into())
        } else if self.frozen {
            Some("ATA security is frozen (the firmware froze it at boot; a suspend and resume or a hot-plug unfreezes it)".into())
        } else if self.locked {
            Some("the drive is locked with a password this agent does not know".into())
        } else if self.enabled {
            Some("a user password is already set: this agent does not erase under a password it did not set".into())
        } else if self.count_expired {
            Some("the drive's password attempt counter has expired (power-cycle it)".into())
        } else if enhanced && !self.enhanced_supported {
            Some("the drive does not offer the enhanced security erase".into())
        } else {
            None
        }
    }
}

/// A password block of SECURITY SET PASSWORD / ERASE UNIT: word 0 the
/// control bits, words 1–16 the password.
fn password_block(control: u16, password: &[u8; 32]) -> [u8; 512] {
    let mut b = [0u8; 512];
    b[..2].copy_from_slice(&control.to_le_bytes());
    b[2..34].copy_from_slice(password);
    b
}

const ATA_IDENTIFY: u8 = 0xec;
const ATA_SECURITY_SET_PASSWORD: u8 = 0xf1;
const ATA_SECURITY_ERASE_PREPARE: u8 = 0xf3;
const ATA_SECURITY_ERASE_UNIT: u8 = 0xf4;

fn ata_refused(step: &str, e: SgError) -> EraseError {
    match e {
        // The ioctl or the drive refused before anything was set.
        SgError::Io(_) => EraseError::Unsupported(format!("{step}: {e}")),
        SgError::Check(Some(s)) if s.is_illegal_request() || s.is_aborted() => {
            EraseError::Unsupported(format!("{step}: the drive refused ({e})"))
        }
        _ => EraseError::Failed(format!("{step}: {e}")),
    }
}

/// ATA SECURITY ERASE UNIT (normal or enhanced): a one-time user password
/// is set, the erase prepared and run with it (a successful erase clears
/// the password again).
pub fn ata_security_erase(file: &File, enhanced: bool) -> Result<(), EraseError> {
    let mut id = [0u8; 512];
    command(
        file,
        &ata_cdb(4, ATA_IDENTIFY, 0, 1),
        Data::In(&mut id),
        10_000,
    )
    .map_err(|e| ata_refused("IDENTIFY DEVICE", e))?;
    let sec = AtaSecurity::from_identify(&id);
    if let Some(why) = sec.refusal(enhanced) {
        return Err(EraseError::Unsupported(why));
    }
    let mut password = [0u8; 32];
    rand::Rng::fill(&mut rand::thread_rng(), &mut password[..]);
    command(
        file,
        &ata_cdb(5, ATA_SECURITY_SET_PASSWORD, 0, 1),
        Data::Out(&password_block(0, &password)),
        10_000,
    )
    .map_err(|e| ata_refused("SECURITY SET PASSWORD", e))?;
    // From here on a password is set: any failure is a failure, never a
    // quiet move to another method (the drive must be looked at).
    command(
        file,
        &ata_cdb(3, ATA_SECURITY_ERASE_PREPARE, 0, 0),
        Data::None,
        10_000,
    )
    .map_err(|e| {
        EraseError::Failed(format!(
            "SECURITY ERASE PREPARE: {e} (a one-time password is set on the drive)"
        ))
    })?;
    let minutes = if enhanced {
        sec.enhanced_erase_minutes
    } else {
        sec.erase_minutes
    };
    // Twice what the drive says, at least an hour, at most a day.
    let timeout_ms = (minutes.saturating_mul(2).clamp(60, 24 * 60)) * 60_000;
    command(
        file,
        &ata_cdb(5, ATA_SECURITY_ERASE_UNIT, 0, 1),
        Data::Out(&password_block(
            if enhanced { 0x0002 } else { 0 },
            &password,
        )),
        timeout_ms,
    )
    .map_err(|e| {
        EraseError::Failed(format!(
            "SECURITY ERASE UNIT: {e} (a one-time password may remain set on the drive)"
        ))
    })
}

/// SCSI SANITIZE service actions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sanitize {
    Overwrite = 0x01,
    BlockErase = 0x02,
    CryptoErase = 0x03,
}

/// The SANITIZE CDB (no IMMED: the command returns when the sanitize
/// ended) and, for an overwrite, its parameter list (one pass of zeros).
pub fn sanitize_cdb(action: Sanitize) -> ([u8; 10], Vec<u8>) {
    let params = if action == Sanitize::Overwrite {
        // OVERWRITE COUNT 1, a 4-byte pattern of zeros.
        vec![0x01, 0x00, 0x00, 0x04, 0, 0, 0, 0]
    } else {
        vec![]
    };
    let mut cdb = [0u8; 10];
    cdb[0] = 0x48;
    cdb[1] = action as u8;
    cdb[7..9].copy_from_slice(&(params.len() as u16).to_be_bytes());
    (cdb, params)
}

/// SCSI SANITIZE `action`: a device that does not know the command or the
/// action (ILLEGAL REQUEST) cannot; any other error is a failed erase.
pub fn scsi_sanitize(file: &File, action: Sanitize) -> Result<(), EraseError> {
    let (cdb, params) = sanitize_cdb(action);
    let data = if params.is_empty() {
        Data::None
    } else {
        Data::Out(&params)
    };
    match command(file, &cdb, data, 24 * 3600 * 1000) {
        Ok(()) => Ok(()),
        Err(SgError::Io(e)) => Err(EraseError::Unsupported(format!("SANITIZE: SG_IO: {e}"))),
        Err(SgError::Check(Some(s))) if s.is_illegal_request() => {
            Err(EraseError::Unsupported(format!(
                "the device does not offer SANITIZE {action:?} (ILLEGAL REQUEST, ASC {:#04x})",
                s.asc
            )))
        }
        Err(e) => Err(EraseError::Failed(format!("SANITIZE {action:?}: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identify(w82: u16, w128: u16, w89: u16, w90: u16) -> [u8; 512] {
        let mut id = [0u8; 512];
        for (i, w) in [(82, w82), (128, w128), (89, w89), (90, w90)] {
            id[2 * i..2 * i + 2].copy_from_slice(&w.to_le_bytes());
        }
        id
    }

    #[test]
    fn identify_words_say_whether_a_security_erase_can_run() {
        let ok = AtaSecurity::from_identify(&identify(0x0002, 0x0021, 30, 5));
        assert!(ok.supported && ok.enhanced_supported && !ok.frozen);
        assert_eq!((ok.erase_minutes, ok.enhanced_erase_minutes), (60, 10));
        assert_eq!(ok.refusal(true), None);
        let frozen = AtaSecurity::from_identify(&identify(0x0002, 0x0009, 0, 0));
        assert!(frozen.refusal(false).unwrap_or_default().contains("frozen"));
        let none = AtaSecurity::from_identify(&identify(0, 0, 0, 0));
        assert!(none
            .refusal(false)
            .unwrap_or_default()
            .contains("does not offer the ATA security"));
        let normal_only = AtaSecurity::from_identify(&identify(0x0002, 0x0001, 0, 0));
        assert_eq!(normal_only.refusal(false), None);
        assert!(normal_only
            .refusal(true)
            .unwrap_or_default()
            .contains("enhanced"));
        let set = AtaSecurity::from_identify(&identify(0x0002, 0x0003, 0, 0));
        assert!(set.refusal(false).unwrap_or_default().contains("password"));
    }

    #[test]
    fn sense_data_of_both_formats_reads() {
        let mut fixed = [0u8; 18];
        fixed[0] = 0x70;
        fixed[2] = 0x05;
        fixed[12] = 0x20;
        let s = Sense::parse(&fixed).expect("fixed");
        assert!(s.is_illegal_request() && s.asc == 0x20);
        let desc = [0x72, 0x0b, 0x00, 0x00];
        assert!(Sense::parse(&desc).expect("descriptor").is_aborted());
        assert_eq!(Sense::parse(&[0x00; 4]), None);
        assert_eq!(Sense::parse(&[]), None);
    }

    #[test]
    fn the_passthrough_and_sanitize_commands_are_laid_out_as_the_standards_say() {
        let cdb = ata_cdb(4, ATA_IDENTIFY, 0, 1);
        assert_eq!(
            (cdb[0], cdb[1], cdb[2], cdb[6], cdb[14]),
            (0x85, 0x08, 0x0e, 1, 0xec)
        );
        let cdb = ata_cdb(5, ATA_SECURITY_ERASE_UNIT, 0, 1);
        assert_eq!((cdb[1], cdb[2]), (0x0a, 0x06));
        let (cdb, params) = sanitize_cdb(Sanitize::CryptoErase);
        assert_eq!((cdb[0], cdb[1], cdb[7], cdb[8]), (0x48, 0x03, 0, 0));
        assert!(params.is_empty());
        let (cdb, params) = sanitize_cdb(Sanitize::Overwrite);
        assert_eq!((cdb[1], cdb[8], params.len()), (0x01, 8, 8));
        let block = password_block(0x0002, &[7u8; 32]);
        assert_eq!(
            (block[0], block[1], block[2], block[33], block[34]),
            (2, 0, 7, 7, 0)
        );
    }
}
