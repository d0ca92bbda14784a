//! `bcx-ipmi`: the IPMI driver as a BMC driver plugin (the protocol of
//! `bcm_contracts::plugin`): one request on standard input, one answer on
//! standard output, exit 0. It runs `ipmitool` (`BCX_IPMITOOL`, default
//! `ipmitool`) with the password in ipmitool's environment, never on a
//! command line. A request it cannot read is answered `invalid`.

use std::io::{Read as _, Write as _};
use std::time::Duration;

use bcm_bmc::ipmi::{Ipmi, IpmiSettings};
use bcm_bmc::plugin::plugin_error;
use bcm_contracts::plugin::{
    PluginError, PluginErrorKind, PluginOperation, PluginOutput, PluginRequest, PluginResponse,
    PROTOCOL_VERSION,
};

/// The most a request may be.
const MAX_REQUEST_BYTES: u64 = 64 << 10;

fn invalid(message: String) -> PluginResponse {
    PluginResponse::Error(PluginError {
        kind: PluginErrorKind::Invalid,
        message,
        status: None,
    })
}

async fn answer(input: &[u8]) -> PluginResponse {
    let req: PluginRequest = match serde_json::from_slice(input) {
        Ok(r) => r,
        Err(e) => {
            return invalid(format!(
                "bcx-ipmi: the request is not protocol {PROTOCOL_VERSION}: {e}"
            ))
        }
    };
    if req.protocol != PROTOCOL_VERSION {
        return invalid(format!(
            "bcx-ipmi speaks protocol {PROTOCOL_VERSION}, not {}",
            req.protocol
        ));
    }
    let mut settings = IpmiSettings::default();
    if let Ok(tool) = std::env::var("BCX_IPMITOOL") {
        settings.ipmitool = tool;
    }
    if let Some(secs) = std::env::var("BCX_POWER_TIMEOUT_SECS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
    {
        settings.power_timeout = Duration::from_secs(secs);
    }
    if let Some(secs) = std::env::var("BCX_GRACEFUL_TIMEOUT_SECS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
    {
        settings.graceful_timeout = Duration::from_secs(secs);
    }
    if let Some(n) = std::env::var("BCX_IPMI_RETRIES")
        .ok()
        .and_then(|s| s.parse::<u8>().ok())
    {
        settings.retries = n;
    }
    let ipmi = match Ipmi::new(
        &req.bmc.address,
        req.bmc.username.into(),
        req.bmc.password.into(),
        settings,
    ) {
        Ok(i) => i,
        Err(e) => return PluginResponse::Error(plugin_error(&e)),
    };
    let out = match req.operation {
        PluginOperation::Verify => ipmi.verify().await.map(PluginOutput::Verify),
        PluginOperation::Inspect => ipmi.inspect().await.map(PluginOutput::Inspect),
        PluginOperation::PowerState => ipmi.power_state().await.map(PluginOutput::PowerState),
        PluginOperation::Power { action } => ipmi.power(action).await.map(PluginOutput::Power),
        PluginOperation::Boot {
            device,
            persistent,
            mode,
        } => ipmi
            .boot(device, persistent, mode)
            .await
            .map(PluginOutput::Boot),
        PluginOperation::SetPassword { new_password } => ipmi
            .set_password(&new_password.into())
            .await
            .map(|()| PluginOutput::SetPassword),
    };
    match out {
        Ok(o) => PluginResponse::Ok(Box::new(o)),
        Err(e) => PluginResponse::Error(plugin_error(&e)),
    }
}

fn main() -> std::process::ExitCode {
    let mut input = Vec::new();
    if let Err(e) = std::io::stdin()
        .take(MAX_REQUEST_BYTES)
        .read_to_end(&mut input)
    {
        eprintln!("bcx-ipmi: reading the request: {e}");
        return std::process::ExitCode::FAILURE;
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("bcx-ipmi: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let response = runtime.block_on(answer(&input));
    let text = match serde_json::to_string(&response) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("bcx-ipmi: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    if writeln!(std::io::stdout(), "{text}").is_err() {
        return std::process::ExitCode::FAILURE;
    }
    std::process::ExitCode::SUCCESS
}
