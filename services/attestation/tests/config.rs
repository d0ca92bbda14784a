//! The example configuration parses, and a generated CA is written once
//! (key 0600), reloaded as the same CA afterwards, and never generated
//! when `generate_ca` is off.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use bcm_attestation::AttestationConfig;

#[test]
fn the_example_parses() {
    use figment::providers::{Format, Toml};
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/config/attestation.example.toml");
    let cfg: AttestationConfig = figment::Figment::from(Toml::file_exact(path))
        .extract_inner("attestation")
        .expect("attestation section");
    assert!(!cfg.generate_ca);
    assert_eq!(cfg.ramdisk_cert_ttl_secs, 43_200);
}

#[test]
fn a_generated_ca_is_written_once_and_reloaded() {
    let dir = std::env::temp_dir().join(format!("bcm-ca-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut cfg = AttestationConfig::ephemeral();
    cfg.ca_cert_file = Some(dir.join("ca.pem"));
    cfg.ca_key_file = Some(dir.join("ca.key"));
    let first = bcm_attestation::ca_store::load(&cfg).expect("generated");
    let mode = std::fs::metadata(dir.join("ca.key"))
        .expect("key")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let again = bcm_attestation::ca_store::load(&cfg).expect("reloaded");
    assert_eq!(first.cert_pem(), again.cert_pem());
    // Off: missing files are an error, not a new CA.
    cfg.generate_ca = false;
    cfg.ca_cert_file = Some(dir.join("missing.pem"));
    cfg.ca_key_file = Some(dir.join("missing.key"));
    assert!(bcm_attestation::ca_store::load(&cfg).is_err());
    cfg.ca_cert_file = None;
    cfg.ca_key_file = None;
    assert!(bcm_attestation::ca_store::load(&cfg).is_err());
    let _ = std::fs::remove_dir_all(&dir);
}
