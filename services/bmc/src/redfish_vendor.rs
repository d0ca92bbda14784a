//! Per-vendor Redfish quirks, as data: which vendor a BMC is (from the
//! service root's `Vendor` or `Oem` keys, else the system's
//! `Manufacturer`), and the few rules where that vendor's BMC needs more
//! than the standard. The driver asks [`Vendor::quirks`]; nothing else in
//! the driver tests a vendor.

/// A BMC's vendor, as far as the driver cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Vendor {
    Dell,
    Hpe,
    Supermicro,
    Lenovo,
    /// DMTF's own shapes, sushy-tools, OpenBMC and anyone else: the
    /// standard alone.
    Other,
}

/// What a vendor's BMC needs beyond the standard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quirks {
    /// A boot override PATCH carries `BootSourceOverrideMode` (the current
    /// mode when the caller names none): Supermicro's BMC resets an
    /// omitted mode to Legacy, which a UEFI machine cannot PXE-boot.
    pub boot_patch_keeps_mode: bool,
    /// A PATCH carries `If-Match` with the resource's ETag: HPE iLO 5/6 and
    /// Lenovo XCC answer `428 Precondition Required` without it on some
    /// firmware (the standard allows it everywhere).
    pub patch_if_match: bool,
    /// NICs may be only under the chassis' `NetworkAdapters`, with the
    /// system's `EthernetInterfaces` empty (iDRAC 9): read for the log; the
    /// driver walks the adapters for every vendor.
    pub nics_under_adapters: bool,
}

const STANDARD: Quirks = Quirks {
    boot_patch_keeps_mode: false,
    patch_if_match: false,
    nics_under_adapters: false,
};

impl Vendor {
    /// The vendor, from the service root's `Vendor` (Redfish 1.5+), else
    /// its `Oem` keys, else the system's `Manufacturer`.
    pub fn detect(
        root_vendor: Option<&str>,
        root_oem_keys: &[&str],
        manufacturer: Option<&str>,
    ) -> Vendor {
        let named = |s: &str| {
            let s = s.to_ascii_lowercase();
            if s.starts_with("dell") {
                Some(Vendor::Dell)
            } else if s == "hpe" || s == "hp" || s.starts_with("hewlett") {
                Some(Vendor::Hpe)
            } else if s.starts_with("supermicro") || s.starts_with("super micro") {
                Some(Vendor::Supermicro)
            } else if s.starts_with("lenovo") {
                Some(Vendor::Lenovo)
            } else {
                None
            }
        };
        root_vendor
            .and_then(named)
            .or_else(|| root_oem_keys.iter().find_map(|k| named(k)))
            .or_else(|| manufacturer.and_then(named))
            .unwrap_or(Vendor::Other)
    }

    /// The vendor's quirks.
    pub const fn quirks(self) -> Quirks {
        match self {
            Vendor::Dell => Quirks {
                nics_under_adapters: true,
                ..STANDARD
            },
            Vendor::Hpe | Vendor::Lenovo => Quirks {
                patch_if_match: true,
                ..STANDARD
            },
            Vendor::Supermicro => Quirks {
                boot_patch_keeps_mode: true,
                ..STANDARD
            },
            Vendor::Other => STANDARD,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vendor_comes_from_the_root_then_its_oem_then_the_system() {
        let cases = [
            (Some("Dell"), &[][..], None, Vendor::Dell),
            (Some("HPE"), &[], None, Vendor::Hpe),
            (None, &["Hpe"][..], None, Vendor::Hpe),
            (None, &["Hp"][..], Some("HPE"), Vendor::Hpe),
            (None, &["Supermicro"][..], None, Vendor::Supermicro),
            (None, &[], Some("Lenovo"), Vendor::Lenovo),
            (None, &[], Some("Dell Inc."), Vendor::Dell),
            (None, &[], Some("Supermicro"), Vendor::Supermicro),
            (
                Some("Contoso"),
                &["Contoso"][..],
                Some("Contoso"),
                Vendor::Other,
            ),
            (None, &[], None, Vendor::Other),
        ];
        for (root, oem, manufacturer, want) in cases {
            assert_eq!(
                Vendor::detect(root, oem, manufacturer),
                want,
                "{root:?} {oem:?} {manufacturer:?}"
            );
        }
    }

    #[test]
    fn only_the_vendors_that_need_a_rule_have_one() {
        assert_eq!(Vendor::Other.quirks(), STANDARD);
        assert!(Vendor::Supermicro.quirks().boot_patch_keeps_mode);
        assert!(Vendor::Hpe.quirks().patch_if_match && Vendor::Lenovo.quirks().patch_if_match);
        assert!(
            !Vendor::Dell.quirks().patch_if_match && !Vendor::Dell.quirks().boot_patch_keeps_mode
        );
    }
}
