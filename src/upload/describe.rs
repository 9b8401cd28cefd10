//! What an upload's metadata says about the file: its name and media type. The one reading of
//! `Upload-Metadata` keys that every view uses — REST file info, MCP handles, the download's
//! `Content-Type`/`Content-Disposition`, and task artifacts — so they cannot disagree.

use ferry_tus::UploadMetadata;

/// Metadata keys naming the file, first present wins: `filename` (tus-js-client, tuspy,
/// Uppy, ferry), `name` (Uppy's meta).
pub const NAME_KEYS: &[&str] = &["filename", "name"];

/// Metadata keys naming the media type, first present *and valid* wins: `filetype`
/// (tus-js-client, Uppy, ferry), `contentType`/`content-type`, `type` (Uppy's meta),
/// `mimetype` (tusd examples and others).
pub const MEDIA_TYPE_KEYS: &[&str] = &["filetype", "contentType", "content-type", "type", "mimetype"];

/// The media type of a file whose metadata names none (or none that parses).
pub const DEFAULT_MEDIA_TYPE: &str = "application/octet-stream";

/// A file's name and media type, as its metadata gives them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Description {
    /// The file name (any UTF-8 the client sent; never used as a path), if named.
    pub name: Option<String>,
    /// A valid media type (RFC 6838 `type/subtype` with parameters), else
    /// [`DEFAULT_MEDIA_TYPE`].
    pub media_type: mime::Mime,
}

/// Describe a file from its parsed metadata.
pub fn describe(md: &UploadMetadata) -> Description {
    let name = NAME_KEYS.iter().find_map(|k| md.get_str(k)).map(str::to_owned);
    let media_type = MEDIA_TYPE_KEYS.iter().filter_map(|k| md.get_str(k)).find_map(|t| t.trim().parse::<mime::Mime>().ok()).unwrap_or(mime::APPLICATION_OCTET_STREAM);
    Description { name, media_type }
}

/// Describe a file from its stored `Upload-Metadata` text (unparsable metadata describes
/// nothing: no name, [`DEFAULT_MEDIA_TYPE`]).
pub fn describe_raw(metadata: &str) -> Description {
    describe(&metadata.parse().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn md(pairs: &[(&str, &str)]) -> String {
        let mut m = UploadMetadata::new();
        for (k, v) in pairs {
            m.insert(*k, Some(v.as_bytes().to_vec())).unwrap();
        }
        m.to_string()
    }

    #[test]
    fn every_media_type_key_is_read() {
        for key in MEDIA_TYPE_KEYS {
            let d = describe_raw(&md(&[("filename", "a.png"), (key, "image/png")]));
            assert_eq!(d.media_type.essence_str(), "image/png", "{key}");
            assert_eq!(d.name.as_deref(), Some("a.png"));
        }
    }

    #[test]
    fn an_invalid_type_falls_through_to_the_next_key_then_the_default() {
        assert_eq!(describe_raw(&md(&[("filetype", "not a type"), ("mimetype", "text/plain")])).media_type.essence_str(), "text/plain");
        assert_eq!(describe_raw(&md(&[("filetype", "nope")])).media_type.as_ref(), DEFAULT_MEDIA_TYPE);
        assert_eq!(describe_raw(""), Description { name: None, media_type: mime::APPLICATION_OCTET_STREAM });
        assert_eq!(describe_raw(&md(&[("name", "x.bin")])).name.as_deref(), Some("x.bin"));
    }
}
