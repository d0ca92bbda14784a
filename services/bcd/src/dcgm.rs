//! `diag.dcgm`: NVIDIA DCGM diagnostics (`dcgmi diag -r <level> -j`) when
//! the tools are present. Without them (no GPU stack, no GPU) the answer is
//! an explicit `unsupported`, never a pass.

use bcm_contracts::outputs::{DcgmReport, DcgmStatus};

/// Runs the diagnostic at `level`: the report, or why it could not run.
pub fn run(level: u8) -> Result<DcgmReport, String> {
    let out = std::process::Command::new("dcgmi")
        .args(["diag", "-r", &level.to_string(), "-j"])
        .output();
    match out {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(DcgmReport {
            status: DcgmStatus::Unsupported,
            level,
            reason: Some("dcgmi is not installed: no NVIDIA GPU stack on this machine".into()),
            exit_code: None,
            report: None,
            sim: false,
        }),
        Err(e) => Err(format!("running dcgmi: {e}")),
        Ok(o) => {
            let report: Option<serde_json::Value> = serde_json::from_slice(&o.stdout).ok();
            let text = String::from_utf8_lossy(&o.stdout).to_lowercase();
            let status = if !o.status.success() || text.contains("\"fail") {
                DcgmStatus::Fail
            } else {
                DcgmStatus::Pass
            };
            Ok(DcgmReport {
                status,
                level,
                reason: None,
                exit_code: o.status.code(),
                report,
                sim: false,
            })
        }
    }
}
