//! Every example configuration in `deploy/` parses, and unknown fields are
//! refused.

use std::path::PathBuf;

fn deploy() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

#[test]
fn example_configs_parse() {
    let mut n = 0;
    for entry in std::fs::read_dir(deploy().join("config")).expect("deploy/config") {
        let path = entry.expect("entry").path();
        if path
            .file_name()
            .and_then(|f| f.to_str())
            .is_some_and(|f| f.starts_with("api") && f.ends_with(".toml"))
        {
            // The compose file commits no secret: they are merged from the
            // file deploy/compose/init-secrets.sh generates, shaped so.
            let secrets =
                std::env::temp_dir().join(format!("bcm-api-secrets-{}.toml", std::process::id()));
            std::fs::write(
                &secrets,
                "admin_token = \"bcm_0123456789abcdef0123456789abcdef\"\n\
                 database_url = \"postgres://bcm:pw@postgres:5432/bcm\"\n\
                 [bus]\nnkey_file = \"/var/lib/bcm-secrets/nats/api.nk\"\n\
                 [[sealing_keys]]\nid = \"compose-1\"\nkey = \"q83vEjRWeJASNFZ4kBI0VniQEjRWeJASNFZ4kBI0Vng=\"\n",
            )
            .expect("write");
            let files: Vec<&std::path::Path> = if path.to_string_lossy().contains("compose") {
                vec![&path, &secrets]
            } else {
                vec![&path]
            };
            let cfg: bcm_api::ApiConfig = bcm_config::load_files(&files, "BCM_API_")
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            if files.len() == 1 {
                assert!(
                    bcm_api::ApiConfig::load(Some(&path)).is_ok(),
                    "{}",
                    path.display()
                );
            }
            assert!(!cfg.sealing_keys.is_empty());
            bcm_seal::Sealer::new(&cfg.sealing_keys).expect("the example keys are valid");
            assert!(!cfg.seed.deploy_profiles.is_empty(), "{}", path.display());
            for d in &cfg.seed.deploy_profiles {
                d.profile
                    .validate()
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            }
            bcm_api::hardware_profiles(&cfg).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            if path.ends_with("api.example.toml") {
                // A driver hosted as a plugin, bound by name.
                let acme = cfg.hardware_profiles.get("acme").expect("acme profile");
                assert_eq!(acme.drivers.power.plugin_name(), Some("acme"));
            }
            n += 1;
        }
    }
    assert!(n >= 1, "no example config found");
}

#[test]
fn unknown_fields_are_refused() {
    let dir = std::env::temp_dir().join(format!("bcm-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("bad.toml");
    let good = std::fs::read_to_string(deploy().join("config/api.example.toml")).expect("example");
    std::fs::write(&path, format!("{good}\n[relay_typo]\nenabled = true\n")).expect("write");
    let err = bcm_api::ApiConfig::load(Some(&path)).expect_err("a typo must not pass");
    assert!(err.to_string().contains("relay_typo"), "{err}");
}

#[test]
fn a_configuration_the_api_cannot_serve_names_the_key() {
    let base: bcm_api::ApiConfig = bcm_config::load_files(
        &[deploy().join("config/api.example.toml").as_path()],
        "BCM_API_NOTHING_",
    )
    .expect("example");
    let mut unknown_pool_profile = base.clone();
    unknown_pool_profile.seed.pools[0].hardware_profile = "gpu-redfsh".into();
    let mut unknown_default = base.clone();
    unknown_default.default_hardware_profile = "nope".into();
    let mut bad_name = base;
    bad_name.hardware_profiles.insert(
        "Lab Profile".into(),
        bcm_core::hardware::HardwareProfile {
            description: String::new(),
            drivers: bcm_core::hardware::Drivers::of_bmc(bcm_core::BmcDriver::Ipmi),
        },
    );
    for (cfg, key) in [
        (unknown_pool_profile, "seed.pools[0].hardware_profile"),
        (unknown_default, "default_hardware_profile"),
        (bad_name, "hardware_profiles.Lab Profile"),
    ] {
        let err = bcm_api::hardware_profiles(&cfg).expect_err(key).to_string();
        assert!(err.contains(key), "{err}");
    }
}

#[test]
fn an_idle_heartbeat_budget_that_is_not_a_whole_number_is_refused_naming_the_key() {
    let dir = std::env::temp_dir().join(format!("bcm-config-idle-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let good = std::fs::read_to_string(deploy().join("config/api.example.toml")).expect("example");
    assert!(good.contains("max_idle_heartbeats_per_sec = 100\n"));
    for garbage in ["-1", "1.5", "\"many\"", "1e400", "99999999999"] {
        let path = dir.join("idle.toml");
        let text = good.replace(
            "max_idle_heartbeats_per_sec = 100\n",
            &format!("max_idle_heartbeats_per_sec = {garbage}\n"),
        );
        std::fs::write(&path, text).expect("write");
        match bcm_api::ApiConfig::load(Some(&path)) {
            Err(e) => assert!(
                e.to_string().contains("max_idle_heartbeats_per_sec"),
                "{garbage}: {e}"
            ),
            Ok(cfg) => panic!(
                "{garbage} was taken as {}",
                cfg.agents.max_idle_heartbeats_per_sec
            ),
        }
    }
    // A whole number the service cannot use parses, and the start-up
    // check refuses it by name.
    let path = dir.join("refresh.toml");
    std::fs::write(
        &path,
        good.replace(
            "idle_fleet_refresh_secs = 30\n",
            "idle_fleet_refresh_secs = 0\n",
        ),
    )
    .expect("write");
    let cfg = bcm_api::ApiConfig::load(Some(&path)).expect("parses");
    assert!(cfg
        .agents
        .check()
        .is_err_and(|e| e.contains("agents.idle_fleet_refresh_secs")));
    // The agent pool's wait: garbage does not parse, and a wait the agents
    // would not sit through (or none) is refused by name.
    assert!(good.contains("pool_wait_ms = 10000\n"));
    let path = dir.join("pool-wait.toml");
    for garbage in ["-1", "1.5", "\"long\"", "1e400"] {
        let text = good.replace(
            "pool_wait_ms = 10000\n",
            &format!("pool_wait_ms = {garbage}\n"),
        );
        std::fs::write(&path, text).expect("write");
        assert!(
            bcm_api::ApiConfig::load(Some(&path))
                .is_err_and(|e| e.to_string().contains("pool_wait_ms")),
            "{garbage}"
        );
    }
    for unusable in ["0", "99", "30001", "99999999999"] {
        let text = good.replace(
            "pool_wait_ms = 10000\n",
            &format!("pool_wait_ms = {unusable}\n"),
        );
        std::fs::write(&path, text).expect("write");
        let cfg = bcm_api::ApiConfig::load(Some(&path)).expect("parses");
        assert!(
            cfg.agents
                .check()
                .is_err_and(|e| e.contains("agents.pool_wait_ms")),
            "{unusable}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn connection_limits_that_are_not_whole_numbers_or_cannot_serve_are_refused_naming_the_key() {
    let dir = std::env::temp_dir().join(format!("bcm-config-http-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let good = std::fs::read_to_string(deploy().join("config/api.example.toml")).expect("example");
    for (key, line) in [
        ("max_connections", "max_connections = 0\n"),
        ("idle_timeout_secs", "idle_timeout_secs = 75\n"),
    ] {
        assert!(good.contains(line), "{line}");
        for garbage in ["-1", "1.5", "\"many\"", "1e400", "99999999999", "[]"] {
            let path = dir.join("http.toml");
            std::fs::write(&path, good.replace(line, &format!("{key} = {garbage}\n")))
                .expect("write");
            match bcm_api::ApiConfig::load(Some(&path)) {
                Err(e) => assert!(e.to_string().contains(key), "{key} = {garbage}: {e}"),
                Ok(cfg) => panic!("{key} = {garbage} was taken: {:?}", cfg.http),
            }
        }
    }
    // Whole numbers the server cannot use parse, and the start-up check
    // refuses them by name.
    for (line, bad, name) in [
        (
            "idle_timeout_secs = 75\n",
            "idle_timeout_secs = 0\n",
            "http.idle_timeout_secs",
        ),
        (
            "max_connections = 0\n",
            "max_connections = 20000000\n",
            "http.max_connections",
        ),
    ] {
        let path = dir.join("http-range.toml");
        std::fs::write(&path, good.replace(line, bad)).expect("write");
        let cfg = bcm_api::ApiConfig::load(Some(&path)).expect("parses");
        assert!(cfg.http.check().is_err_and(|e| e.contains(name)), "{bad}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
