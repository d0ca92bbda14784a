//! Where the CA comes from: configured PEM files, generated ones written on
//! first start (`generate_ca`), or an ephemeral CA for tests.

use std::path::Path;

use bcm_pki::Ca;

use crate::{AttestError, AttestationConfig};

fn write_private(path: &Path, data: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(data.as_bytes())
}

/// Loads (or generates) the CA the configuration names.
pub fn load(cfg: &AttestationConfig) -> Result<Ca, AttestError> {
    match (&cfg.ca_cert_file, &cfg.ca_key_file) {
        (Some(cert), Some(key)) => {
            if !cert.exists() && !key.exists() && cfg.generate_ca {
                let ca = Ca::generate("Better Compute Metal node CA")?;
                write_private(key, &ca.key_pem())
                    .and_then(|()| write_private(cert, ca.cert_pem()))
                    .map_err(|e| AttestError::Config(format!("writing the CA: {e}")))?;
                tracing::warn!(cert = %cert.display(), "generated a new node CA");
                return Ok(ca);
            }
            let read = |p: &Path| {
                std::fs::read_to_string(p)
                    .map_err(|e| AttestError::Config(format!("{}: {e}", p.display())))
            };
            Ok(Ca::from_pem(&read(cert)?, &read(key)?)?)
        }
        (None, None) if cfg.generate_ca => {
            tracing::warn!("ephemeral node CA: certificates do not survive a restart");
            Ok(Ca::generate("Better Compute Metal ephemeral node CA")?)
        }
        (None, None) => Err(AttestError::Config(
            "set ca_cert_file and ca_key_file (or generate_ca for development)".into(),
        )),
        _ => Err(AttestError::Config(
            "ca_cert_file and ca_key_file go together".into(),
        )),
    }
}
