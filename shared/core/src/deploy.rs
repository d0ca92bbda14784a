//! Tenant deploy profiles as data: what `metal.deploy` installs (a signed
//! image reference), the role a finished deploy gives the node, and the user
//! data template rendered for each node. A profile is immutable once stored:
//! a new image or template is a new version. Validation and rendering are
//! pure; the catalog lives in the db crate.

use serde::{Deserialize, Serialize};

/// The role a finished deploy gives the node.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
    utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum DeployRole {
    /// A shared host the platform schedules onto.
    Host,
    /// A whole machine leased to one tenant.
    Dedicated,
}

impl DeployRole {
    /// The node's `role` field.
    pub fn as_str(self) -> &'static str {
        match self {
            DeployRole::Host => "host",
            DeployRole::Dedicated => "dedicated",
        }
    }
}

/// On-disk format of an image.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
    utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum ImageFormat {
    Raw,
    Qcow2,
    /// An installer ISO for an agentless pool's virtual media: never
    /// streamed to disk by the agent.
    Iso,
}

/// The image a profile installs, checked by the ramdisk before and after it
/// writes.
#[derive(
    Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema, utoipa::ToSchema,
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ImageRef {
    /// Where the ramdisk streams it from (through the site's forward proxy when set).
    #[schema(pattern = "^https?://", max_length = 2048)]
    pub url: String,
    pub format: ImageFormat,
    /// Lower-case hex SHA-256 of the image as served.
    #[schema(pattern = "^[0-9a-f]{64}$")]
    pub sha256: String,
    #[schema(minimum = 1)]
    pub size_bytes: u64,
    /// The publisher's ed25519 signature (base64) over the manifest (url,
    /// format, size, sha256, and the block map when there is one); `bcd`
    /// refuses an unsigned or untrusted manifest before it touches the disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
    /// A raw image's block map: its runs of data in order, each with its
    /// own sha256; every byte outside them is zero. With one, `bcd` fetches
    /// only the runs (HTTP ranges) and checks each, instead of streaming
    /// and hashing the image's zeros. `metalctl image sign` makes one for a
    /// raw image with runs of zeros. Absent: the whole image is streamed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_items = 4096)]
    pub data_ranges: Option<Vec<DataRange>>,
}

/// One run of a raw image's data in its block map.
#[derive(
    Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema, utoipa::ToSchema,
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DataRange {
    /// Where the run starts: a multiple of 1 MiB ([`DATA_RANGE_ALIGN`]).
    pub offset: u64,
    /// Its length: a multiple of 1 MiB, unless the run ends the image.
    #[schema(minimum = 1)]
    pub length: u64,
    /// Lower-case hex SHA-256 of the run's bytes.
    #[schema(pattern = "^[0-9a-f]{64}$")]
    pub sha256: String,
}

/// A block map's granularity: runs start and end on it (but the image's
/// end), which is also `bcd`'s write and read-back chunk for a raw image.
pub const DATA_RANGE_ALIGN: u64 = 1 << 20;

/// The most runs a block map lists (a run is about a hundred bytes of JSON).
pub const MAX_DATA_RANGES: usize = 4096;

/// A versioned tenant deploy profile.
#[derive(
    Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema, utoipa::ToSchema,
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeployProfile {
    pub id: String,
    pub version: u32,
    /// `host` unless the profile leases the whole machine (`dedicated`).
    #[serde(default = "host")]
    pub role: DeployRole,
    pub image: ImageRef,
    /// The catalog image `image` was taken from, when the profile names
    /// one (absent: an image given inline, outside the catalog).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catalog_image: Option<String>,
    /// The user data template; `{{ name }}` placeholders from [`PLACEHOLDERS`].
    /// Defaults to [`DEFAULT_USER_DATA`].
    #[serde(default = "default_user_data")]
    pub user_data: String,
}

fn host() -> DeployRole {
    DeployRole::Host
}

fn default_user_data() -> String {
    DEFAULT_USER_DATA.to_owned()
}

/// The placeholders a user data template may use.
pub const PLACEHOLDERS: [&str; 5] = [
    "nodeId",
    "joinToken",
    "controlPlaneUrl",
    "bcdUrl",
    "bcdSha256",
];

/// The placeholders that need a published `bcd` download: a template that
/// uses one cannot be rendered where none is published.
pub const BCD_PLACEHOLDERS: [&str; 2] = ["bcdUrl", "bcdSha256"];

/// The placeholders every template must use: without them the installed OS
/// cannot join, and the deploy would wait for it in vain.
pub const REQUIRED_PLACEHOLDERS: [&str; 2] = ["joinToken", "controlPlaneUrl"];

/// Why a profile is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeployProfileError {
    #[error("profile id {0:?} must be 1-64 characters of a-z, 0-9, '.', '-' or '_'")]
    BadId(String),
    #[error("profile version must be 1 or more")]
    BadVersion,
    #[error("image url {0:?} must be an http:// or https:// URL with a host and no credentials")]
    BadImageUrl(String),
    #[error("image sha256 must be 64 lower-case hex digits")]
    BadSha256,
    #[error("image size must be more than 0 bytes")]
    BadSize,
    #[error("image signature must be 1-1024 ASCII characters (base64)")]
    BadSignature,
    #[error("image dataRanges: {0}")]
    BadDataRanges(String),
    #[error("user data uses an unknown placeholder {{{{ {0} }}}}")]
    UnknownPlaceholder(String),
    #[error("user data has an unclosed placeholder")]
    UnclosedPlaceholder,
    #[error("user data must use {{{{ {0} }}}} so the installed OS can join")]
    MissingPlaceholder(&'static str),
    #[error("user data uses {{{{ {0} }}}} but no bcd download is published for the node")]
    Unrenderable(&'static str),
}

/// The per-node values a template is rendered with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserDataVars<'a> {
    pub node_id: &'a str,
    pub join_token: &'a str,
    pub control_plane_url: &'a str,
    /// The published `bcd` the installed OS downloads, where one is.
    pub bcd: Option<BcdDownload<'a>>,
}

/// Where the installed OS downloads `bcd` from, and its SHA-256.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BcdDownload<'a> {
    pub url: &'a str,
    pub sha256: &'a str,
}

impl UserDataVars<'_> {
    fn get(&self, name: &str) -> Option<&str> {
        match name {
            "nodeId" => Some(self.node_id),
            "joinToken" => Some(self.join_token),
            "controlPlaneUrl" => Some(self.control_plane_url),
            "bcdUrl" => self.bcd.map(|b| b.url),
            "bcdSha256" => self.bcd.map(|b| b.sha256),
            _ => None,
        }
    }
}

/// The template split into literal text and placeholder names.
enum Piece<'a> {
    Text(&'a str),
    Var(&'a str),
}

fn pieces(template: &str) -> Result<Vec<Piece<'_>>, DeployProfileError> {
    let mut out = vec![];
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        out.push(Piece::Text(&rest[..start]));
        let after = &rest[start + 2..];
        let end = after
            .find("}}")
            .ok_or(DeployProfileError::UnclosedPlaceholder)?;
        let name = after[..end].trim();
        if !PLACEHOLDERS.contains(&name) {
            return Err(DeployProfileError::UnknownPlaceholder(name.to_owned()));
        }
        out.push(Piece::Var(name));
        rest = &after[end + 2..];
    }
    out.push(Piece::Text(rest));
    Ok(out)
}

/// Checks a site's upstream HTTP proxy: `http://host:port` with nothing
/// else (no credentials: the setting is read by every administrator and
/// carried in commands; no path).
pub fn check_http_proxy(url: &str) -> Result<(), String> {
    let parsed = url::Url::parse(url).map_err(|e| format!("httpProxy {url:?}: {e}"))?;
    if parsed.scheme() != "http"
        || parsed.host().is_none()
        || parsed.port().is_none()
        || !parsed.username().is_empty()
        || parsed.password().is_some()
        || !matches!(parsed.path(), "" | "/")
        || parsed.query().is_some()
        || parsed.fragment().is_some()
        || url.len() > 512
    {
        return Err(format!(
            "httpProxy {url:?} must be http://host:port (no credentials, no path)"
        ));
    }
    Ok(())
}

impl ImageRef {
    /// Checks the reference: an absolute http(s) URL with a host and no
    /// credentials in it (a catalog is read by every reader of the
    /// tenant's), a lower-case sha256 and a size.
    pub fn validate(&self) -> Result<(), DeployProfileError> {
        let url = &self.url;
        let parsed_ok = url::Url::parse(url).is_ok_and(|u| {
            matches!(u.scheme(), "http" | "https")
                && u.host().is_some()
                && u.username().is_empty()
                && u.password().is_none()
        });
        if !parsed_ok
            || !(url.starts_with("http://") || url.starts_with("https://"))
            || url.len() > 2048
        {
            return Err(DeployProfileError::BadImageUrl(url.clone()));
        }
        if !is_sha256_hex(&self.sha256) {
            return Err(DeployProfileError::BadSha256);
        }
        if self.size_bytes == 0 {
            return Err(DeployProfileError::BadSize);
        }
        if self
            .signature
            .as_ref()
            .is_some_and(|s| s.is_empty() || s.len() > 1024 || !s.is_ascii())
        {
            return Err(DeployProfileError::BadSignature);
        }
        if let Some(ranges) = &self.data_ranges {
            check_data_ranges(self.format, self.size_bytes, ranges)
                .map_err(DeployProfileError::BadDataRanges)?;
        }
        Ok(())
    }
}

/// Checks a block map against its image: a raw image's, at most
/// [`MAX_DATA_RANGES`] runs, in order and not overlapping, each 1 MiB-aligned (its end
/// too, unless it is the image's end), within the image, with a sha256.
pub fn check_data_ranges(
    format: ImageFormat,
    size_bytes: u64,
    ranges: &[DataRange],
) -> Result<(), String> {
    if format != ImageFormat::Raw {
        return Err("a block map describes a raw image's bytes; this image is not raw".into());
    }
    if ranges.len() > MAX_DATA_RANGES {
        return Err(format!(
            "{} runs; a block map lists at most {MAX_DATA_RANGES}",
            ranges.len()
        ));
    }
    let mut from = 0u64;
    for (i, r) in ranges.iter().enumerate() {
        let end = r.offset.checked_add(r.length).filter(|e| *e <= size_bytes);
        let Some(end) = end else {
            return Err(format!("run {i} goes past the image's {size_bytes} bytes"));
        };
        if r.length == 0 {
            return Err(format!("run {i} is empty"));
        }
        if r.offset < from {
            return Err(format!(
                "run {i} starts at {} before the previous run's end {from}: runs are in order and do not overlap",
                r.offset
            ));
        }
        if r.offset % DATA_RANGE_ALIGN != 0 || (end % DATA_RANGE_ALIGN != 0 && end != size_bytes) {
            return Err(format!(
                "run {i} ({}+{}) is not aligned to {DATA_RANGE_ALIGN} bytes (its end may be the image's end)",
                r.offset, r.length
            ));
        }
        if !is_sha256_hex(&r.sha256) {
            return Err(format!("run {i}'s sha256 must be 64 lower-case hex digits"));
        }
        from = end;
    }
    Ok(())
}

fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f'))
}

impl DeployProfile {
    /// Checks the profile; a refused profile is never stored.
    pub fn validate(&self) -> Result<(), DeployProfileError> {
        let id_ok = !self.id.is_empty()
            && self.id.len() <= 64
            && self.id.chars().all(|c| {
                c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '-' | '_')
            });
        if !id_ok {
            return Err(DeployProfileError::BadId(self.id.clone()));
        }
        if self.version == 0 {
            return Err(DeployProfileError::BadVersion);
        }
        self.image.validate()?;
        let used: Vec<&str> = pieces(&self.user_data)?
            .into_iter()
            .filter_map(|p| match p {
                Piece::Var(v) => Some(v),
                Piece::Text(_) => None,
            })
            .collect();
        for required in REQUIRED_PLACEHOLDERS {
            if !used.contains(&required) {
                return Err(DeployProfileError::MissingPlaceholder(required));
            }
        }
        Ok(())
    }

    /// Whether the template needs a published `bcd` download
    /// ([`BCD_PLACEHOLDERS`]).
    pub fn needs_bcd(&self) -> bool {
        pieces(&self.user_data)
            .map(|ps| {
                ps.iter()
                    .any(|p| matches!(p, Piece::Var(v) if BCD_PLACEHOLDERS.contains(v)))
            })
            .unwrap_or(false)
    }

    /// Renders the user data for one node. Fails on a template that
    /// [`DeployProfile::validate`] refuses, and on a placeholder whose value
    /// `vars` lacks (a `bcd` download where none is published).
    pub fn render_user_data(&self, vars: &UserDataVars<'_>) -> Result<String, DeployProfileError> {
        let mut out = String::with_capacity(self.user_data.len() + 128);
        for p in pieces(&self.user_data)? {
            match p {
                Piece::Text(t) => out.push_str(t),
                Piece::Var(v) => out.push_str(vars.get(v).ok_or_else(|| {
                    DeployProfileError::Unrenderable(
                        PLACEHOLDERS.into_iter().find(|n| *n == v).unwrap_or("?"),
                    )
                })?),
            }
        }
        Ok(out)
    }
}

/// The user data templates this project ships, by name: what a publisher
/// names instead of writing a template.
pub const TEMPLATES: [(&str, &str); 3] = [
    ("bcd-preinstalled", DEFAULT_USER_DATA),
    ("nocloud", NOCLOUD_USER_DATA),
    ("autoinstall", AUTOINSTALL_USER_DATA),
];

/// The shipped template named `name`.
pub fn template(name: &str) -> Option<&'static str> {
    TEMPLATES
        .into_iter()
        .find(|(n, _)| *n == name)
        .map(|(_, t)| t)
}

/// cloud-init NoCloud: downloads `bcd` from the control plane, refuses it
/// unless its SHA-256 matches, installs it with its systemd unit and starts
/// it with the node's join parameters (the token file is root's only).
pub const NOCLOUD_USER_DATA: &str = include_str!("../templates/nocloud.yaml");

/// Ubuntu autoinstall (subiquity): the same installation of `bcd`, done by
/// the installer's late commands into the installed system (`/target`).
pub const AUTOINSTALL_USER_DATA: &str = include_str!("../templates/autoinstall.yaml");

/// The user data a profile gets when it names none: a cloud-config that
/// gives a `bcd` already in the image its join parameters. (Until this was
/// read from a file, the Rust string's line continuations stripped the YAML's
/// indentation and the shipped template did not parse.)
pub const DEFAULT_USER_DATA: &str = include_str!("../templates/bcd-preinstalled.yaml");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_site_proxy_is_host_and_port_only() {
        assert!(check_http_proxy("http://10.0.0.1:3128").is_ok());
        assert!(check_http_proxy("http://proxy.example:8888/").is_ok());
        for bad in [
            "",
            "proxy:3128",
            "https://proxy:3128",
            "http://proxy",
            "http://user:pw@proxy:3128",
            "http://proxy:3128/path",
            "http://proxy:3128?x=1",
            "socks5://proxy:1080",
        ] {
            assert!(check_http_proxy(bad).is_err(), "{bad}");
        }
    }

    fn profile() -> DeployProfile {
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
            user_data: DEFAULT_USER_DATA.into(),
            catalog_image: None,
        }
    }

    fn run(offset: u64, length: u64) -> DataRange {
        DataRange {
            offset,
            length,
            sha256: "b".repeat(64),
        }
    }

    #[test]
    fn a_block_map_is_a_raw_images_aligned_runs_in_order_within_it() {
        const M: u64 = DATA_RANGE_ALIGN;
        let size = 10 * M + 5;
        let ok: [&[DataRange]; 4] = [
            &[],
            &[run(0, M)],
            &[run(0, 2 * M), run(4 * M, M), run(9 * M, M + 5)],
            &[run(2 * M, 8 * M + 5)],
        ];
        for ranges in ok {
            assert_eq!(
                check_data_ranges(ImageFormat::Raw, size, ranges),
                Ok(()),
                "{ranges:?}"
            );
        }
        let mut bad_sha = run(0, M);
        bad_sha.sha256 = "B".repeat(64);
        let too_many: Vec<DataRange> = (0..=MAX_DATA_RANGES as u64)
            .map(|i| run(i * 2 * M, M))
            .collect();
        let bad: Vec<(Vec<DataRange>, &str)> = vec![
            (vec![run(0, 0)], "empty"),
            (vec![run(1, M)], "aligned"),
            (vec![run(0, M + 1)], "aligned"),
            (vec![run(0, 11 * M)], "past the image"),
            (vec![run(10 * M, M)], "past the image"),
            (vec![run(u64::MAX - M + 1, M)], "past the image"),
            (vec![run(2 * M, M), run(0, M)], "in order"),
            (vec![run(0, 2 * M), run(M, M)], "in order"),
            (vec![bad_sha], "sha256"),
            (too_many, "at most"),
        ];
        for (ranges, why) in bad {
            let got = check_data_ranges(ImageFormat::Raw, u64::MAX, &ranges)
                .and_then(|()| check_data_ranges(ImageFormat::Raw, size, &ranges));
            assert!(
                got.as_ref().is_err_and(|e| e.contains(why)),
                "{ranges:?}: {got:?}"
            );
        }
        assert!(check_data_ranges(ImageFormat::Qcow2, size, &[]).is_err_and(|e| e.contains("raw")));
        let mut p = profile();
        p.image.size_bytes = 2 * M;
        p.image.data_ranges = Some(vec![run(M, M)]);
        assert_eq!(p.validate(), Ok(()));
        p.image.data_ranges = Some(vec![run(M, 2 * M)]);
        assert!(matches!(
            p.validate(),
            Err(DeployProfileError::BadDataRanges(_))
        ));
    }

    #[test]
    fn the_shipped_template_validates_and_renders_every_placeholder() {
        let p = profile();
        assert_eq!(p.validate(), Ok(()));
        let text = p
            .render_user_data(&UserDataVars {
                node_id: "node_1",
                join_token: "bcmj_x",
                control_plane_url: "http://cp:8080",
                bcd: None,
            })
            .expect("renders");
        assert!(text.contains("BCD_JOIN_TOKEN=bcmj_x\n"), "{text}");
        assert!(text.contains("BCD_API=http://cp:8080\n"), "{text}");
        assert!(text.contains("BCD_NODE=node_1\n"), "{text}");
        assert!(!text.contains("{{"), "{text}");
    }

    #[test]
    fn bad_profiles_are_refused_with_the_reason() {
        type Change = fn(&mut DeployProfile);
        let cases: Vec<(Change, DeployProfileError)> = vec![
            (
                |p| p.id = "Ubuntu".into(),
                DeployProfileError::BadId("Ubuntu".into()),
            ),
            (|p| p.version = 0, DeployProfileError::BadVersion),
            (
                |p| p.image.url = "file:///etc/passwd".into(),
                DeployProfileError::BadImageUrl("file:///etc/passwd".into()),
            ),
            (
                |p| p.image.url = "http://[".into(),
                DeployProfileError::BadImageUrl("http://[".into()),
            ),
            (
                |p| p.image.url = "https://user:pw@images.local/x.raw".into(),
                DeployProfileError::BadImageUrl("https://user:pw@images.local/x.raw".into()),
            ),
            (
                |p| p.image.sha256 = "ABC".into(),
                DeployProfileError::BadSha256,
            ),
            (|p| p.image.size_bytes = 0, DeployProfileError::BadSize),
            (
                |p| p.user_data = "{{ joinToken }} {{ controlPlaneUrl }} {{ password }}".into(),
                DeployProfileError::UnknownPlaceholder("password".into()),
            ),
            (
                |p| p.user_data = "{{ joinToken }} {{ controlPlaneUrl".into(),
                DeployProfileError::UnclosedPlaceholder,
            ),
            (
                |p| p.user_data = "#cloud-config\n{{ controlPlaneUrl }}".into(),
                DeployProfileError::MissingPlaceholder("joinToken"),
            ),
        ];
        for (change, want) in cases {
            let mut p = profile();
            change(&mut p);
            assert_eq!(p.validate(), Err(want));
        }
    }

    #[test]
    fn role_defaults_to_host() {
        let mut v = serde_json::to_value(profile()).expect("json");
        v.as_object_mut().expect("object").remove("role");
        let p: DeployProfile = serde_json::from_value(v).expect("parses");
        assert_eq!(p.role, DeployRole::Host);
    }
}
