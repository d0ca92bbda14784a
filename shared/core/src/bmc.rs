//! BMC rules that are data: a node's TLS policy for its Redfish endpoint,
//! what a BMC password may be (for rotation), and the one spelling of a
//! BMC address (so one BMC cannot be enrolled twice under two spellings).
//! Pure; the bmc service applies them, the API validates them before
//! anything is stored.

use serde::{Deserialize, Serialize};

use crate::BmcDriver;

/// How the bmc service checks a Redfish BMC's TLS certificate, per node.
/// Without one, the service's own setting applies (system roots, its CA, or
/// insecure when its configuration says so).
#[derive(
    Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema, schemars::JsonSchema,
)]
#[serde(tag = "mode", rename_all = "kebab-case", deny_unknown_fields)]
pub enum BmcTls {
    /// Verify the chain against this CA (PEM) instead of the system roots.
    Ca {
        #[serde(rename = "caPem")]
        #[schema(
            max_length = 65536,
            pattern = "-----BEGIN CERTIFICATE-----[\\s\\S]*-----END CERTIFICATE-----"
        )]
        ca_pem: String,
    },
    /// Accept exactly the certificate with this SHA-256 fingerprint (hex,
    /// colons allowed), whoever signed it: the usual answer to a BMC's
    /// self-signed factory certificate.
    Pinned {
        #[schema(pattern = "^([0-9A-Fa-f]{64}|[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){31})$")]
        sha256: String,
    },
    /// Accept any certificate. Only for a lab; it is recorded on the node.
    // A struct variant, so that serde refuses unknown fields beside the tag
    // as it does for the others (it ignores them for a unit variant).
    Insecure {},
}

/// The longest CA bundle accepted.
pub const MAX_CA_PEM: usize = 64 * 1024;

impl BmcTls {
    /// Checks the policy's shape (what the schema's patterns say) and
    /// normalizes a fingerprint to lowercase hex without separators.
    pub fn normalized(self) -> Result<Self, String> {
        match self {
            BmcTls::Ca { ca_pem } => {
                let begin = ca_pem.find("-----BEGIN CERTIFICATE-----");
                let end = ca_pem.rfind("-----END CERTIFICATE-----");
                let ordered = matches!((begin, end), (Some(b), Some(e)) if b + 27 <= e);
                if ca_pem.chars().count() > MAX_CA_PEM || !ordered {
                    return Err(format!(
                        "bmc.tls.caPem must be PEM certificates (at most {MAX_CA_PEM} characters)"
                    ));
                }
                Ok(BmcTls::Ca { ca_pem })
            }
            BmcTls::Pinned { sha256 } => {
                let bytes = sha256.as_bytes();
                let plain = bytes.len() == 64 && bytes.iter().all(u8::is_ascii_hexdigit);
                let colons = bytes.len() == 95
                    && bytes.chunks(3).all(|c| {
                        c[0].is_ascii_hexdigit()
                            && c[1].is_ascii_hexdigit()
                            && c.get(2).is_none_or(|s| *s == b':')
                    });
                if !(plain || colons) {
                    return Err(
                        "bmc.tls.sha256 must be a SHA-256 fingerprint: 64 hex digits, or 32 pairs joined by colons"
                            .into(),
                    );
                }
                Ok(BmcTls::Pinned {
                    sha256: sha256.replace(':', "").to_ascii_lowercase(),
                })
            }
            BmcTls::Insecure {} => Ok(BmcTls::Insecure {}),
        }
    }

    /// Whether a policy applies to `driver`: only Redfish speaks TLS.
    pub fn applies_to(driver: BmcDriver) -> bool {
        driver == BmcDriver::Redfish
    }

    /// The mode's wire name, for views.
    pub fn mode(&self) -> &'static str {
        match self {
            BmcTls::Ca { .. } => "ca",
            BmcTls::Pinned { .. } => "pinned",
            BmcTls::Insecure {} => "insecure",
        }
    }
}

/// Characters a rotated BMC password may use besides letters and digits:
/// none of them is whitespace, a quote or a comment sign, so the password
/// passes unchanged through IPMI tools and vendor shells.
pub const PASSWORD_SYMBOLS: &str = "-_.!@%+=,^~";

/// The same symbols as a regular-expression character class's content
/// (the `-` last, so it is literal).
pub const PASSWORD_SYMBOLS_CLASS: &str = "_.!@%+=,^~-";

/// The shortest password a rotation sets.
pub const MIN_PASSWORD: usize = 12;

/// The longest password a rotation sets with any driver.
pub const MAX_PASSWORD: usize = 64;

/// The longest password a rotation sets with `driver`: IPMI 2.0 stores 20
/// bytes; Redfish services commonly cap near 127 (we stay well under).
pub const fn max_password(driver: BmcDriver) -> usize {
    match driver {
        BmcDriver::Ipmi => 20,
        // A plugin refuses what its BMC cannot store.
        BmcDriver::Redfish | BmcDriver::Sim | BmcDriver::Plugin(_) => MAX_PASSWORD,
        BmcDriver::None => 0,
    }
}

/// Why a password a caller chose cannot be set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PasswordError {
    /// Not a password of the published rule (any driver).
    #[error("{0}")]
    Shape(String),
    /// A password of the rule that this node's driver cannot store.
    #[error("password must be {MIN_PASSWORD}-{max} characters for the {driver} driver")]
    TooLongFor { driver: BmcDriver, max: usize },
}

/// Checks a password a caller chose for a rotation: the rule the API
/// publishes (length, characters, classes), then what `driver` can store.
pub fn check_password(driver: BmcDriver, password: &str) -> Result<(), PasswordError> {
    check_password_rule(password)?;
    let max = max_password(driver);
    if password.chars().count() > max {
        return Err(PasswordError::TooLongFor { driver, max });
    }
    Ok(())
}

/// Checks a password against the rule the API publishes, whatever the
/// node: what a request is refused for before any node is looked up.
pub fn check_password_rule(password: &str) -> Result<(), PasswordError> {
    let n = password.chars().count();
    if !(MIN_PASSWORD..=MAX_PASSWORD).contains(&n) {
        return Err(PasswordError::Shape(format!(
            "password must be {MIN_PASSWORD}-{MAX_PASSWORD} characters"
        )));
    }
    if !password
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || PASSWORD_SYMBOLS.contains(c))
    {
        return Err(PasswordError::Shape(format!(
            "password may use letters, digits and {PASSWORD_SYMBOLS:?} only"
        )));
    }
    let classes = [
        password.chars().any(|c| c.is_ascii_lowercase()),
        password.chars().any(|c| c.is_ascii_uppercase()),
        password.chars().any(|c| c.is_ascii_digit()),
    ];
    if classes.iter().any(|has| !has) {
        return Err(PasswordError::Shape(
            "password needs a lowercase letter, an uppercase letter and a digit".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinned_fingerprints_are_normalized_and_checked() {
        let colons = "AB:".repeat(31) + "AB";
        let t = BmcTls::Pinned { sha256: colons }
            .normalized()
            .expect("valid");
        assert_eq!(
            t,
            BmcTls::Pinned {
                sha256: "ab".repeat(32)
            }
        );
        assert!(BmcTls::Pinned {
            sha256: "ab".repeat(31)
        }
        .normalized()
        .is_err());
        assert!(BmcTls::Pinned {
            sha256: "zz".repeat(32)
        }
        .normalized()
        .is_err());
    }

    #[test]
    fn every_tls_policy_refuses_unknown_fields() {
        for json in [
            r#"{"mode":"insecure","x":1}"#,
            r#"{"mode":"pinned","sha256":"ab","x":1}"#,
            r#"{"mode":"ca","caPem":"p","x":1}"#,
        ] {
            assert!(serde_json::from_str::<BmcTls>(json).is_err(), "{json}");
        }
        let insecure: BmcTls = serde_json::from_str(r#"{"mode":"insecure"}"#).expect("insecure");
        assert_eq!(insecure, BmcTls::Insecure {});
        assert_eq!(
            serde_json::to_string(&insecure).expect("json"),
            r#"{"mode":"insecure"}"#
        );
    }

    #[test]
    fn tls_is_for_redfish_only_and_a_ca_must_be_pem() {
        assert!(!BmcTls::applies_to(BmcDriver::Ipmi) && BmcTls::applies_to(BmcDriver::Redfish));
        // A fingerprint whose colons are not between pairs is not one.
        assert!(BmcTls::Pinned {
            sha256: format!(":{}", "ab".repeat(32))
        }
        .normalized()
        .is_err());
        let backwards = "-----END CERTIFICATE-----\n-----BEGIN CERTIFICATE-----\n";
        assert!(BmcTls::Ca {
            ca_pem: backwards.into()
        }
        .normalized()
        .is_err());
        assert!(BmcTls::Ca {
            ca_pem: "not pem".into()
        }
        .normalized()
        .is_err());
        let pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        assert!(BmcTls::Ca { ca_pem: pem.into() }.normalized().is_ok());
    }

    #[test]
    fn passwords_follow_the_drivers_limits_and_the_character_set() {
        assert!(check_password(BmcDriver::Ipmi, "Abcdefgh1234").is_ok());
        assert_eq!(
            check_password(BmcDriver::Ipmi, "Abcdefgh1234567890123"),
            Err(PasswordError::TooLongFor {
                driver: BmcDriver::Ipmi,
                max: 20
            })
        );
        assert!(check_password(BmcDriver::Redfish, "Abcdefgh1234567890123").is_ok());
        assert!(check_password(BmcDriver::Redfish, "Abc def gh1234").is_err());
        assert!(check_password(BmcDriver::Redfish, "Abcdefgh#1234").is_err());
        assert!(check_password(BmcDriver::Redfish, "abcdefgh1234").is_err());
        assert!(check_password(BmcDriver::Redfish, "Abc1").is_err());
    }
}

/// The one spelling of a BMC address, stored at enroll and checked for
/// uniqueness within a site, or why it is not an address of `driver`.
///
/// - Redfish: `http(s)://host[:port][/redfish/v1/Systems/<id>]` with the
///   scheme and host lower-cased (IPv6 as `[…]`), the scheme's default port
///   dropped, no trailing `/`; credentials, a query or a fragment in the
///   address are refused (a password does not belong in an address).
/// - IPMI: `ipmi://host:port` (623 when absent), host lower-cased.
/// - `sim` and `none`: the address as given, trimmed.
pub fn canonical_address(driver: BmcDriver, address: &str) -> Result<String, String> {
    let address = address.trim();
    match driver {
        BmcDriver::Redfish => canonical_redfish(address),
        BmcDriver::Ipmi => canonical_ipmi(address),
        BmcDriver::Sim | BmcDriver::None => Ok(address.to_owned()),
        BmcDriver::Plugin(_) => canonical_plugin(address),
    }
}

/// A plugin's BMC address is its own to read; it must be one visible,
/// unspaced token of at most 255 characters.
fn canonical_plugin(address: &str) -> Result<String, String> {
    if address.is_empty()
        || address.len() > 255
        || address.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(format!(
            "bmc.address {:?}: a plugin driver's address is 1-255 characters without spaces",
            address.chars().take(64).collect::<String>()
        ));
    }
    Ok(address.to_owned())
}

fn canonical_redfish(address: &str) -> Result<String, String> {
    let bad = |why: &str| format!("bmc.address {address:?}: {why}");
    let url = url::Url::parse(address).map_err(|e| bad(&e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(bad(
            "a Redfish address is http(s)://host[:port][/redfish/v1/Systems/<id>]",
        ));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(bad(
            "credentials belong in bmc.username and bmc.password, not the address",
        ));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(bad("a query or fragment is not part of a BMC address"));
    }
    let host = match url.host() {
        Some(url::Host::Domain(d)) => d.to_ascii_lowercase(),
        Some(url::Host::Ipv4(ip)) => ip.to_string(),
        Some(url::Host::Ipv6(ip)) => format!("[{ip}]"),
        None => return Err(bad("no host")),
    };
    // `url` already drops the scheme's default port.
    let port = url.port().map(|p| format!(":{p}")).unwrap_or_default();
    let path = url.path().trim_end_matches('/');
    if !path.is_empty() && !path.starts_with("/redfish/v1/Systems/") {
        return Err(bad("a path must name a system (/redfish/v1/Systems/<id>)"));
    }
    Ok(format!("{}://{host}{port}{path}", url.scheme()))
}

fn canonical_ipmi(address: &str) -> Result<String, String> {
    let bad = |why: &str| format!("bmc.address {address:?}: {why}");
    let rest = address.strip_prefix("ipmi://").unwrap_or(address);
    // Parsed as a URL authority, so `[v6]:port` and a port check come free.
    let url = url::Url::parse(&format!("ipmi://{rest}")).map_err(|e| bad(&e.to_string()))?;
    if !url.username().is_empty() || url.password().is_some() {
        return Err(bad(
            "credentials belong in bmc.username and bmc.password, not the address",
        ));
    }
    if !matches!(url.path(), "" | "/") || url.query().is_some() || url.fragment().is_some() {
        return Err(bad("an IPMI address is host[:port]"));
    }
    let host = match url.host() {
        Some(url::Host::Domain(d)) => d.to_ascii_lowercase(),
        Some(url::Host::Ipv4(ip)) => ip.to_string(),
        Some(url::Host::Ipv6(ip)) => format!("[{ip}]"),
        None => return Err(bad("no host")),
    };
    Ok(format!("ipmi://{host}:{}", url.port().unwrap_or(623)))
}

#[cfg(test)]
mod address_tests {
    use super::*;

    #[test]
    fn equivalent_spellings_are_one_address() {
        let one = |a: &str| canonical_address(BmcDriver::Redfish, a).expect(a);
        let want = "https://bmc-7.example";
        for a in [
            "https://bmc-7.example",
            "HTTPS://BMC-7.Example/",
            "https://bmc-7.example:443",
            " https://bmc-7.example:443/ ",
        ] {
            assert_eq!(one(a), want, "{a}");
        }
        assert_eq!(one("http://10.0.0.5:80/"), "http://10.0.0.5");
        assert_eq!(one("https://10.0.0.5:8443"), "https://10.0.0.5:8443");
        assert_eq!(one("https://[0:0::1]/"), "https://[::1]");
        assert_eq!(
            one("https://10.0.0.5/redfish/v1/Systems/Blade-1/"),
            "https://10.0.0.5/redfish/v1/Systems/Blade-1"
        );
        // Distinct systems of one chassis stay distinct.
        assert_ne!(
            one("https://10.0.0.5/redfish/v1/Systems/1"),
            one("https://10.0.0.5/redfish/v1/Systems/2")
        );
        let ipmi = |a: &str| canonical_address(BmcDriver::Ipmi, a).expect(a);
        assert_eq!(ipmi("10.0.0.9"), "ipmi://10.0.0.9:623");
        assert_eq!(ipmi("ipmi://10.0.0.9:623"), "ipmi://10.0.0.9:623");
        assert_eq!(ipmi("BMC.example:6230"), "ipmi://bmc.example:6230");
        assert_eq!(ipmi("[::1]:9001"), "ipmi://[::1]:9001");
    }

    #[test]
    fn what_is_not_an_address_is_refused() {
        for a in [
            "",
            "ftp://10.0.0.5",
            "https://admin:pw@10.0.0.5",
            "https://10.0.0.5/?x=1",
            "https://10.0.0.5/#x",
            "https://10.0.0.5/elsewhere",
            "not a url",
        ] {
            assert!(canonical_address(BmcDriver::Redfish, a).is_err(), "{a:?}");
        }
        for a in ["", "admin:pw@10.0.0.9", "10.0.0.9:99999", "10.0.0.9/x"] {
            assert!(canonical_address(BmcDriver::Ipmi, a).is_err(), "{a:?}");
        }
    }
}
