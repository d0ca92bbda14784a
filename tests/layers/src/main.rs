//! `check-layers`: runs `cargo metadata` on the workspace and fails (exit
//! 1) with one line per violated dependency rule.

use std::process::ExitCode;

fn main() -> ExitCode {
    let out =
        match std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .args(["metadata", "--format-version", "1", "--locked"])
            .output()
        {
            Ok(o) if o.status.success() => o.stdout,
            Ok(o) => {
                eprintln!(
                    "cargo metadata failed: {}",
                    String::from_utf8_lossy(&o.stderr)
                );
                return ExitCode::from(2);
            }
            Err(e) => {
                eprintln!("cannot run cargo metadata: {e}");
                return ExitCode::from(2);
            }
        };
    let meta = match bcm_layers::Metadata::parse(&out) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let violations = bcm_layers::check(&meta);
    if violations.is_empty() {
        println!(
            "layers: {} workspace crates follow the dependency rules",
            meta.members().len()
        );
        return ExitCode::SUCCESS;
    }
    for v in &violations {
        eprintln!("layers: {v}");
    }
    ExitCode::FAILURE
}
