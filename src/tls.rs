//! Serving HTTPS (`--tls-cert` / `--tls-key`): rustls — the same rustls and crypto provider
//! (aws-lc-rs) that reqwest already brings for outbound `https://` — through tokio-rustls.
//!
//! The certificate lives behind a resolver that every new handshake asks, so a SIGHUP can swap
//! it ([`TlsCertificate::reload`]) without touching connections already open: they keep the
//! session they negotiated, and the next handshake gets the new certificate. A certificate or
//! key that cannot be read, is not PEM, or does not belong together is refused with one line
//! naming the file and the cause — at start-up (ferry exits) and at reload (the old one stays).

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// A client that speaks plain HTTP to the TLS port (`http://` where `https://` was meant) gets
/// a plain-text `400` that says so, instead of TLS bytes (which curl reports as "Received
/// HTTP/0.9 when not allowed"). True when the connection is done: answered so, closed, or
/// silent for `wait` (as a handshake that never starts is); false when its first byte is not
/// an HTTP method's (a TLS handshake starts with 0x16) and the handshake should go ahead.
pub async fn refused_plain_http(stream: &mut tokio::net::TcpStream, wait: std::time::Duration) -> bool {
    use tokio::io::AsyncWriteExt as _;
    let mut first = [0u8; 1];
    match tokio::time::timeout(wait, stream.peek(&mut first)).await {
        Ok(Ok(1)) if first[0].is_ascii_uppercase() => {}
        Ok(Ok(1)) => return false,
        _ => return true,
    }
    let body = "This port speaks HTTPS: use https:// in the URL (curl: --cacert FILE for a private certificate).\n";
    let answer = format!(
        "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(answer.as_bytes()).await;
    let _ = stream.shutdown().await;
    true
}

/// The crypto provider: aws-lc-rs, as reqwest's rustls uses (one TLS stack in the build).
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// A PEM certificate chain and private key, re-readable from the same two paths.
#[derive(Debug)]
pub struct TlsCertificate {
    cert_path: PathBuf,
    key_path: PathBuf,
    current: RwLock<Arc<CertifiedKey>>,
}

impl TlsCertificate {
    /// Read `cert_path` (PEM: the server certificate first, then any intermediates) and
    /// `key_path` (PEM: PKCS#8, PKCS#1 or SEC1 private key). Errors name the file and say
    /// what is wrong: missing, unreadable, no certificate / key in it, or a key that does not
    /// belong to the certificate.
    pub fn load(cert_path: &Path, key_path: &Path) -> anyhow::Result<Arc<TlsCertificate>> {
        let key = read_pair(cert_path, key_path)?;
        Ok(Arc::new(TlsCertificate { cert_path: cert_path.to_path_buf(), key_path: key_path.to_path_buf(), current: RwLock::new(Arc::new(key)) }))
    }

    /// Read the two files again and serve what they hold from the next handshake on. On any
    /// error the certificate in use stays, and the error says why.
    pub fn reload(&self) -> anyhow::Result<()> {
        let key = read_pair(&self.cert_path, &self.key_path)?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(key);
        Ok(())
    }

    /// The paths it was loaded from: (certificate, key).
    pub fn paths(&self) -> (&Path, &Path) {
        (&self.cert_path, &self.key_path)
    }

    /// A server configuration offering HTTP/2 and HTTP/1.1 by ALPN (`h2` first, then
    /// `http/1.1`; RFC 7301, RFC 9113 §3.2), resolving to this certificate. A client that offers
    /// no ALPN gets HTTP/1.1.
    pub fn acceptor(self: &Arc<Self>) -> anyhow::Result<tokio_rustls::TlsAcceptor> {
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| anyhow::anyhow!("TLS: {e}"))?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(Resolver(self.clone())));
        cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(tokio_rustls::TlsAcceptor::from(Arc::new(cfg)))
    }
}

#[derive(Debug)]
struct Resolver(Arc<TlsCertificate>);

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.current.read().unwrap_or_else(|e| e.into_inner()).clone())
    }
}

fn read_pair(cert_path: &Path, key_path: &Path) -> anyhow::Result<CertifiedKey> {
    let cert_name = cert_path.display();
    let key_name = key_path.display();
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert_path)
        .map_err(|e| anyhow::anyhow!("TLS certificate {cert_name}: {}", pem_error(e)))?
        .collect::<Result<_, _>>()
        .map_err(|e| anyhow::anyhow!("TLS certificate {cert_name}: {}", pem_error(e)))?;
    if certs.is_empty() {
        anyhow::bail!("TLS certificate {cert_name}: no PEM certificate (-----BEGIN CERTIFICATE-----) in it");
    }
    let key = PrivateKeyDer::from_pem_file(key_path).map_err(|e| match e {
        rustls_pki_types::pem::Error::NoItemsFound => anyhow::anyhow!("TLS key {key_name}: no PEM private key (-----BEGIN PRIVATE KEY-----) in it"),
        e => anyhow::anyhow!("TLS key {key_name}: {}", pem_error(e)),
    })?;
    let provider = provider();
    let key = CertifiedKey::from_der(certs, key, &provider).map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => {
            anyhow::anyhow!("TLS key {key_name} does not belong to the certificate {cert_name} (their public keys differ)")
        }
        e => anyhow::anyhow!("TLS certificate {cert_name} / key {key_name}: {e}"),
    })?;
    Ok(key)
}

fn pem_error(e: rustls_pki_types::pem::Error) -> String {
    match e {
        rustls_pki_types::pem::Error::Io(io) => io.to_string(),
        other => format!("not valid PEM ({other:?})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_and_empty_files_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = (dir.path().join("c.pem"), dir.path().join("k.pem"));
        let e = TlsCertificate::load(&cert, &key).unwrap_err().to_string();
        assert!(e.contains("c.pem") && e.contains("No such file"), "{e}");
        std::fs::write(&cert, "hello\n").unwrap();
        let e = TlsCertificate::load(&cert, &key).unwrap_err().to_string();
        assert!(e.contains("c.pem") && e.contains("no PEM certificate"), "{e}");
    }
}
