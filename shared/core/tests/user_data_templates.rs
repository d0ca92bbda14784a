//! The shipped user data templates, rendered for one node and compared with
//! the golden files under `tests/golden/` (`BLESS=1` rewrites them after a
//! deliberate change). Each rendering is parsed as YAML and checked for what
//! the installed OS needs: the join parameters and the checked download.

use bcm_core::deploy::{
    template, BcdDownload, DeployProfile, DeployProfileError, DeployRole, ImageFormat, ImageRef,
    UserDataVars, TEMPLATES,
};
use yaml_rust2::{Yaml, YamlLoader};

const SHA: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
const URL: &str = "https://cp.example:8443/api/compute/downloads/bcd/0.3.0/linux-amd64";

fn profile(user_data: &str) -> DeployProfile {
    DeployProfile {
        id: "ubuntu-24.04".into(),
        version: 1,
        role: DeployRole::Host,
        image: ImageRef {
            url: "http://images.local/ubuntu.raw".into(),
            format: ImageFormat::Raw,
            sha256: "a".repeat(64),
            size_bytes: 1 << 20,
            signature: None,
            data_ranges: None,
        },
        user_data: user_data.into(),
        catalog_image: None,
    }
}

fn vars(bcd: Option<BcdDownload<'static>>) -> UserDataVars<'static> {
    UserDataVars {
        node_id: "node_01kexample",
        join_token: "bcmjref_golden",
        control_plane_url: "https://cp.example:8443",
        bcd,
    }
}

fn golden(name: &str, text: &str) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(format!("{name}.yaml"));
    if std::env::var_os("BLESS").is_some() {
        std::fs::write(&path, text).expect("write golden");
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (BLESS=1 writes it)", path.display()));
    assert_eq!(text, want, "{name} differs from {}", path.display());
}

fn parse(text: &str) -> Yaml {
    let mut docs = YamlLoader::load_from_str(text).expect("valid YAML");
    assert_eq!(docs.len(), 1, "one document");
    docs.remove(0)
}

#[test]
fn every_shipped_template_validates_renders_and_matches_its_golden_file() {
    let bcd = Some(BcdDownload {
        url: URL,
        sha256: SHA,
    });
    for (name, text) in TEMPLATES {
        let p = profile(text);
        assert_eq!(p.validate(), Ok(()), "{name}");
        let rendered = p.render_user_data(&vars(bcd)).expect("renders");
        assert!(rendered.starts_with("#cloud-config\n"), "{name}");
        assert!(!rendered.contains("{{"), "{name}: {rendered}");
        assert!(rendered.contains("bcmjref_golden"), "{name}");
        golden(name, &rendered);
        parse(&rendered);
    }
}

#[test]
fn nocloud_writes_the_join_file_for_root_and_checks_the_download() {
    let p = profile(template("nocloud").expect("shipped"));
    assert!(p.needs_bcd());
    let doc = parse(
        &p.render_user_data(&vars(Some(BcdDownload {
            url: URL,
            sha256: SHA,
        })))
        .expect("renders"),
    );
    let files = doc["write_files"].as_vec().expect("write_files");
    let join = files
        .iter()
        .find(|f| f["path"].as_str() == Some("/etc/bcd/join.env"))
        .expect("join.env");
    assert_eq!(join["permissions"].as_str(), Some("0600"));
    let content = join["content"].as_str().expect("content");
    assert!(
        content.contains("BCD_JOIN_TOKEN=bcmjref_golden\n"),
        "{content}"
    );
    assert!(
        content.contains("BCD_API=https://cp.example:8443\n"),
        "{content}"
    );
    let runcmd = format!("{:?}", doc["runcmd"]);
    assert!(runcmd.contains(URL), "{runcmd}");
    assert!(runcmd.contains(&format!("{SHA}  ")), "{runcmd}");
    assert!(runcmd.contains("sha256sum -c"), "{runcmd}");
}

#[test]
fn autoinstall_is_version_1_and_installs_bcd_in_the_target() {
    let p = profile(template("autoinstall").expect("shipped"));
    let doc = parse(
        &p.render_user_data(&vars(Some(BcdDownload {
            url: URL,
            sha256: SHA,
        })))
        .expect("renders"),
    );
    let ai = &doc["autoinstall"];
    assert_eq!(ai["version"].as_i64(), Some(1));
    let late: Vec<&str> = ai["late-commands"]
        .as_vec()
        .expect("late-commands")
        .iter()
        .filter_map(Yaml::as_str)
        .collect();
    assert!(late
        .iter()
        .any(|c| c.contains(URL) && c.contains("/target/usr/local/bin/bcd")));
    assert!(late
        .iter()
        .any(|c| c.contains(SHA) && c.contains("sha256sum -c")));
    assert!(late
        .iter()
        .any(|c| c.contains("systemctl enable bcd-node.service")));
}

#[test]
fn a_template_that_downloads_bcd_cannot_render_where_none_is_published() {
    let p = profile(template("nocloud").expect("shipped"));
    assert_eq!(
        p.render_user_data(&vars(None)),
        Err(DeployProfileError::Unrenderable("bcdUrl"))
    );
    // The preinstalled template needs no download.
    let p = profile(template("bcd-preinstalled").expect("shipped"));
    assert!(!p.needs_bcd());
    assert!(p.render_user_data(&vars(None)).is_ok());
    assert_eq!(template("cloud-config"), None);
}
