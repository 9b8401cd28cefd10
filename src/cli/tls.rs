//! Trusting a private server's certificate (`--cacert FILE`, `FERRY_CACERT`; issue 23, kind
//! 11). The file is PEM, one or more certificates, and is trusted the way curl's `--cacert`
//! trusts it: a certificate authority in it vouches for the server's certificate (chain and
//! name checked by webpki), and a certificate in it that *is* the server's certificate — an
//! ordinary self-signed one from `openssl req -x509`, which webpki refuses as an end entity
//! (`CaUsedAsEndEntity`) — is trusted as it is. The handshake's signatures are always checked.

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::{DigitallySignedStruct, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

use super::client::{CliError, EXIT_USAGE};

/// The certificates of one `--cacert` file.
#[derive(Debug)]
struct FileTrust {
    /// Every certificate in the file, compared byte for byte with the server's.
    pinned: Vec<CertificateDer<'static>>,
    /// The file's certificates as trust anchors (None when none of them can be one).
    authorities: Option<Arc<WebPkiServerVerifier>>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for FileTrust {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if self.pinned.iter().any(|c| c.as_ref() == end_entity.as_ref()) {
            return Ok(ServerCertVerified::assertion());
        }
        match &self.authorities {
            Some(v) => v.verify_server_cert(end_entity, intermediates, server_name, ocsp, now),
            None => Err(rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer)),
        }
    }

    fn verify_tls12_signature(&self, message: &[u8], cert: &CertificateDer<'_>, dss: &DigitallySignedStruct) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(&self, message: &[u8], cert: &CertificateDer<'_>, dss: &DigitallySignedStruct) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

/// A rustls client configuration trusting what `file` holds (and nothing else, as curl's
/// `--cacert` replaces the system's authorities). Errors (exit 2): the file cannot be read or
/// holds no PEM certificate.
pub fn client_config(file: &Path) -> Result<rustls::ClientConfig, CliError> {
    let bad = |why: String| {
        CliError::new(EXIT_USAGE, format!("--cacert {}: {why}", file.display()))
            .hint("Pass a PEM file with the server's certificate or the authority that signed it (what curl --cacert takes).")
    };
    let pem = std::fs::read(file).map_err(|e| bad(e.to_string()))?;
    let pinned: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem).collect::<Result<_, _>>().map_err(|e| bad(format!("not PEM certificates: {e}")))?;
    if pinned.is_empty() {
        return Err(bad("holds no certificate (-----BEGIN CERTIFICATE-----)".into()));
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    let (_added, _ignored) = roots.add_parsable_certificates(pinned.iter().cloned());
    let authorities = if roots.is_empty() { None } else { WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone()).build().ok() };
    let verifier = FileTrust { pinned, authorities, provider: provider.clone() };
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(format!("TLS: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    Ok(cfg)
}

/// The TLS cause in `e`'s chain (a certificate the client does not trust, a handshake the
/// server broke off…), in words, if the failure was TLS's.
pub fn tls_cause(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cur {
        if let Some(t) = rustls_in(c) {
            return Some(t.to_string());
        }
        cur = c.source();
    }
    None
}

/// `e` itself, or what an `io::Error` wraps (at any depth: `io::Error::source` skips the
/// error it wraps), as a rustls error.
fn rustls_in<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    if let Some(t) = e.downcast_ref::<rustls::Error>() {
        return Some(t);
    }
    let inner: &(dyn std::error::Error + 'static) = e.downcast_ref::<std::io::Error>()?.get_ref()?;
    rustls_in(inner)
}
