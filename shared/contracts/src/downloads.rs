//! Where the API serves what machines download: the path a `bcdUrl` in
//! rendered user data points at, relative to the control plane's URL.

/// The download the installed OS's user data names: `bcd` for
/// `linux-amd64` (inventory reports no architecture yet).
pub const INSTALLED_OS_BCD: (&str, &str, &str) = ("bcd", "linux", "amd64");

/// `/api/compute/downloads/{name}/{version}/{os}-{arch}`; the same path
/// with `.sha256` appended serves the file's digest.
pub fn path(name: &str, version: &str, os: &str, arch: &str) -> String {
    format!("/api/compute/downloads/{name}/{version}/{os}-{arch}")
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_path_names_version_and_platform() {
        assert_eq!(
            super::path("bcd", "0.3.0", "linux", "amd64"),
            "/api/compute/downloads/bcd/0.3.0/linux-amd64"
        );
    }
}
