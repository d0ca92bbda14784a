//! The example configuration parses, and unknown fields are refused.

use std::path::PathBuf;

fn example() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/config/bmc.example.toml")
}

#[test]
fn the_example_parses_and_builds_the_drivers() {
    let cfg = bcm_bmc::BmcConfig::load(Some(&example())).expect("example");
    assert_eq!(cfg.site, "local");
    assert!(!cfg.tls_insecure);
    bcm_seal::Sealer::new(&cfg.sealing_keys).expect("keys");
    cfg.drivers().expect("drivers");
}

#[test]
fn the_compose_configuration_parses() {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/config/bmc.compose.toml");
    let cfg = bcm_bmc::BmcConfig::load(Some(&path)).expect("compose config");
    assert_eq!(cfg.site, "lab");
    bcm_seal::Sealer::new(&cfg.sealing_keys).expect("keys");
}

#[test]
fn a_typo_is_refused() {
    let dir = std::env::temp_dir().join(format!("bcm-bmc-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("bad.toml");
    let good = std::fs::read_to_string(example()).expect("example");
    std::fs::write(&path, format!("tls_insecrue = true\n{good}")).expect("write");
    let err = bcm_bmc::BmcConfig::load(Some(&path)).expect_err("typo");
    assert!(err.to_string().contains("tls_insecrue"), "{err}");
}
