//! How every service reads its configuration, the same way everywhere: the
//! TOML file (when one is named), then the TOML file of its secrets named
//! by `<prefix>SECRETS` (generated at first start, never committed: the
//! admin token, the sealing key, the bus identity), merged over it, then
//! environment variables with the service's prefix, nested keys split by
//! `__` (`BCM_API_BUS__URL`). The variables that name files
//! (`<prefix>CONFIG`, clap's `env` of `--config`, and `<prefix>SECRETS`)
//! are not keys.

use serde::de::DeserializeOwned;
use std::path::Path;

/// Loads `T` from `file` (if any), the secrets file `<env_prefix>SECRETS`
/// names (if any), then from `<env_prefix>*` variables.
pub fn load<T: DeserializeOwned>(
    file: Option<&Path>,
    env_prefix: &str,
) -> Result<T, Box<figment::Error>> {
    let secrets = std::env::var_os(format!("{env_prefix}SECRETS")).map(std::path::PathBuf::from);
    let files: Vec<&Path> = file.into_iter().chain(secrets.as_deref()).collect();
    load_files(&files, env_prefix)
}

/// Loads `T` from `files` in order, each merged over the one before, then
/// from `<env_prefix>*` variables.
pub fn load_files<T: DeserializeOwned>(
    files: &[&Path],
    env_prefix: &str,
) -> Result<T, Box<figment::Error>> {
    use figment::providers::{Env, Format, Toml};
    let mut fig = figment::Figment::new();
    for p in files {
        fig = fig.merge(Toml::file_exact(p));
    }
    fig.merge(
        Env::prefixed(env_prefix)
            .ignore(&["config", "secrets"])
            .split("__"),
    )
    .extract()
    .map_err(Box::new)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Cfg {
        name: String,
        inner: Inner,
    }

    #[derive(Debug, serde::Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Inner {
        port: u16,
    }

    #[test]
    fn the_file_then_the_environment_and_the_file_variable_is_no_key() {
        let dir = std::env::temp_dir().join(format!("bcm-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("c.toml");
        std::fs::write(&file, "name = \"from-file\"\n[inner]\nport = 1\n").expect("write");
        // A prefix no other test uses; set once, in this test only.
        std::env::set_var("BCMCFGTEST_INNER__PORT", "8080");
        std::env::set_var("BCMCFGTEST_CONFIG", file.display().to_string());
        let got: Cfg = load(Some(&file), "BCMCFGTEST_").expect("load");
        assert_eq!(
            got,
            Cfg {
                name: "from-file".into(),
                inner: Inner { port: 8080 }
            }
        );
        // The secrets file is merged over the file, under the environment.
        let secrets = dir.join("s.toml");
        std::fs::write(&secrets, "name = \"from-secrets\"\n[inner]\nport = 2\n").expect("write");
        std::env::set_var("BCMCFGTEST_SECRETS", secrets.display().to_string());
        let got: Cfg = load(Some(&file), "BCMCFGTEST_").expect("load");
        assert_eq!(got.name, "from-secrets");
        assert_eq!(got.inner.port, 8080);
        std::env::set_var("BCMCFGTEST_NAMEE", "typo");
        let err = load::<Cfg>(Some(&file), "BCMCFGTEST_").expect_err("unknown key");
        assert!(err.to_string().contains("namee"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
