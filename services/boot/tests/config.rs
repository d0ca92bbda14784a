//! The example and compose configurations parse; unknown fields are refused.

use std::path::PathBuf;

fn config(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/config")
        .join(name)
}

#[test]
fn the_documented_configurations_parse() {
    let example = bcm_boot::BootConfig::load(Some(&config("boot.example.toml"))).expect("example");
    assert_eq!(example.images.len(), 2);
    assert_eq!(example.dhcp.interface.as_deref(), Some("eth1"));
    assert!(example.http_proxy.is_some());
    let compose = bcm_boot::BootConfig::load(Some(&config("boot.compose.toml"))).expect("compose");
    assert_eq!(compose.site, "lab");
    assert_eq!(compose.dhcp.port, 67, "defaults fill what is not given");
}

#[test]
fn a_typo_is_refused() {
    let dir = std::env::temp_dir().join(format!("bcm-boot-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("bad.toml");
    let good = std::fs::read_to_string(config("boot.example.toml")).expect("example");
    std::fs::write(&path, format!("lease_tll_secs = 6\n{good}")).expect("write");
    let err = bcm_boot::BootConfig::load(Some(&path)).expect_err("typo");
    assert!(err.to_string().contains("lease_tll_secs"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
