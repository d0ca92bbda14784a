//! `diag.dcgm`: NVIDIA DCGM diagnostics (`dcgmi diag -r <level> -j`) when
//! the tools are present. Without them (no GPU stack, no GPU) the answer is
//! an explicit `unsupported`, never a pass.

use serde_json::{json, Value};

/// Runs the diagnostic at `level`: `(ok, output, error)`.
pub fn run(level: u64) -> (bool, Value, Option<String>) {
    let out = std::process::Command::new("dcgmi")
        .args(["diag", "-r", &level.to_string(), "-j"])
        .output();
    match out {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => (
            true,
            json!({
                "status": "unsupported",
                "level": level,
                "reason": "dcgmi is not installed: no NVIDIA GPU stack on this machine",
            }),
            None,
        ),
        Err(e) => (false, json!({}), Some(format!("running dcgmi: {e}"))),
        Ok(o) => {
            let report: Value = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
            let text = String::from_utf8_lossy(&o.stdout).to_lowercase();
            let status = if !o.status.success() || text.contains("\"fail") {
                "fail"
            } else {
                "pass"
            };
            (
                true,
                json!({ "status": status, "level": level, "exitCode": o.status.code(), "report": report }),
                None,
            )
        }
    }
}
