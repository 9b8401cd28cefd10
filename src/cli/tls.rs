//! Trusting a private server's certificate (`--cacert FILE`, `FERRY_CACERT`; issue 23, kind
//! 11). The file is PEM, one or more certificates, and is trusted the way curl's `--cacert`
//! trusts it: a certificate authority in it vouches for the server's certificate (chain and
//! name checked by webpki), and a certificate in it that *is* the server's certificate — an
//! ordinary self-signed one from `openssl req -x509`, which webpki refuses as an end entity
//! (`CaUsedAsEndEntity`) — is trusted as it is. The handshake's signatures are always checked.
//!
//! A failed handshake is told in words a person acts on ([`TlsFailure`], issue 48 kind 6):
//! which certificate was refused and why (self-signed, an unknown authority, another name,
//! expired), whether the `--cacert` file took part, and a peer that does not speak TLS at all.

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
    /// The file, named by the errors this verifier returns.
    file: std::path::PathBuf,
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
        let refused = match &self.authorities {
            Some(v) => v.verify_server_cert(end_entity, intermediates, server_name, ocsp, now),
            None => Err(rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer)),
        };
        // Say that the --cacert file decided, so the words can name it.
        refused.map_err(|inner| {
            let by_file = RefusedByFile { file: self.file.clone(), inner };
            rustls::Error::InvalidCertificate(rustls::CertificateError::Other(rustls::OtherError(Arc::new(by_file))))
        })
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
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
    let pinned: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(&pem).collect::<Result<_, _>>().map_err(|e| bad(format!("not PEM certificates: {e}")))?;
    if pinned.is_empty() {
        return Err(bad("holds no certificate (-----BEGIN CERTIFICATE-----)".into()));
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    let (_added, _ignored) = roots.add_parsable_certificates(pinned.iter().cloned());
    let authorities =
        if roots.is_empty() { None } else { WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone()).build().ok() };
    let verifier = FileTrust { file: file.to_path_buf(), pinned, authorities, provider: provider.clone() };
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(format!("TLS: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    Ok(cfg)
}

/// A certificate the `--cacert` file neither is nor vouches for: `inner` says why.
#[derive(Debug)]
struct RefusedByFile {
    file: std::path::PathBuf,
    inner: rustls::Error,
}

impl std::fmt::Display for RefusedByFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "refused by --cacert {}: {}", self.file.display(), self.inner)
    }
}

impl std::error::Error for RefusedByFile {}

/// Why a TLS handshake failed, as a person acts on it.
#[derive(Debug, Clone, PartialEq)]
pub enum TlsFailure {
    /// The other end answered, but not in TLS (rustls: a record of an unknown content type):
    /// it speaks plain HTTP on that port.
    NotTls,
    /// Nothing trusted vouches for the server's certificate: it is self-signed (a certificate
    /// authority's used as the server's own, as `openssl req -x509` makes: `self_signed`), or
    /// signed by an authority not trusted here.
    Untrusted { self_signed: bool, cacert: Option<std::path::PathBuf> },
    /// The certificate is valid, but for other names (`names`, as it presents them).
    WrongName { names: Vec<String> },
    /// The certificate has expired or is not valid yet.
    OutOfDate { expired: bool },
    /// Anything else, in rustls's words.
    Other(String),
}

impl TlsFailure {
    /// The failure as one clause: `the server's certificate is self-signed, …`.
    pub fn words(&self, host: &str) -> String {
        match self {
            TlsFailure::NotTls => format!("{host} did not answer in TLS: this port does not speak https://"),
            TlsFailure::Untrusted { self_signed: true, cacert: None } => {
                "the server's certificate is self-signed (as `openssl req -x509` makes them), and this client does not trust it".into()
            }
            TlsFailure::Untrusted { self_signed: false, cacert: None } => {
                "the server's certificate is signed by an authority this system does not trust".into()
            }
            TlsFailure::Untrusted { self_signed, cacert: Some(f) } => {
                let what = if *self_signed { "a self-signed certificate" } else { "a certificate" };
                format!("the server presented {what} that the --cacert file {} neither holds nor signed", f.display())
            }
            TlsFailure::WrongName { names } if names.is_empty() => format!("the server's certificate is not valid for the name {host}"),
            TlsFailure::WrongName { names } => format!("the server's certificate is valid for {}, not for {host}", names.join(", ")),
            TlsFailure::OutOfDate { expired: true } => "the server's certificate has expired".into(),
            TlsFailure::OutOfDate { expired: false } => "the server's certificate is not valid yet (is this machine's clock right?)".into(),
            TlsFailure::Other(w) => format!("the TLS handshake failed: {w}"),
        }
    }

    /// What to do about it.
    pub fn hint(&self) -> String {
        match self {
            TlsFailure::NotTls => "Use http:// for this port.".into(),
            TlsFailure::Untrusted { cacert: None, .. } => "For a server with a private or self-signed certificate, pass --cacert FILE \
                                                           (or set FERRY_CACERT) with its certificate or the authority that signed it."
                .into(),
            TlsFailure::Untrusted { cacert: Some(_), .. } => {
                "Pass the server's own certificate (the file its --tls-cert names) or the authority that \
                 signed it; `openssl s_client -connect HOST:PORT -showcerts` shows what it presents."
                    .into()
            }
            TlsFailure::WrongName { names } => {
                let example = names.first().map(|n| format!(" (e.g. https://{n}:PORT)")).unwrap_or_default();
                format!(
                    "Connect with a name the certificate holds{example}, or have the certificate made again \
                     with this name in its subjectAltName; no --cacert changes the names a certificate holds."
                )
            }
            TlsFailure::OutOfDate { .. } => "The server's operator must renew its certificate (--tls-cert, \
                                             then SIGHUP); nothing on this side makes it valid."
                .into(),
            TlsFailure::Other(_) => "For a server with a private or self-signed certificate, pass --cacert FILE \
                                     (or set FERRY_CACERT) with its certificate or the authority that signed it."
                .into(),
        }
    }
}

/// The TLS failure in `e`'s chain, if the failure was TLS's.
pub fn tls_failure(e: &(dyn std::error::Error + 'static)) -> Option<TlsFailure> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cur {
        if let Some(t) = rustls_in(c) {
            return Some(classify(t, None));
        }
        cur = c.source();
    }
    None
}

/// A name as webpki presents it (`DnsName("files.example")`, `IpAddress(10.0.0.1)`), as a
/// person writes it (`files.example`, `10.0.0.1`).
fn presented_name(n: &str) -> String {
    match (n.find('('), n.rfind(')')) {
        (Some(a), Some(b)) if a < b => n[a + 1..b].trim_matches('"').to_string(),
        _ => n.to_string(),
    }
}

/// The failure a rustls error stands for; `cacert`: the `--cacert` file that refused it.
fn classify(e: &rustls::Error, cacert: Option<&Path>) -> TlsFailure {
    use rustls::CertificateError as C;
    let untrusted = |self_signed| TlsFailure::Untrusted { self_signed, cacert: cacert.map(Path::to_path_buf) };
    match e {
        rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType) => TlsFailure::NotTls,
        rustls::Error::InvalidCertificate(c) => match c {
            C::UnknownIssuer | C::BadSignature => untrusted(false),
            C::NotValidForName => TlsFailure::WrongName { names: Vec::new() },
            C::NotValidForNameContext { presented, .. } => TlsFailure::WrongName { names: presented.iter().map(|n| presented_name(n)).collect() },
            C::Expired | C::ExpiredContext { .. } => TlsFailure::OutOfDate { expired: true },
            C::NotValidYet | C::NotValidYetContext { .. } => TlsFailure::OutOfDate { expired: false },
            C::Other(rustls::OtherError(o)) => {
                if let Some(f) = o.downcast_ref::<RefusedByFile>() {
                    return classify(&f.inner, Some(&f.file));
                }
                match o.downcast_ref::<webpki::Error>() {
                    Some(webpki::Error::CaUsedAsEndEntity) => untrusted(true),
                    _ => TlsFailure::Other(e.to_string()),
                }
            }
            _ => TlsFailure::Other(e.to_string()),
        },
        _ => TlsFailure::Other(e.to_string()),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presented_names_are_written_as_people_write_them() {
        assert_eq!(presented_name("DnsName(\"files.example\")"), "files.example");
        assert_eq!(presented_name("IpAddress(10.0.0.1)"), "10.0.0.1");
        assert_eq!(presented_name("plain"), "plain");
    }
}
