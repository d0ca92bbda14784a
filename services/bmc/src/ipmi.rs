//! IPMI 2.0 (lanplus) through `ipmitool` as a subprocess, as Ironic does:
//! power status/on/off/cycle/reset and the boot device. The password goes
//! to ipmitool through its environment (`-E` reads `IPMI_PASSWORD`), never
//! its command line, so `ps` does not show it. IPMI cannot see the host's
//! NICs: inspection reports the BMC's identity and no MACs (the node keeps
//! the MACs it was enrolled with).

use bcm_core::{PowerAction, PowerState};
use secrecy::{ExposeSecret as _, SecretString};
use std::time::Duration;

use crate::driver::{BootDevice, BootMode, BootOverride, Inventory, Verified};
use crate::error::BmcError;

const DRIVER: bcm_core::BmcDriver = bcm_core::BmcDriver::Ipmi;

/// Settings of the IPMI driver.
#[derive(Debug, Clone)]
pub struct IpmiSettings {
    /// The ipmitool binary.
    pub ipmitool: String,
    /// Cipher suite (`-C`); 3 (SHA1/AES) is what every BMC speaks.
    pub cipher_suite: u8,
    /// Whole-command timeout.
    pub command_timeout: Duration,
    /// ipmitool's own retransmits (`-R`) and per-try timeout (`-N`, s).
    pub retries: u8,
    pub retry_timeout_secs: u8,
    /// How long to wait for the chassis power state to match.
    pub power_timeout: Duration,
    pub power_poll: Duration,
    /// How long an ACPI soft-off may take before a forced off.
    pub graceful_timeout: Duration,
}

impl Default for IpmiSettings {
    fn default() -> Self {
        Self {
            ipmitool: "ipmitool".into(),
            cipher_suite: 3,
            command_timeout: Duration::from_secs(30),
            retries: 3,
            retry_timeout_secs: 2,
            power_timeout: Duration::from_secs(60),
            power_poll: Duration::from_millis(500),
            graceful_timeout: Duration::from_secs(60),
        }
    }
}

/// Whether ipmitool's answer to `chassis power soft` says the BMC cannot
/// do a soft-off at all (a completion code for an unknown or unsupported
/// command or argument), rather than that the answer was lost or the BMC
/// was busy.
fn soft_off_unsupported(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    m.contains("failed:")
        && [
            "invalid command",
            "not supported",
            "invalid data field",
            "parameter out of range",
        ]
        .iter()
        .any(|c| m.contains(c))
}

/// A client for one IPMI BMC.
pub struct Ipmi {
    host: String,
    port: u16,
    address: String,
    username: SecretString,
    password: SecretString,
    settings: IpmiSettings,
}

impl std::fmt::Debug for Ipmi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ipmi")
            .field("address", &self.address)
            .finish_non_exhaustive()
    }
}

/// `host`, `host:port`, `[v6]:port`, optionally behind `ipmi://`.
fn parse_address(address: &str) -> Option<(String, u16)> {
    let a = address.strip_prefix("ipmi://").unwrap_or(address);
    if a.is_empty() || a.contains('/') || a.contains(char::is_whitespace) {
        return None;
    }
    if let Some(rest) = a.strip_prefix('[') {
        let (host, tail) = rest.split_once(']')?;
        let port = match tail.strip_prefix(':') {
            Some(p) => p.parse().ok()?,
            None if tail.is_empty() => 623,
            None => return None,
        };
        return Some((host.to_owned(), port));
    }
    match a.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') => Some((host.to_owned(), port.parse().ok()?)),
        Some(_) => None,
        None => Some((a.to_owned(), 623)),
    }
    .filter(|(h, _)| !h.is_empty() && !h.starts_with('-'))
}

impl Ipmi {
    /// A client for the BMC at `address`.
    pub fn new(
        address: &str,
        username: SecretString,
        password: SecretString,
        settings: IpmiSettings,
    ) -> Result<Self, BmcError> {
        let (host, port) = parse_address(address).ok_or_else(|| {
            BmcError::Invalid(format!("IPMI address {address:?} must be host[:port]"))
        })?;
        Ok(Self {
            host,
            port,
            address: address.to_owned(),
            username,
            password,
            settings,
        })
    }

    /// Runs one ipmitool command; its stdout.
    async fn run(&self, args: &[&str]) -> Result<String, BmcError> {
        self.run_with_input(args, None).await
    }

    /// Runs ipmitool with `input` on its stdin (for `exec /dev/stdin`, so a
    /// secret argument never appears on a command line).
    async fn run_with_input(
        &self,
        args: &[&str],
        input: Option<&SecretString>,
    ) -> Result<String, BmcError> {
        use tokio::io::AsyncWriteExt as _;
        let s = &self.settings;
        let mut cmd = tokio::process::Command::new(&s.ipmitool);
        // -v: the RAKP messages that tell bad credentials from silence go
        // to stderr; stdout stays the command's own output.
        cmd.args(["-v", "-I", "lanplus", "-C"])
            .arg(s.cipher_suite.to_string())
            .args(["-H", &self.host, "-p"])
            .arg(self.port.to_string())
            .arg("-U")
            .arg(self.username.expose_secret())
            .arg("-E")
            .args(["-R"])
            .arg(s.retries.to_string())
            .args(["-N"])
            .arg(s.retry_timeout_secs.to_string())
            .args(args)
            .env("IPMI_PASSWORD", self.password.expose_secret())
            .stdin(if input.is_some() {
                std::process::Stdio::piped()
            } else {
                std::process::Stdio::null()
            })
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        let spawned = async {
            let mut child = cmd.spawn()?;
            if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
                stdin.write_all(text.expose_secret().as_bytes()).await?;
                stdin.shutdown().await?;
            }
            child.wait_with_output().await
        };
        let out = tokio::time::timeout(s.command_timeout, spawned)
            .await
            .map_err(|_| BmcError::Unreachable {
                driver: DRIVER,
                address: self.address.clone(),
                message: format!("ipmitool {} timed out", args.join(" ")),
            })?
            .map_err(|e| BmcError::Unsupported(format!("cannot run {}: {e}", s.ipmitool)))?;
        if out.status.success() {
            return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
        }
        Err(self.classify(&String::from_utf8_lossy(&out.stderr), args))
    }

    fn classify(&self, stderr: &str, args: &[&str]) -> BmcError {
        let text = stderr
            .lines()
            .map(str::trim)
            .filter(|l| {
                !l.is_empty()
                    && !l.contains("Get Channel Cipher Suites")
                    && !l.starts_with("Loading IANA")
            })
            .collect::<Vec<_>>()
            .join("; ");
        let lower = text.to_ascii_lowercase();
        let message = format!("ipmitool {}: {text}", args.join(" "));
        if lower.contains("unauthorized")
            || lower.contains("rakp")
            || lower.contains("invalid user name")
            || lower.contains("password")
            || lower.contains("insufficient privilege")
        {
            BmcError::Unauthorized {
                driver: DRIVER,
                address: self.address.clone(),
                message,
            }
        } else if lower.contains("unable to establish")
            || lower.contains("no response")
            || lower.contains("timeout")
            || lower.contains("connection refused")
        {
            // ipmitool says "Unable to establish IPMI v2 / RMCP+ session"
            // both for a silent peer and for bad credentials that some
            // BMCs answer by silence; retries tell the two apart in time.
            BmcError::Unreachable {
                driver: DRIVER,
                address: self.address.clone(),
                message,
            }
        } else {
            BmcError::Refused {
                driver: DRIVER,
                address: self.address.clone(),
                status: 0,
                message,
            }
        }
    }

    /// Sets the password of the account this client logs in with (IPMI
    /// Set User Password, stored as 20 bytes): the user id is found by name
    /// in `user list`, and the command reaches ipmitool through
    /// `exec /dev/stdin`, never its arguments.
    pub async fn set_password(&self, new: &SecretString) -> Result<(), BmcError> {
        let len = new.expose_secret().len();
        if !(1..=20).contains(&len)
            || !new
                .expose_secret()
                .bytes()
                .all(|b| b.is_ascii_graphic() && b != b'#' && b != b'"' && b != b'\'')
        {
            return Err(BmcError::Invalid(
                "an IPMI password must be 1-20 printable characters without quotes or #".into(),
            ));
        }
        let list = self.run(&["user", "list", "1"]).await?;
        let name = self.username.expose_secret();
        let id = list
            .lines()
            .skip(1)
            .filter_map(|l| {
                let mut cols = l.split_whitespace();
                let id = cols.next()?.parse::<u8>().ok()?;
                (cols.next()? == name).then_some(id)
            })
            .next()
            .ok_or_else(|| {
                BmcError::Invalid(format!(
                "{DRIVER} BMC at {}: the user list of channel 1 has no account with this username",
                self.address
            ))
            })?;
        let script = SecretString::from(format!(
            "user set password {id} {} 20\n",
            new.expose_secret()
        ));
        let out = self
            .run_with_input(&["exec", "/dev/stdin"], Some(&script))
            .await?;
        if out.contains("successful") {
            Ok(())
        } else {
            Err(BmcError::Refused {
                driver: DRIVER,
                address: self.address.clone(),
                status: 0,
                message: format!("Set User Password for user {id} was not confirmed"),
            })
        }
    }

    /// Logs in (`mc info`) and reads the power state.
    pub async fn verify(&self) -> Result<Verified, BmcError> {
        let info = self.run(&["mc", "info"]).await?;
        let version = field(&info, "IPMI Version").map(|v| format!("IPMI {v}"));
        Ok(Verified {
            protocol_version: version,
            system_id: "0".into(),
            power: self.power_state().await?,
            sim: false,
        })
    }

    /// The BMC's identity (`mc info`); IPMI does not list the host's NICs.
    pub async fn inspect(&self) -> Result<Inventory, BmcError> {
        let info = self.run(&["mc", "info"]).await?;
        Ok(Inventory {
            manufacturer: field(&info, "Manufacturer Name")
                .or_else(|| field(&info, "Manufacturer ID")),
            model: field(&info, "Product Name").or_else(|| field(&info, "Product ID")),
            serial: None,
            uuid: None,
            cpus: None,
            cpu_model: None,
            memory_gib: None,
            macs: vec![],
            drives: vec![],
            bios_version: None,
            bmc_firmware: field(&info, "Firmware Revision"),
            sim: false,
        })
    }

    /// `chassis power status`.
    pub async fn power_state(&self) -> Result<PowerState, BmcError> {
        let out = self.run(&["chassis", "power", "status"]).await?;
        Ok(if out.contains("is on") {
            PowerState::On
        } else if out.contains("is off") {
            PowerState::Off
        } else {
            PowerState::Unknown
        })
    }

    /// Whether the chassis reads `want` within `within`.
    async fn reads_within(&self, want: PowerState, within: Duration) -> Result<bool, BmcError> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if self.power_state().await? == want {
                return Ok(true);
            }
            if tokio::time::Instant::now() >= deadline {
                return Ok(false);
            }
            tokio::time::sleep(self.settings.power_poll).await;
        }
    }

    async fn await_power(&self, want: PowerState) -> Result<PowerState, BmcError> {
        if self.reads_within(want, self.settings.power_timeout).await? {
            return Ok(want);
        }
        Err(BmcError::Timeout {
            driver: DRIVER,
            address: self.address.clone(),
            message: format!(
                "chassis power did not read {want} within {} s",
                self.settings.power_timeout.as_secs()
            ),
        })
    }

    /// An ACPI soft-off (`chassis power soft`), as the Redfish driver's
    /// `GracefulShutdown`: whether the chassis reads off within
    /// `graceful_timeout`. A BMC that answers it has no soft-off is not
    /// waited on; any other failure may be a lost answer to a soft-off the
    /// BMC did start, so the OS gets its time all the same.
    async fn soft_off(&self) -> Result<bool, BmcError> {
        match self.run(&["chassis", "power", "soft"]).await {
            Ok(_) => {}
            Err(BmcError::Refused { message, .. }) if soft_off_unsupported(&message) => {
                tracing::info!(address = %self.address, %message, "no soft-off here; forcing off");
                return Ok(false);
            }
            Err(BmcError::Refused { message, .. }) => {
                tracing::info!(address = %self.address, %message, "soft-off not confirmed; waiting for the OS as if it were");
            }
            Err(e) => return Err(e),
        }
        let off = self
            .reads_within(PowerState::Off, self.settings.graceful_timeout)
            .await?;
        if !off {
            tracing::info!(address = %self.address, "soft-off timed out; forcing off");
        }
        Ok(off)
    }

    /// Applies a power action and waits until the chassis reads the result.
    /// Off is a soft-off first ([`Self::soft_off`]), forced when that does
    /// not turn the chassis off.
    pub async fn power(&self, action: PowerAction) -> Result<PowerState, BmcError> {
        let now = self.power_state().await?;
        if action == PowerAction::Off && now != PowerState::Off && self.soft_off().await? {
            return Ok(PowerState::Off);
        }
        let (verb, want) = match (action, now) {
            (PowerAction::On, PowerState::On) => return Ok(PowerState::On),
            (PowerAction::Off, PowerState::Off) => return Ok(PowerState::Off),
            (PowerAction::On, _) => ("on", PowerState::On),
            (PowerAction::Off, _) => ("off", PowerState::Off),
            // A cycle or reset of a machine that is off turns it on.
            (PowerAction::Cycle | PowerAction::Reset, PowerState::Off) => ("on", PowerState::On),
            (PowerAction::Cycle, _) => ("cycle", PowerState::On),
            (PowerAction::Reset, _) => ("reset", PowerState::On),
        };
        self.run(&["chassis", "power", verb]).await?;
        self.await_power(want).await
    }

    /// `chassis bootdev`, read back with `chassis bootparam get 5`.
    pub async fn boot(
        &self,
        device: BootDevice,
        persistent: bool,
        mode: Option<BootMode>,
    ) -> Result<BootOverride, BmcError> {
        let dev = match device {
            BootDevice::Pxe => "pxe",
            BootDevice::Disk => "disk",
            BootDevice::Cd => "cdrom",
            BootDevice::UefiHttp => {
                return Err(BmcError::Unsupported(
                    "IPMI has no UEFI HTTP boot device".into(),
                ))
            }
        };
        let mut options = vec![];
        if persistent {
            options.push("persistent");
        }
        if mode == Some(BootMode::Uefi) {
            options.push("efiboot");
        }
        let opts = format!("options={}", options.join(","));
        let mut args = vec!["chassis", "bootdev", dev];
        if !options.is_empty() {
            args.push(&opts);
        }
        self.run(&args).await?;
        let read = self.run(&["chassis", "bootparam", "get", "5"]).await?;
        let selector = field(&read, "Boot Device Selector");
        let want = match device {
            BootDevice::Pxe => "Force PXE",
            BootDevice::Cd => "Force Boot from CD/DVD",
            _ => "Force Boot from default Hard-Drive",
        };
        if !selector.as_deref().is_some_and(|s| s.starts_with(want)) {
            return Err(BmcError::Refused {
                driver: DRIVER,
                address: self.address.clone(),
                status: 0,
                message: format!("boot device read back {selector:?}, not {want}"),
            });
        }
        let enabled = if read.contains("all future boots") {
            "Continuous"
        } else {
            "Once"
        };
        Ok(BootOverride {
            device,
            persistent,
            sim: false,
            target: dev.to_owned(),
            enabled_requested: if persistent { "Continuous" } else { "Once" }.to_owned(),
            enabled_read_back: Some(enabled.to_owned()),
            mode_read_back: Some(
                if read.contains("BIOS EFI boot") || read.contains("EFI") {
                    "UEFI"
                } else {
                    "Legacy"
                }
                .to_owned(),
            ),
        })
    }
}

/// The value of `Name : value` in ipmitool's output.
fn field(text: &str, name: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        let k = k.trim().trim_start_matches('-').trim();
        (k == name)
            .then(|| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_a_refusal_code_skips_the_soft_off_wait() {
        use super::soft_off_unsupported;
        for unsupported in [
            "ipmitool chassis power soft: Set Chassis Power Control to Soft failed: Invalid command",
            "ipmitool chassis power soft: Set Chassis Power Control to Soft failed: Command not supported in present state",
            "ipmitool chassis power soft: Set Chassis Power Control to Soft failed: Invalid data field in request",
        ] {
            assert!(soft_off_unsupported(unsupported), "{unsupported}");
        }
        for maybe_started in [
            "ipmitool chassis power soft: Unable to set Chassis Power Control to Soft",
            "ipmitool chassis power soft: Set Chassis Power Control to Soft failed: Node busy",
            "ipmitool chassis power soft: Set Chassis Power Control to Soft failed: Unspecified error",
            "",
        ] {
            assert!(!soft_off_unsupported(maybe_started), "{maybe_started}");
        }
    }

    use super::*;

    #[test]
    fn addresses() {
        assert_eq!(parse_address("10.0.0.10"), Some(("10.0.0.10".into(), 623)));
        assert_eq!(
            parse_address("10.0.0.10:9623"),
            Some(("10.0.0.10".into(), 9623))
        );
        assert_eq!(parse_address("ipmi://bmc1:700"), Some(("bmc1".into(), 700)));
        assert_eq!(
            parse_address("[fd00::1]:623"),
            Some(("fd00::1".into(), 623))
        );
        assert_eq!(parse_address("[fd00::1]"), Some(("fd00::1".into(), 623)));
        assert_eq!(parse_address(""), None);
        assert_eq!(
            parse_address("-oProxyCommand=x"),
            None,
            "never an option to ipmitool"
        );
        assert_eq!(parse_address("a b"), None);
        assert_eq!(parse_address("host:notaport"), None);
        assert_eq!(parse_address("http://x/y"), None);
    }

    #[test]
    fn fields_of_ipmitool_output() {
        let out = "Device ID                 : 0\nIPMI Version              : 2.0\nManufacturer ID           : 4753\n";
        assert_eq!(field(out, "IPMI Version").as_deref(), Some("2.0"));
        assert_eq!(field(out, "Manufacturer ID").as_deref(), Some("4753"));
        assert_eq!(field(out, "Product Name"), None);
        let boot = " Boot Flags :\n   - Boot Flag Valid\n   - Options apply to all future boots\n   - Boot Device Selector : Force PXE\n";
        assert_eq!(
            field(boot, "Boot Device Selector").as_deref(),
            Some("Force PXE")
        );
    }
}
