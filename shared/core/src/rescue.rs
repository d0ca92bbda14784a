//! Rescue access: the operator's SSH public key a rescue request carries,
//! checked here before anything is stored, and how it travels to the rescue
//! ramdisk (one kernel command-line word, `bcm.ssh=<type>:<blob>`, which the
//! ramdisk's `/init` writes to root's `authorized_keys`).
//!
//! Only public keys: a private key, a certificate or options
//! (`command=…` of an `authorized_keys` line) are refused, and so is a key
//! whose blob does not name its own type (a pasted mix-up).

use base64::Engine as _;
use sha2::{Digest, Sha256};

/// The key types the rescue ramdisk's SSH server (dropbear) accepts.
pub const KEY_TYPES: [&str; 5] = [
    "ssh-ed25519",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "ssh-rsa",
];

/// The longest key line accepted: an RSA-8192 key and a comment fit; the
/// kernel command line (2,048 bytes on x86) must still hold the rest.
pub const MAX_KEY_LINE: usize = 1_600;

/// An RSA key shorter than this is refused.
const MIN_RSA_BITS: usize = 2_048;

/// A checked SSH public key: its type and its blob (standard base64), the
/// comment dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SshPublicKey {
    pub kind: String,
    pub blob: String,
}

/// Why a key is refused (`INVALID_ARGUMENT` at the API).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RescueKeyError {
    #[error("sshPublicKey is empty")]
    Empty,
    #[error("sshPublicKey is longer than {MAX_KEY_LINE} characters")]
    TooLong,
    #[error("sshPublicKey must be one line of printable characters")]
    NotOneLine,
    #[error("sshPublicKey is a private key; give the public one (the .pub file)")]
    PrivateKey,
    #[error("sshPublicKey type {0:?} is not one of {types}", types = KEY_TYPES.join(", "))]
    UnknownType(String),
    #[error("sshPublicKey has no key data after its type")]
    NoBlob,
    #[error("sshPublicKey's key data is not base64")]
    NotBase64,
    #[error("sshPublicKey's key data is a {inner:?} key, not the {outer:?} its line names")]
    TypeMismatch { outer: String, inner: String },
    #[error("sshPublicKey is an RSA key of {0} bits; at least {MIN_RSA_BITS} are needed")]
    WeakRsa(usize),
}

/// Checks one `authorized_keys`-style line, `<type> <base64> [comment]`.
pub fn check_ssh_public_key(line: &str) -> Result<SshPublicKey, RescueKeyError> {
    let line = line.trim();
    if line.is_empty() {
        return Err(RescueKeyError::Empty);
    }
    if line.len() > MAX_KEY_LINE {
        return Err(RescueKeyError::TooLong);
    }
    if line.chars().any(char::is_control) {
        return Err(RescueKeyError::NotOneLine);
    }
    if line.contains("PRIVATE KEY") {
        return Err(RescueKeyError::PrivateKey);
    }
    let mut words = line.split_ascii_whitespace();
    let kind = words.next().ok_or(RescueKeyError::Empty)?;
    if !KEY_TYPES.contains(&kind) {
        return Err(RescueKeyError::UnknownType(kind.chars().take(64).collect()));
    }
    let blob = words.next().ok_or(RescueKeyError::NoBlob)?;
    let raw = base64::engine::general_purpose::STANDARD
        .decode(blob)
        .map_err(|_| RescueKeyError::NotBase64)?;
    let mut r = Reader(&raw);
    let inner = r.string().ok_or(RescueKeyError::NotBase64)?;
    if inner != kind.as_bytes() {
        return Err(RescueKeyError::TypeMismatch {
            outer: kind.to_owned(),
            inner: String::from_utf8_lossy(inner).chars().take(64).collect(),
        });
    }
    if kind == "ssh-rsa" {
        let _exponent = r.string().ok_or(RescueKeyError::NotBase64)?;
        let modulus = r.string().ok_or(RescueKeyError::NotBase64)?;
        let bits = mpint_bits(modulus);
        if bits < MIN_RSA_BITS {
            return Err(RescueKeyError::WeakRsa(bits));
        }
    } else if kind == "ssh-ed25519" {
        let key = r.string().ok_or(RescueKeyError::NotBase64)?;
        if key.len() != 32 {
            return Err(RescueKeyError::NotBase64);
        }
    }
    Ok(SshPublicKey {
        kind: kind.to_owned(),
        blob: blob.to_owned(),
    })
}

impl SshPublicKey {
    /// The kernel command-line word that hands the key to the rescue
    /// ramdisk (no spaces: `:` joins type and blob).
    pub fn cmdline_word(&self) -> String {
        format!("bcm.ssh={}:{}", self.kind, self.blob)
    }

    /// `<type> <blob>`, as stored and as `authorized_keys` holds it.
    pub fn line(&self) -> String {
        format!("{} {}", self.kind, self.blob)
    }

    /// OpenSSH's fingerprint, `SHA256:<unpadded base64>` (what `ssh-keygen
    /// -lf` prints and what the API shows).
    pub fn fingerprint(&self) -> String {
        let raw = base64::engine::general_purpose::STANDARD
            .decode(&self.blob)
            .unwrap_or_default();
        let digest = Sha256::digest(&raw);
        format!(
            "SHA256:{}",
            base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest)
        )
    }
}

/// Reads SSH wire strings (a big-endian u32 length, then the bytes).
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn string(&mut self) -> Option<&'a [u8]> {
        let len = u32::from_be_bytes(self.0.get(..4)?.try_into().ok()?) as usize;
        let s = self.0.get(4..4usize.checked_add(len)?)?;
        self.0 = &self.0[4 + len..];
        Some(s)
    }
}

/// The bit length of an SSH mpint (leading zero bytes ignored).
fn mpint_bits(m: &[u8]) -> usize {
    let m = match m.iter().position(|b| *b != 0) {
        Some(i) => &m[i..],
        None => return 0,
    };
    m.len() * 8 - m[0].leading_zeros() as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    // `ssh-keygen -t ed25519` output (a throwaway key).
    const ED25519: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKc5y4JN2j9/nyG9CpyH6Qn17rYLAS63UHxenvzq4/EY operator@example";

    fn wire(parts: &[&[u8]]) -> String {
        let mut out = vec![];
        for p in parts {
            out.extend_from_slice(&(p.len() as u32).to_be_bytes());
            out.extend_from_slice(p);
        }
        base64::engine::general_purpose::STANDARD.encode(out)
    }

    #[test]
    fn an_ed25519_key_is_accepted_without_its_comment() {
        let k = check_ssh_public_key(ED25519).expect("valid");
        assert_eq!(k.kind, "ssh-ed25519");
        assert!(!k.line().contains("operator@example"));
        assert!(k.cmdline_word().starts_with("bcm.ssh=ssh-ed25519:AAAA"));
        assert!(!k.cmdline_word().contains(' '));
        // What `ssh-keygen -lf` prints for it.
        assert_eq!(
            k.fingerprint(),
            "SHA256:3eNqcQ3ybzEs8wfxpsIBLEeiQSijZoXHkt0D84Msu0M"
        );
    }

    #[test]
    fn garbage_is_refused_with_its_reason() {
        type Expect = fn(&RescueKeyError) -> bool;
        let cases: Vec<(String, Expect)> = vec![
            ("".into(), |e| *e == RescueKeyError::Empty),
            ("   ".into(), |e| *e == RescueKeyError::Empty),
            ("x".repeat(MAX_KEY_LINE + 1), |e| {
                *e == RescueKeyError::TooLong
            }),
            (format!("{ED25519}\nssh-ed25519 AAAA"), |e| {
                *e == RescueKeyError::NotOneLine
            }),
            (
                "-----BEGIN OPENSSH PRIVATE KEY----- b3BlbnNzaC1rZXktdjEAAAAA".into(),
                |e| *e == RescueKeyError::PrivateKey,
            ),
            ("ssh-dss AAAAB3NzaC1kc3M=".into(), |e| {
                matches!(e, RescueKeyError::UnknownType(_))
            }),
            ("command=\"rm -rf /\" ssh-ed25519 AAAA".into(), |e| {
                matches!(e, RescueKeyError::UnknownType(_))
            }),
            ("ssh-ed25519".into(), |e| *e == RescueKeyError::NoBlob),
            ("ssh-ed25519 !!!notbase64".into(), |e| {
                *e == RescueKeyError::NotBase64
            }),
            ("ssh-ed25519 AAAA".into(), |e| {
                *e == RescueKeyError::NotBase64
            }),
            (
                format!("ssh-ed25519 {}", wire(&[b"ssh-ed25519", &[7; 31]])),
                |e| *e == RescueKeyError::NotBase64,
            ),
            (
                format!("ssh-rsa {}", wire(&[b"ssh-ed25519", &[7; 32]])),
                |e| matches!(e, RescueKeyError::TypeMismatch { .. }),
            ),
            (
                format!("ssh-rsa {}", wire(&[b"ssh-rsa", &[1, 0, 1], &[0xff; 128]])),
                |e| *e == RescueKeyError::WeakRsa(1024),
            ),
        ];
        for (line, expected) in cases {
            let e = check_ssh_public_key(&line).expect_err(&line);
            assert!(expected(&e), "{line:?}: {e}");
        }
    }

    #[test]
    fn an_rsa_key_of_2048_bits_is_accepted() {
        let mut modulus = vec![0u8];
        modulus.extend([0xc3; 256]);
        let line = format!("ssh-rsa {}", wire(&[b"ssh-rsa", &[1, 0, 1], &modulus]));
        assert_eq!(check_ssh_public_key(&line).expect("valid").kind, "ssh-rsa");
    }
}
