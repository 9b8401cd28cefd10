//! Owns `Upload-Checksum` and the algorithm names of `Tus-Checksum-Algorithm`
//! (TUS 1.0 §Checksum, also used as a trailer by `checksum-trailer`).

use std::fmt;
use std::str::FromStr;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;

use super::first_non_tchar;
use crate::error::{ParseError, ParseErrorKind};

const NAME: &str = "Upload-Checksum";

/// A checksum algorithm this crate knows (TUS 1.0 §Checksum: `sha1` MUST be supported).
///
/// Names are the lowercase ones of the TUS checksum algorithm registry: `sha1`, `sha256`,
/// `sha512`, `md5`. Parsing is ASCII case-insensitive; `Display` is lowercase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ChecksumAlgorithm {
    /// SHA-1 (20-byte digest).
    Sha1,
    /// SHA-256 (32-byte digest).
    Sha256,
    /// SHA-512 (64-byte digest).
    Sha512,
    /// MD5 (16-byte digest).
    Md5,
}

impl ChecksumAlgorithm {
    /// Every algorithm, in the order advertised in `Tus-Checksum-Algorithm`.
    pub const ALL: &'static [ChecksumAlgorithm] =
        &[ChecksumAlgorithm::Sha1, ChecksumAlgorithm::Sha256, ChecksumAlgorithm::Sha512, ChecksumAlgorithm::Md5];

    /// Digest length in bytes: 20, 32, 64, 16.
    pub fn digest_len(&self) -> usize {
        match self {
            ChecksumAlgorithm::Sha1 => 20,
            ChecksumAlgorithm::Sha256 => 32,
            ChecksumAlgorithm::Sha512 => 64,
            ChecksumAlgorithm::Md5 => 16,
        }
    }

    /// The lowercase wire name: `"sha1"`, `"sha256"`, `"sha512"`, `"md5"`.
    pub fn name(&self) -> &'static str {
        match self {
            ChecksumAlgorithm::Sha1 => "sha1",
            ChecksumAlgorithm::Sha256 => "sha256",
            ChecksumAlgorithm::Sha512 => "sha512",
            ChecksumAlgorithm::Md5 => "md5",
        }
    }
}

impl FromStr for ChecksumAlgorithm {
    type Err = ParseError;

    /// Errors: empty or non-`token` input → [`ParseErrorKind::Syntax`]; a well-formed name this
    /// crate does not know (e.g. `crc32`) → [`ParseErrorKind::UnknownAlgorithm`].
    fn from_str(s: &str) -> Result<Self, ParseError> {
        if s.is_empty() {
            return Err(ParseError::syntax(NAME, 0, "expected a checksum algorithm name"));
        }
        if let Some(i) = first_non_tchar(s) {
            return Err(ParseError::syntax(NAME, i, "invalid character in algorithm name"));
        }
        ChecksumAlgorithm::ALL.iter().copied().find(|a| a.name().eq_ignore_ascii_case(s)).ok_or(ParseError::new(
            NAME,
            0,
            ParseErrorKind::UnknownAlgorithm,
            "unsupported checksum algorithm",
        ))
    }
}

impl fmt::Display for ChecksumAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `Upload-Checksum`: the checksum of the current request body (TUS 1.0 §Upload-Checksum).
///
/// Grammar: `algorithm SP base64` — "the name of the used checksum algorithm and the Base64
/// encoded checksum separated by a space". Exactly one space; the base64 is the RFC 4648 §4
/// standard alphabet with canonical padding and decodes to at least one byte.
///
/// Errors are checked in this order: shape (`Syntax`), algorithm
/// ([`ParseErrorKind::UnknownAlgorithm`] — the server answers 400 with its own message), then
/// base64 (`Syntax`). Those are the malformed checksums (400).
///
/// A digest whose length is not [`ChecksumAlgorithm::digest_len`] is *well formed*: it is a
/// checksum that cannot match any bytes, so it parses, and comparing it with the chunk's digest
/// fails like any other mismatch (TUS 1.0 §Checksum: a checksum that does not match → 460; tusd
/// also compares whatever the base64 decodes to). [`UploadChecksum::can_match`] tells it apart.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct UploadChecksum {
    /// The algorithm named in the header.
    pub algorithm: ChecksumAlgorithm,
    /// The raw digest bytes (not base64).
    pub digest: Vec<u8>,
}

impl UploadChecksum {
    /// The canonical header name.
    pub const NAME: &'static str = NAME;

    /// Whether the digest has the algorithm's length, so that some bytes could match it.
    pub fn can_match(&self) -> bool {
        self.digest.len() == self.algorithm.digest_len()
    }

    /// Whether `computed` (the chunk's digest under [`UploadChecksum::algorithm`]) is this
    /// checksum. Always false when [`UploadChecksum::can_match`] is false.
    pub fn matches(&self, computed: &[u8]) -> bool {
        self.digest == computed
    }
}

impl FromStr for UploadChecksum {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, ParseError> {
        let Some((alg, b64)) = s.split_once(' ') else {
            return Err(ParseError::syntax(NAME, s.len(), "expected algorithm and base64 digest separated by a space"));
        };
        let algorithm: ChecksumAlgorithm = alg.parse()?;
        let base = alg.len() + 1;
        let digest = STANDARD.decode(b64).map_err(|e| {
            let i = match e {
                base64::DecodeError::InvalidByte(i, _) | base64::DecodeError::InvalidLastSymbol(i, _) => i,
                _ => b64.len(),
            };
            ParseError::syntax(NAME, base + i, "digest is not canonical padded base64")
        })?;
        if digest.is_empty() {
            return Err(ParseError::syntax(NAME, base, "expected a base64 digest"));
        }
        Ok(UploadChecksum { algorithm, digest })
    }
}

impl fmt::Display for UploadChecksum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.algorithm, STANDARD.encode(&self.digest))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn algorithms() {
        for a in ChecksumAlgorithm::ALL {
            assert_eq!(a.to_string().parse::<ChecksumAlgorithm>().unwrap(), *a);
            assert_eq!(a.name().to_ascii_uppercase().parse::<ChecksumAlgorithm>().unwrap(), *a);
        }
        assert_eq!("Sha256".parse::<ChecksumAlgorithm>(), Ok(ChecksumAlgorithm::Sha256));
        let lens: Vec<_> = ChecksumAlgorithm::ALL.iter().map(|a| a.digest_len()).collect();
        assert_eq!(lens, [20, 32, 64, 16]);
        assert_eq!("crc32".parse::<ChecksumAlgorithm>().unwrap_err().kind(), ParseErrorKind::UnknownAlgorithm);
        assert_eq!("".parse::<ChecksumAlgorithm>().unwrap_err().kind(), ParseErrorKind::Syntax);
        assert_eq!("sh a1".parse::<ChecksumAlgorithm>().unwrap_err().kind(), ParseErrorKind::Syntax);
    }

    #[test]
    fn spec_example() {
        // TUS 1.0 §Checksum example: sha1 of "hello world".
        let c: UploadChecksum = "sha1 Kq5sNclPz7QV2+lfQIuc6R7oRu0=".parse().unwrap();
        assert_eq!(c.algorithm, ChecksumAlgorithm::Sha1);
        assert_eq!(c.digest[..4], [0x2a, 0xae, 0x6c, 0x35]);
        assert_eq!(c.to_string(), "sha1 Kq5sNclPz7QV2+lfQIuc6R7oRu0=");
    }

    #[test]
    fn round_trips_every_algorithm() {
        for a in ChecksumAlgorithm::ALL {
            let c = UploadChecksum { algorithm: *a, digest: (0..a.digest_len()).map(|i| (i * 7) as u8).collect() };
            assert_eq!(c.to_string().parse::<UploadChecksum>().unwrap(), c);
        }
    }

    #[test]
    fn unknown_algorithm_is_distinguishable() {
        let e = "crc32 AAAAAA==".parse::<UploadChecksum>().unwrap_err();
        assert_eq!(e.kind(), ParseErrorKind::UnknownAlgorithm);
        assert_eq!(e.header(), "Upload-Checksum");
        // Even with a broken digest, the unknown algorithm is what is reported.
        let e = "blake3 !!!".parse::<UploadChecksum>().unwrap_err();
        assert_eq!(e.kind(), ParseErrorKind::UnknownAlgorithm);
    }

    #[test]
    fn a_digest_of_the_wrong_length_is_well_formed_and_cannot_match() {
        // The input: valid base64 of 21 bytes for sha1 (20).
        let c: UploadChecksum = "sha1 AAAAAAAAAAAAAAAAAAAAAAAAAAAA".parse().unwrap();
        assert_eq!((c.algorithm, c.digest.len()), (ChecksumAlgorithm::Sha1, 21));
        assert!(!c.can_match());
        assert!(!c.matches(&[0u8; 20]));
        for (alg, len) in [("sha1", 19), ("sha256", 20), ("sha512", 32), ("md5", 20), ("sha256", 3)] {
            let s = format!("{alg} {}", STANDARD.encode(vec![0u8; len]));
            let c: UploadChecksum = s.parse().unwrap();
            assert!(!c.can_match(), "{s}");
            assert_eq!(c.to_string(), s, "round-trips");
        }
        let ok: UploadChecksum = format!("md5 {}", STANDARD.encode([5u8; 16])).parse().unwrap();
        assert!(ok.can_match() && ok.matches(&[5u8; 16]) && !ok.matches(&[6u8; 16]));
    }

    #[test]
    fn malformed_is_syntax() {
        let sha1 = STANDARD.encode([0u8; 20]);
        for s in [
            String::new(),
            "sha1".to_owned(),
            format!("sha1  {sha1}"), // two spaces
            format!(" sha1 {sha1}"), // leading space
            format!("sha1 {sha1} "), // trailing space
            format!("sha1:{sha1}"),
            "sha1 ".to_owned(),                             // empty digest
            format!("sha1 {}", sha1.trim_end_matches('=')), // unpadded
            "sha1 AAAAAAAAAAAAAAAAAAAAAAAAAA-=".to_owned(), // URL-safe char
        ] {
            let e = s.parse::<UploadChecksum>().unwrap_err();
            assert_eq!(e.kind(), ParseErrorKind::Syntax, "{s:?}: {e}");
        }
    }
}
