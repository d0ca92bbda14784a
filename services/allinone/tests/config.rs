//! Every example configuration of `bcm` in `deploy/config` parses; the
//! compose ones, which commit no secret, parse with the secrets
//! `deploy/compose/init-secrets.sh` generates at the stack's first start
//! (run here for real, with this build's `bcm nats-auth`).

use std::path::{Path, PathBuf};

fn deploy() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

/// Runs the compose stack's secrets generator into a fresh directory.
fn generated_secrets() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("bcm-compose-secrets-{}", ulid::Ulid::new()));
    std::fs::create_dir_all(&dir).expect("dir");
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_bcm"));
    let path = format!(
        "{}:{}",
        bin.parent().expect("bin dir").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let status = std::process::Command::new("sh")
        .arg(deploy().join("compose/init-secrets.sh"))
        .env("BCM_SECRETS_DIR", &dir)
        .env("PATH", path)
        .stdout(std::process::Stdio::null())
        .status()
        .expect("sh");
    assert!(status.success(), "init-secrets.sh: {status}");
    dir
}

fn load(file: &Path, secrets: Option<&Path>) -> bcm_allinone::Config {
    let files: Vec<&Path> = std::iter::once(file).chain(secrets).collect();
    bcm_config::load_files(&files, "BCM_ALL_").unwrap_or_else(|e| panic!("{}: {e}", file.display()))
}

#[test]
fn example_configs_parse() {
    let secrets = generated_secrets();
    let mut n = 0;
    for entry in std::fs::read_dir(deploy().join("config")).expect("deploy/config") {
        let path = entry.expect("entry").path();
        let name = path
            .file_name()
            .and_then(|f| f.to_str())
            .unwrap_or_default()
            .to_owned();
        if name.starts_with("bcm") && name.ends_with(".toml") {
            let cfg = if name.contains("compose") {
                let cfg = load(&path, Some(&secrets.join("sim.toml")));
                assert!(cfg.sim.nkey_file.as_deref().is_some_and(Path::exists));
                assert!(cfg.api.bus.nkey_file.as_deref().is_some_and(Path::exists));
                assert!(cfg.sim.api_ca_file.as_deref().is_some_and(Path::exists));
                cfg
            } else {
                load(&path, None)
            };
            assert_eq!(cfg.sim.site, "local");
            // Beyond parsing: what the API checks at start-up (hardware
            // profiles, the pools' names of them).
            bcm_api::hardware_profiles(&cfg.api).unwrap_or_else(|e| panic!("{name}: {e}"));
            n += 1;
        }
        if name == "api.compose.toml" {
            let files = [path.as_path(), &secrets.join("api.toml")];
            let api: bcm_api::ApiConfig = bcm_config::load_files(&files, "BCM_API_")
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(!api.sealing_keys.is_empty());
            bcm_api::hardware_profiles(&api).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(api.bus.nkey_file.as_deref().is_some_and(Path::exists));
            // Postgres through TLS, checked against its generated CA.
            let url = &api.database_url;
            assert!(
                url.contains("sslmode=verify-full"),
                "{name}: not verify-full"
            );
            let root = url
                .split("sslrootcert=")
                .nth(1)
                .map(|r| r.split('&').next().unwrap_or(r))
                .expect("sslrootcert");
            assert!(Path::new(root).exists(), "{root}");
            // HTTPS from the generated local CA, never plain HTTP.
            assert!(
                matches!(api.tls.serving(), Ok(bcm_pki::tls::Serving::Tls(_))),
                "{:?}",
                api.tls
            );
        }
    }
    assert!(n >= 1);
    let _ = std::fs::remove_dir_all(&secrets);
}
