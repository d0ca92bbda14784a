//! Every example configuration of `bcm` in `deploy/config` parses.

#[test]
fn example_configs_parse() {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/config");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).expect("deploy/config") {
        let path = entry.expect("entry").path();
        let name = path
            .file_name()
            .and_then(|f| f.to_str())
            .unwrap_or_default()
            .to_owned();
        if name.starts_with("bcm") && name.ends_with(".toml") {
            let cfg =
                bcm_allinone::Config::load(Some(&path)).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(cfg.sim.site, "local");
            n += 1;
        }
    }
    assert!(n >= 1);
}
