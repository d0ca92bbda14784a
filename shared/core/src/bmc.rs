//! BMC rules that are data: a node's TLS policy for its Redfish endpoint and
//! what a BMC password may be (for rotation). Pure; the bmc service applies
//! them, the API validates them before anything is stored.

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
        ca_pem: String,
    },
    /// Accept exactly the certificate with this SHA-256 fingerprint (hex,
    /// colons allowed), whoever signed it: the usual answer to a BMC's
    /// self-signed factory certificate.
    Pinned { sha256: String },
    /// Accept any certificate. Only for a lab; it is recorded on the node.
    Insecure,
}

/// The longest CA bundle accepted.
pub const MAX_CA_PEM: usize = 64 * 1024;

impl BmcTls {
    /// Checks the policy's shape and normalizes a fingerprint to lowercase
    /// hex without separators.
    pub fn validated(self, driver: BmcDriver) -> Result<Self, String> {
        if driver != BmcDriver::Redfish {
            return Err(format!(
                "bmc.tls applies to the redfish driver only, not {driver}"
            ));
        }
        match self {
            BmcTls::Ca { ca_pem } => {
                if ca_pem.len() > MAX_CA_PEM
                    || !ca_pem.contains("-----BEGIN CERTIFICATE-----")
                    || !ca_pem.contains("-----END CERTIFICATE-----")
                {
                    return Err(format!(
                        "bmc.tls.caPem must be PEM certificates (at most {MAX_CA_PEM} bytes)"
                    ));
                }
                Ok(BmcTls::Ca { ca_pem })
            }
            BmcTls::Pinned { sha256 } => {
                let hex: String = sha256
                    .chars()
                    .filter(|c| *c != ':')
                    .map(|c| c.to_ascii_lowercase())
                    .collect();
                if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(
                        "bmc.tls.sha256 must be a SHA-256 fingerprint: 64 hex digits, colons allowed"
                            .into(),
                    );
                }
                Ok(BmcTls::Pinned { sha256: hex })
            }
            BmcTls::Insecure => Ok(BmcTls::Insecure),
        }
    }

    /// The mode's wire name, for views.
    pub fn mode(&self) -> &'static str {
        match self {
            BmcTls::Ca { .. } => "ca",
            BmcTls::Pinned { .. } => "pinned",
            BmcTls::Insecure => "insecure",
        }
    }
}

/// Characters a rotated BMC password may use besides letters and digits:
/// none of them is whitespace, a quote or a comment sign, so the password
/// passes unchanged through IPMI tools and vendor shells.
pub const PASSWORD_SYMBOLS: &str = "-_.!@%+=,^~";

/// The shortest password a rotation sets.
pub const MIN_PASSWORD: usize = 12;

/// The longest password a rotation sets with `driver`: IPMI 2.0 stores 20
/// bytes; Redfish services commonly cap near 127 (we stay well under).
pub const fn max_password(driver: BmcDriver) -> usize {
    match driver {
        BmcDriver::Ipmi => 20,
        BmcDriver::Redfish | BmcDriver::Sim => 64,
        BmcDriver::None => 0,
    }
}

/// Checks a password a caller chose for a rotation.
pub fn check_password(driver: BmcDriver, password: &str) -> Result<(), String> {
    let max = max_password(driver);
    let n = password.chars().count();
    if n < MIN_PASSWORD || n > max {
        return Err(format!(
            "password must be {MIN_PASSWORD}-{max} characters for the {driver} driver"
        ));
    }
    if !password
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || PASSWORD_SYMBOLS.contains(c))
    {
        return Err(format!(
            "password may use letters, digits and {PASSWORD_SYMBOLS:?} only"
        ));
    }
    let classes = [
        password.chars().any(|c| c.is_ascii_lowercase()),
        password.chars().any(|c| c.is_ascii_uppercase()),
        password.chars().any(|c| c.is_ascii_digit()),
    ];
    if classes.iter().any(|has| !has) {
        return Err("password needs a lowercase letter, an uppercase letter and a digit".into());
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
            .validated(BmcDriver::Redfish)
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
        .validated(BmcDriver::Redfish)
        .is_err());
        assert!(BmcTls::Pinned {
            sha256: "zz".repeat(32)
        }
        .validated(BmcDriver::Redfish)
        .is_err());
    }

    #[test]
    fn tls_is_for_redfish_only_and_a_ca_must_be_pem() {
        assert!(BmcTls::Insecure.validated(BmcDriver::Ipmi).is_err());
        assert!(BmcTls::Ca {
            ca_pem: "not pem".into()
        }
        .validated(BmcDriver::Redfish)
        .is_err());
        let pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        assert!(BmcTls::Ca { ca_pem: pem.into() }
            .validated(BmcDriver::Redfish)
            .is_ok());
    }

    #[test]
    fn passwords_follow_the_drivers_limits_and_the_character_set() {
        assert!(check_password(BmcDriver::Ipmi, "Abcdefgh1234").is_ok());
        assert!(check_password(BmcDriver::Ipmi, "Abcdefgh1234567890123").is_err());
        assert!(check_password(BmcDriver::Redfish, "Abcdefgh1234567890123").is_ok());
        assert!(check_password(BmcDriver::Redfish, "Abc def gh1234").is_err());
        assert!(check_password(BmcDriver::Redfish, "Abcdefgh#1234").is_err());
        assert!(check_password(BmcDriver::Redfish, "abcdefgh1234").is_err());
        assert!(check_password(BmcDriver::Redfish, "Abc1").is_err());
    }
}
