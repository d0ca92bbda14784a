//! Erase methods and the pool policy that says which of them satisfy
//! `secure-erase` and `crypto-erase`.
//!
//! A wipe of mode `secure-erase` or `crypto-erase` is carried out on each
//! disk by the first method of the pool's list for that mode that the disk
//! can do: the device's own erase (NVMe sanitize or format, ATA security
//! erase, SCSI sanitize) where it has one, else — when the pool admits it —
//! a full overwrite verified by reading every byte back. The result names
//! the method actually used, and the control plane accepts it only when
//! the pool admits that method for the mode: nothing is ever silently
//! downgraded. Pure data and rules; `bcd` does the erasing.

use serde::{Deserialize, Serialize};

use crate::node::WipeMode;

crate::wire_enum! {
    /// How a disk was (or may be) erased.
    pub enum EraseMethod "erase method" {
        /// Zeroes at both ends and the secondary superblocks (`quick`).
        Quick = "quick",
        /// NVMe Sanitize, block erase.
        NvmeSanitizeBlock = "nvme-sanitize-block",
        /// NVMe Sanitize, crypto erase.
        NvmeSanitizeCrypto = "nvme-sanitize-crypto",
        /// NVMe Format NVM, Secure Erase Settings 1 (user data erase).
        NvmeFormat = "nvme-format",
        /// NVMe Format NVM, Secure Erase Settings 2 (cryptographic erase).
        NvmeCryptoFormat = "nvme-crypto-format",
        /// ATA SECURITY ERASE UNIT, enhanced mode.
        AtaEnhancedSecurityErase = "ata-enhanced-security-erase",
        /// ATA SECURITY ERASE UNIT, normal mode.
        AtaSecurityErase = "ata-security-erase",
        /// SCSI SANITIZE, block erase.
        ScsiSanitizeBlock = "scsi-sanitize-block",
        /// SCSI SANITIZE, cryptographic erase.
        ScsiSanitizeCrypto = "scsi-sanitize-crypto",
        /// SCSI SANITIZE, overwrite.
        ScsiSanitizeOverwrite = "scsi-sanitize-overwrite",
        /// Every byte written with zeros by the agent, then every byte read
        /// back: for disks that offer no erase of their own (virtio, loop).
        OverwriteVerified = "overwrite-verified",
    }
}

/// The command family a device erase speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EraseFamily {
    Nvme,
    Ata,
    Scsi,
    /// The agent's own writes: any disk.
    Overwrite,
    /// Not a full erase.
    Partial,
}

impl EraseMethod {
    /// Which command family carries it out (which disks can do it).
    pub const fn family(self) -> EraseFamily {
        use EraseMethod::*;
        match self {
            Quick => EraseFamily::Partial,
            NvmeSanitizeBlock | NvmeSanitizeCrypto | NvmeFormat | NvmeCryptoFormat => {
                EraseFamily::Nvme
            }
            AtaEnhancedSecurityErase | AtaSecurityErase => EraseFamily::Ata,
            ScsiSanitizeBlock | ScsiSanitizeCrypto | ScsiSanitizeOverwrite => EraseFamily::Scsi,
            OverwriteVerified => EraseFamily::Overwrite,
        }
    }

    /// Whether the method leaves every user-data block erased (all but
    /// `quick`).
    pub const fn is_full(self) -> bool {
        !matches!(self, EraseMethod::Quick)
    }
}

/// `policy.eraseMethods` of a pool: the methods that satisfy each device
/// erase mode, in the order they are tried on each disk.
#[derive(
    Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema, utoipa::ToSchema,
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ErasePolicy {
    #[schema(schema_with = method_list_schema)]
    pub secure_erase: Vec<EraseMethod>,
    #[schema(schema_with = method_list_schema)]
    pub crypto_erase: Vec<EraseMethod>,
}

/// The OpenAPI schema of one of the policy's lists, saying what
/// [`ErasePolicy::validate`] checks: at least one method, each once, never
/// `quick`.
fn method_list_schema() -> utoipa::openapi::schema::Array {
    use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, Type};
    let full: Vec<&'static str> = EraseMethod::ALL
        .iter()
        .filter(|m| m.is_full())
        .map(|m| m.as_str())
        .collect();
    ArrayBuilder::new()
        .items(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .enum_values(Some(full)),
        )
        .min_items(Some(1))
        .unique_items(true)
        .description(Some(
            "The methods that satisfy the mode, in the order they are tried on each disk.",
        ))
        .build()
}

impl Default for ErasePolicy {
    /// The device's own erase first (sanitize before format, enhanced
    /// before normal), then a verified full overwrite, so that every disk
    /// kind can be released and retired; a pool that wants key
    /// destruction and nothing else drops `overwrite-verified` from
    /// `cryptoErase`.
    fn default() -> Self {
        use EraseMethod::*;
        Self {
            secure_erase: vec![
                NvmeSanitizeBlock,
                NvmeFormat,
                AtaEnhancedSecurityErase,
                AtaSecurityErase,
                ScsiSanitizeBlock,
                ScsiSanitizeOverwrite,
                OverwriteVerified,
            ],
            crypto_erase: vec![
                NvmeSanitizeCrypto,
                NvmeCryptoFormat,
                ScsiSanitizeCrypto,
                OverwriteVerified,
            ],
        }
    }
}

impl ErasePolicy {
    /// The methods that satisfy `mode`, in order; `quick` is its own
    /// method, and `none` has none.
    pub fn for_mode(&self, mode: WipeMode) -> Vec<EraseMethod> {
        match mode {
            WipeMode::None => vec![],
            WipeMode::Quick => vec![EraseMethod::Quick],
            WipeMode::SecureErase => self.secure_erase.clone(),
            WipeMode::CryptoErase => self.crypto_erase.clone(),
        }
    }

    /// Refuses a policy a wipe could not keep: an empty list, `quick`
    /// standing in for a device erase, a method named twice.
    pub fn validate(&self) -> Result<(), String> {
        for (name, list) in [
            ("secureErase", &self.secure_erase),
            ("cryptoErase", &self.crypto_erase),
        ] {
            if list.is_empty() {
                return Err(format!(
                    "eraseMethods.{name} is empty: no disk could ever satisfy it"
                ));
            }
            if list.contains(&EraseMethod::Quick) {
                return Err(format!(
                    "eraseMethods.{name} names quick, which erases only both ends of a disk"
                ));
            }
            let mut seen = std::collections::BTreeSet::new();
            if let Some(twice) = list.iter().find(|m| !seen.insert(**m)) {
                return Err(format!("eraseMethods.{name} names {twice} twice"));
            }
        }
        Ok(())
    }
}

/// The methods of `admitted` a disk whose commands are `disk` can try, in
/// order: its own family's, and a verified overwrite, which any disk can
/// do (`disk` is `Overwrite` for disks with no erase command: virtio,
/// loop, files).
pub fn candidates(admitted: &[EraseMethod], disk: EraseFamily) -> Vec<EraseMethod> {
    admitted
        .iter()
        .copied()
        .filter(|m| {
            let f = m.family();
            f == EraseFamily::Overwrite || f == EraseFamily::Partial || f == disk
        })
        .collect()
}

/// Why a reported erase does not satisfy the mode it was asked for.
pub fn judge_method(
    mode: WipeMode,
    admitted: &[EraseMethod],
    used: Option<EraseMethod>,
) -> Result<(), String> {
    if matches!(mode, WipeMode::None | WipeMode::Quick) {
        return Ok(());
    }
    match used {
        None => Err(format!(
            "the agent did not report which method carried out {mode}"
        )),
        Some(m) if admitted.contains(&m) => Ok(()),
        Some(m) => Err(format!(
            "{m} does not satisfy {mode} under the pool's policy (it admits {})",
            admitted
                .iter()
                .map(|m| m.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use EraseMethod::*;

    #[test]
    fn the_default_policy_is_valid_and_ends_in_a_verified_overwrite() {
        let p = ErasePolicy::default();
        assert_eq!(p.validate(), Ok(()));
        assert_eq!(p.secure_erase.last(), Some(&OverwriteVerified));
        assert_eq!(p.crypto_erase.last(), Some(&OverwriteVerified));
        assert!(p.crypto_erase.iter().all(|m| m.is_full()));
        assert_eq!(p.for_mode(WipeMode::Quick), vec![Quick]);
        assert!(p.for_mode(WipeMode::None).is_empty());
    }

    #[test]
    fn a_policy_a_wipe_could_not_keep_is_refused() {
        let empty = ErasePolicy {
            secure_erase: vec![],
            ..Default::default()
        };
        assert!(empty
            .validate()
            .expect_err("refused")
            .contains("secureErase is empty"));
        let quick = ErasePolicy {
            crypto_erase: vec![NvmeCryptoFormat, Quick],
            ..Default::default()
        };
        assert!(quick
            .validate()
            .expect_err("refused")
            .contains("names quick"));
        let twice = ErasePolicy {
            crypto_erase: vec![NvmeCryptoFormat, NvmeCryptoFormat],
            ..Default::default()
        };
        assert!(twice.validate().expect_err("refused").contains("twice"));
        let garbage = serde_json::from_value::<ErasePolicy>(
            serde_json::json!({"secureErase": ["shred"], "cryptoErase": []}),
        );
        assert!(garbage.is_err());
    }

    #[test]
    fn a_reported_method_satisfies_only_what_the_pool_admits() {
        let strict = [NvmeCryptoFormat];
        assert_eq!(
            judge_method(WipeMode::CryptoErase, &strict, Some(NvmeCryptoFormat)),
            Ok(())
        );
        let why = judge_method(WipeMode::CryptoErase, &strict, Some(OverwriteVerified))
            .expect_err("refused");
        assert!(
            why.starts_with("overwrite-verified does not satisfy crypto-erase")
                && why.contains("nvme-crypto-format"),
            "{why}"
        );
        assert!(judge_method(WipeMode::SecureErase, &strict, None).is_err());
        assert_eq!(judge_method(WipeMode::Quick, &[], None), Ok(()));
    }

    #[test]
    fn a_disk_tries_its_own_familys_methods_and_the_overwrite_in_order() {
        let p = ErasePolicy::default();
        assert_eq!(
            candidates(&p.secure_erase, EraseFamily::Ata),
            vec![
                AtaEnhancedSecurityErase,
                AtaSecurityErase,
                OverwriteVerified
            ]
        );
        assert_eq!(
            candidates(&p.crypto_erase, EraseFamily::Overwrite),
            vec![OverwriteVerified]
        );
        let strict = [NvmeSanitizeCrypto, NvmeCryptoFormat];
        assert!(candidates(&strict, EraseFamily::Scsi).is_empty());
        assert_eq!(candidates(&[Quick], EraseFamily::Nvme), vec![Quick]);
    }

    #[test]
    fn every_method_has_a_family() {
        for m in EraseMethod::ALL {
            let f = m.family();
            assert_eq!(f == EraseFamily::Partial, !m.is_full(), "{m}");
        }
    }
}
