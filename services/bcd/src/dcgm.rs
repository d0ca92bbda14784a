//! `diag.dcgm`: NVIDIA DCGM diagnostics (`dcgmi diag -r <level> -j`) when
//! the tools are present. Without them (no GPU stack, no GPU) the answer is
//! an explicit `unsupported`, never a pass. The verdict is read from the
//! report: every test result's `status`; one `Fail` fails it, and so does
//! a report that cannot be read or holds no result at all. A `dcgmi` that
//! says it is a stand-in (a top-level `"sim"`, as the e2e ramdisk's) makes
//! the report `sim`.

use bcm_contracts::outputs::{DcgmReport, DcgmStatus};

/// Every `status` of the report's test results, lowercased.
fn statuses(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v) {
                    ("status", serde_json::Value::String(s)) => out.push(s.to_lowercase()),
                    _ => statuses(v, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| statuses(v, out)),
        _ => {}
    }
}

/// The verdict on `dcgmi`'s exit and output: the status, and why when it
/// is not a pass.
pub fn judge(
    success: bool,
    stdout: &[u8],
) -> (DcgmStatus, Option<String>, Option<serde_json::Value>) {
    let Ok(report) = serde_json::from_slice::<serde_json::Value>(stdout) else {
        return (
            DcgmStatus::Fail,
            Some("dcgmi's output is not the JSON report (-j) it was asked for".into()),
            None,
        );
    };
    let mut found = vec![];
    statuses(&report, &mut found);
    let failed = found.iter().filter(|s| s.as_str() == "fail").count();
    let verdict = if !success {
        (
            DcgmStatus::Fail,
            Some("dcgmi exited with an error".to_owned()),
        )
    } else if failed > 0 {
        (
            DcgmStatus::Fail,
            Some(format!("{failed} of {} test results failed", found.len())),
        )
    } else if found.is_empty() {
        (
            DcgmStatus::Fail,
            Some("dcgmi's report holds no test result".to_owned()),
        )
    } else {
        (DcgmStatus::Pass, None)
    };
    (verdict.0, verdict.1, Some(report))
}

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
            let (status, reason, report) = judge(o.status.success(), &o.stdout);
            let sim = report.as_ref().is_some_and(|r| r.get("sim").is_some());
            if sim {
                tracing::warn!(level, "dcgmi is a stand-in (sim): no GPU diagnostic ran");
            }
            Ok(DcgmReport {
                status,
                level,
                reason,
                exit_code: o.status.code(),
                report,
                sim,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REPORT: &str = r#"{"version": "3.3.5", "DCGM GPU Diagnostic": {"test_categories": [
        {"category": "Deployment", "tests": [{"name": "Denylist", "results": [{"status": "Pass"}]}]},
        {"category": "Hardware", "tests": [{"name": "GPU Memory",
            "results": [{"status": "Pass", "gpu_ids": "0"}, {"status": "STATUS", "gpu_ids": "1"}]}]}]}}"#;

    #[test]
    fn every_result_passed_is_a_pass_and_one_failure_fails() {
        let (status, reason, report) = judge(true, REPORT.as_bytes());
        assert_eq!((status, reason), (DcgmStatus::Pass, None));
        assert!(report.is_some());
        let failing = REPORT.replace("\"STATUS\"", "\"Fail\"");
        let (status, reason, _) = judge(true, failing.as_bytes());
        assert_eq!(status, DcgmStatus::Fail);
        assert_eq!(reason.as_deref(), Some("1 of 3 test results failed"));
        let (status, _, _) = judge(false, REPORT.as_bytes());
        assert_eq!(status, DcgmStatus::Fail, "a failed exit is never a pass");
    }

    #[test]
    fn garbage_or_an_empty_report_is_never_a_pass() {
        for out in [
            "",
            "Error: unable to connect to host engine",
            "{}",
            "[1, 2]",
        ] {
            let (status, reason, _) = judge(true, out.as_bytes());
            assert_eq!(status, DcgmStatus::Fail, "{out:?}");
            assert!(reason.is_some());
        }
    }
}
