//! A BMC driver hosted as a plugin: a separate executable the service runs
//! once per operation, speaking `bcm_contracts::plugin` over its standard
//! input and output. The credentials go in on standard input only; the
//! answer comes back typed, and anything else (a non-zero exit, no answer,
//! an answer of another shape, a plugin that outlives its time-out) is a
//! failed operation that says which plugin and why. `bcx-ipmi` (this
//! crate's second binary) is the IPMI driver as such a plugin.

use std::path::PathBuf;
use std::time::Duration;

use bcm_contracts::plugin::{
    PluginBmc, PluginError, PluginErrorKind, PluginOperation, PluginOutput, PluginRequest,
    PluginResponse, PROTOCOL_VERSION,
};
use bcm_core::{BmcDriver, PowerAction, PowerState};
use secrecy::{ExposeSecret as _, SecretString};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::driver::{BootDevice, BootMode, BootOverride, Inventory, Verified};
use crate::error::BmcError;

/// The most a plugin may write as its answer.
const MAX_ANSWER_BYTES: u64 = 1 << 20;

/// How the service runs one plugin.
#[derive(Debug, Clone)]
pub struct PluginSettings {
    pub executable: PathBuf,
    /// The longest one operation may take (a power change waits for the
    /// state to show).
    pub timeout: Duration,
    /// Non-secret settings handed to the plugin as environment variables
    /// (`BCX_*`).
    pub env: Vec<(String, String)>,
}

/// One BMC reached through a plugin.
pub struct PluginDriver {
    driver: BmcDriver,
    address: String,
    username: SecretString,
    password: SecretString,
    settings: PluginSettings,
}

impl std::fmt::Debug for PluginDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginDriver")
            .field("driver", &self.driver)
            .field("address", &self.address)
            .field("executable", &self.settings.executable)
            .finish_non_exhaustive()
    }
}

impl PluginDriver {
    /// The driver this plugin is hosted as.
    pub fn driver(&self) -> BmcDriver {
        self.driver
    }

    pub fn new(
        driver: BmcDriver,
        address: &str,
        username: SecretString,
        password: SecretString,
        settings: PluginSettings,
    ) -> Self {
        Self {
            driver,
            address: address.to_owned(),
            username,
            password,
            settings,
        }
    }

    fn failed(&self, message: String) -> BmcError {
        BmcError::Unsupported(format!(
            "the {} plugin {}: {message}",
            self.driver,
            self.settings.executable.display()
        ))
    }

    /// Runs `operation` in a fresh plugin process.
    async fn run(&self, operation: PluginOperation) -> Result<PluginOutput, BmcError> {
        let name = operation.name();
        let request = PluginRequest {
            protocol: PROTOCOL_VERSION,
            bmc: PluginBmc {
                address: self.address.clone(),
                username: self.username.expose_secret().to_owned(),
                password: self.password.expose_secret().to_owned(),
            },
            operation,
        };
        let input = SecretString::from(
            serde_json::to_string(&request).map_err(|e| self.failed(e.to_string()))?,
        );
        drop(request);
        let mut cmd = tokio::process::Command::new(&self.settings.executable);
        cmd.envs(self.settings.env.iter().map(|(k, v)| (k, v)))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        let exchange = async {
            let mut child = spawn_once_not_busy(&mut cmd).await?;
            if let Some(mut stdin) = child.stdin.take() {
                stdin.write_all(input.expose_secret().as_bytes()).await?;
                stdin.shutdown().await?;
            }
            // Both pipes at once: a plugin that fills one while the other
            // is not read would never finish.
            let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
            let (answer, stderr) = tokio::join!(read_capped(stdout), read_capped(stderr));
            let (answer, stderr) = (answer?, stderr?);
            let status = child.wait().await?;
            Ok::<_, std::io::Error>((status, answer, stderr))
        };
        let (status, answer, stderr) = tokio::time::timeout(self.settings.timeout, exchange)
            .await
            .map_err(|_| BmcError::Timeout {
                driver: self.driver,
                address: self.address.clone(),
                message: format!(
                    "the plugin's {name} took longer than {} s and was stopped",
                    self.settings.timeout.as_secs()
                ),
            })?
            .map_err(|e| self.failed(format!("cannot run it: {e}")))?;
        let stderr = String::from_utf8_lossy(&stderr);
        for line in stderr.lines().filter(|l| !l.trim().is_empty()) {
            tracing::debug!(driver = %self.driver, op = name, "plugin: {line}");
        }
        if !status.success() {
            return Err(self.failed(format!(
                "{name} exited with {status}: {}",
                stderr.lines().last().unwrap_or("")
            )));
        }
        match serde_json::from_slice::<PluginResponse>(&answer) {
            Ok(PluginResponse::Ok(out)) => Ok(*out),
            Ok(PluginResponse::Error(e)) => Err(self.error(e)),
            Err(e) => Err(self.failed(format!(
                "{name} answered what the protocol does not allow: {e}"
            ))),
        }
    }

    fn error(&self, e: PluginError) -> BmcError {
        let (driver, address, message) = (self.driver, self.address.clone(), e.message);
        match e.kind {
            PluginErrorKind::Unauthorized => BmcError::Unauthorized {
                driver,
                address,
                message,
            },
            PluginErrorKind::Unreachable => BmcError::Unreachable {
                driver,
                address,
                message,
            },
            PluginErrorKind::Refused => BmcError::Refused {
                driver,
                address,
                status: e.status.unwrap_or(0),
                message: match e.status {
                    Some(status) => format!("{status}: {message}"),
                    None => message,
                },
            },
            PluginErrorKind::Timeout => BmcError::Timeout {
                driver,
                address,
                message,
            },
            PluginErrorKind::Unsupported => BmcError::Unsupported(message),
            PluginErrorKind::Invalid => BmcError::Invalid(message),
        }
    }

    fn unexpected(&self, out: &PluginOutput) -> BmcError {
        self.failed(format!("answered an operation it was not asked: {out:?}"))
    }

    pub async fn verify(&self) -> Result<Verified, BmcError> {
        match self.run(PluginOperation::Verify).await? {
            PluginOutput::Verify(v) => Ok(v),
            other => Err(self.unexpected(&other)),
        }
    }

    pub async fn inspect(&self) -> Result<Inventory, BmcError> {
        match self.run(PluginOperation::Inspect).await? {
            PluginOutput::Inspect(v) => Ok(v),
            other => Err(self.unexpected(&other)),
        }
    }

    pub async fn power_state(&self) -> Result<PowerState, BmcError> {
        match self.run(PluginOperation::PowerState).await? {
            PluginOutput::PowerState(p) => Ok(p),
            other => Err(self.unexpected(&other)),
        }
    }

    pub async fn power(&self, action: PowerAction) -> Result<PowerState, BmcError> {
        match self.run(PluginOperation::Power { action }).await? {
            PluginOutput::Power(p) => Ok(p),
            other => Err(self.unexpected(&other)),
        }
    }

    pub async fn boot(
        &self,
        device: BootDevice,
        persistent: bool,
        mode: Option<BootMode>,
    ) -> Result<BootOverride, BmcError> {
        match self
            .run(PluginOperation::Boot {
                device,
                persistent,
                mode,
            })
            .await?
        {
            PluginOutput::Boot(b) => Ok(b),
            other => Err(self.unexpected(&other)),
        }
    }

    pub async fn set_password(&self, new: &SecretString) -> Result<(), BmcError> {
        match self
            .run(PluginOperation::SetPassword {
                new_password: new.expose_secret().to_owned(),
            })
            .await?
        {
            PluginOutput::SetPassword => Ok(()),
            other => Err(self.unexpected(&other)),
        }
    }
}

/// Reads a pipe to its end, at most [`MAX_ANSWER_BYTES`].
async fn read_capped<R: tokio::io::AsyncRead + Unpin>(pipe: Option<R>) -> std::io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    if let Some(p) = pipe {
        p.take(MAX_ANSWER_BYTES).read_to_end(&mut buf).await?;
    }
    Ok(buf)
}

/// What a plugin answers for `e` (the other direction of
/// [`PluginDriver`]'s mapping): for a plugin built on this crate's
/// drivers.
pub fn plugin_error(e: &BmcError) -> PluginError {
    let (kind, status) = match e {
        BmcError::Unauthorized { .. } => (PluginErrorKind::Unauthorized, None),
        BmcError::Unreachable { .. } => (PluginErrorKind::Unreachable, None),
        BmcError::Refused { status, .. } => {
            (PluginErrorKind::Refused, Some(*status).filter(|s| *s > 0))
        }
        BmcError::Timeout { .. } => (PluginErrorKind::Timeout, None),
        BmcError::Unsupported(_) | BmcError::RotationRolledBack(_) => {
            (PluginErrorKind::Unsupported, None)
        }
        BmcError::Invalid(_) => (PluginErrorKind::Invalid, None),
    };
    let message = match e {
        // The driver and address are the service's to add again.
        BmcError::Unauthorized { message, .. }
        | BmcError::Unreachable { message, .. }
        | BmcError::Refused { message, .. }
        | BmcError::Timeout { message, .. } => message.clone(),
        other => other.to_string(),
    };
    PluginError {
        kind,
        message,
        status,
    }
}

/// Starts the plugin. Linux refuses to run an executable that is open for
/// writing anywhere (ETXTBSY): a plugin being installed at that moment,
/// or one written by this process while another thread forked (the child
/// holds the writer's descriptor until its own exec). That lasts moments,
/// so it is tried again, pausing 10 ms doubling, for about 0.6 s in all.
async fn spawn_once_not_busy(
    cmd: &mut tokio::process::Command,
) -> std::io::Result<tokio::process::Child> {
    let mut pause = std::time::Duration::from_millis(10);
    for _ in 0..6 {
        match cmd.spawn() {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy => {
                tokio::time::sleep(pause).await;
                pause *= 2;
            }
            started => return started,
        }
    }
    cmd.spawn()
}
