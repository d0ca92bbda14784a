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
    // It commits no key: the sealing key and the bus identity are merged
    // from the file deploy/compose/init-secrets.sh generates, shaped so.
    let secrets = std::env::temp_dir().join(format!("bcm-bmc-secrets-{}.toml", std::process::id()));
    std::fs::write(
        &secrets,
        "[bus]\nnkey_file = \"/var/lib/bcm-secrets/nats/bmc-lab.nk\"\n\
         [[sealing_keys]]\nid = \"compose-1\"\nkey = \"q83vEjRWeJASNFZ4kBI0VniQEjRWeJASNFZ4kBI0Vng=\"\n",
    )
    .expect("write");
    assert!(
        bcm_bmc::BmcConfig::load(Some(&path)).is_err() || {
            // (unless the environment names secrets of its own)
            std::env::var_os("BCM_BMC_SECRETS").is_some()
        },
        "the committed file alone must hold no sealing key"
    );
    let cfg: bcm_bmc::BmcConfig =
        bcm_config::load_files(&[&path, &secrets], "BCM_BMC_").expect("compose config");
    assert_eq!(cfg.site, "lab");
    assert!(cfg.bus.nkey_file.is_some());
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

/// `plugins.<name>`: `ipmi` hosts IPMI, any other good name hosts
/// `plugin:<name>`; a built-in name, a bad name or a missing executable is
/// a start-up error naming the key.
#[test]
fn plugins_host_drivers_by_name() {
    let dir = std::env::temp_dir().join(format!("bcm-bmc-plugins-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let exe = dir.join("bcx-acme");
    std::fs::write(&exe, "#!/bin/sh\n").expect("exe");
    let mut cfg = bcm_bmc::BmcConfig::load(Some(&example())).expect("example");
    cfg.plugins.insert("acme".into(), exe.clone());
    let drivers = cfg.drivers().expect("drivers");
    let acme = bcm_core::BmcDriver::parse("plugin:acme").expect("driver");
    assert_eq!(
        drivers.plugins.get(&acme).map(|p| p.executable.clone()),
        Some(exe.clone())
    );
    for (name, path, says) in [
        (
            "redfish",
            exe.clone(),
            "plugins.redfish: redfish is not hosted",
        ),
        (
            "Acme Corp",
            exe.clone(),
            "plugins.Acme Corp: plugin driver name",
        ),
        ("acme", dir.join("missing"), "plugins.acme:"),
    ] {
        let mut bad = bcm_bmc::BmcConfig::load(Some(&example())).expect("example");
        bad.plugins.insert(name.into(), path);
        let e = bad.drivers().expect_err(name).to_string();
        assert!(e.contains(says), "{e}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
