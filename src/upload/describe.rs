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

/// Largest `Upload-Metadata` accepted at creation (TUS header, IETF draft, MCP
/// `file_upload_begin`, and what a pre-create hook substitutes), in bytes of the header's text
/// (keys and base64 values). Every `HEAD` answers it back in `Upload-Metadata`; 4 KiB keeps a
/// HEAD's response headers under about 5 KiB, what a reverse proxy buffers (nginx's
/// `proxy_buffer_size` is one page, 4 KiB, by default: the README's configuration raises it to
/// 16k) — tus-js-client and Uppy send the name twice and a few short keys, about 1.2 KiB for a
/// 255-character name.
pub const MAX_METADATA_BYTES: usize = 4 * 1024;

/// Refuse metadata ferry could not answer back safely: longer than [`MAX_METADATA_BYTES`], or a
/// file name (any of [`NAME_KEYS`]) of more than [`crate::names::MAX_NAME_CHARS`] characters.
/// Unparsable metadata is left to the parser's own error. Errors: 400 `invalid_argument`
/// naming the limit.
pub fn check_metadata(raw: &str) -> Result<(), crate::error::Refusal> {
    use crate::names::MAX_NAME_CHARS;
    if raw.len() > MAX_METADATA_BYTES {
        return Err(crate::error::Refusal::bad_request(
            format!("Upload-Metadata is {} bytes; at most {MAX_METADATA_BYTES} are accepted (it is repeated in every HEAD response)", raw.len()),
            format!(
                "Send fewer or shorter metadata values (at most {MAX_METADATA_BYTES} \
                 bytes in all; a file name of at most {MAX_NAME_CHARS} characters)."
            ),
        ));
    }
    let Ok(md) = raw.parse::<UploadMetadata>() else { return Ok(()) };
    for key in NAME_KEYS {
        if let Some(n) = md.get(key).flatten() {
            let chars = String::from_utf8_lossy(n).chars().count();
            if chars > MAX_NAME_CHARS {
                return Err(crate::error::Refusal::bad_request(
                    format!("the file name (metadata {key:?}) is {chars} characters; at most {MAX_NAME_CHARS} are accepted"),
                    format!("Shorten the file name to at most {MAX_NAME_CHARS} characters."),
                ));
            }
        }
    }
    Ok(())
}

/// `Upload-Metadata` text as the JSON object ferry hands to others — hooks, REST (`metadata` of
/// a file), pages — by key, byte-exact (issue 23 item 6): a value that is UTF-8 is a JSON
/// string, one that is not is `{"base64": "<standard base64 of the bytes>"}`, a key sent
/// without a value is `null`. Unparsable text (never stored: creation checks it) gives `{}`.
pub fn metadata_json(raw: &str) -> serde_json::Map<String, serde_json::Value> {
    use base64::Engine as _;
    use serde_json::Value;
    let md: UploadMetadata = raw.parse().unwrap_or_default();
    md.into_pairs()
        .into_iter()
        .map(|(k, v)| {
            let v = match v {
                None => Value::Null,
                Some(b) => match String::from_utf8(b) {
                    Ok(text) => Value::String(text),
                    Err(e) => serde_json::json!({ "base64": base64::engine::general_purpose::STANDARD.encode(e.as_bytes()) }),
                },
            };
            (k, v)
        })
        .collect()
}

/// The inverse of [`metadata_json`]: an object of text, `{"base64": "…"}` or `null` values as
/// `Upload-Metadata` text, byte for byte. `Err` names the key and what is wrong with its value.
pub fn metadata_from_json(v: &serde_json::Value) -> Result<String, String> {
    use base64::Engine as _;
    use serde_json::Value;
    let obj = v.as_object().ok_or("metadata must be a JSON object")?;
    let mut md = UploadMetadata::new();
    for (k, v) in obj {
        let value = match v {
            Value::Null => None,
            Value::String(s) => Some(s.as_bytes().to_vec()),
            Value::Object(o) if o.len() == 1 && o.get("base64").is_some_and(Value::is_string) => {
                let b64 = o["base64"].as_str().unwrap_or_default();
                Some(
                    base64::engine::general_purpose::STANDARD
                        .decode(b64)
                        .map_err(|e| format!("metadata value of {k:?}: base64 {b64:?} does not decode: {e}"))?,
                )
            }
            other => return Err(format!("metadata value of {k:?} must be text, {{\"base64\": \"…\"}} or null, got {other}")),
        };
        md.insert(k.clone(), value).map_err(|e| format!("metadata key {k:?}: {e}"))?;
    }
    // Round-trip through the header grammar so the stored value always parses.
    let raw = md.to_string();
    raw.parse::<UploadMetadata>().map_err(|e| format!("metadata does not encode: {e}"))?;
    Ok(raw)
}

/// Describe a file from its parsed metadata.
pub fn describe(md: &UploadMetadata) -> Description {
    let name = NAME_KEYS.iter().find_map(|k| md.get_str(k)).map(str::to_owned);
    let media_type = MEDIA_TYPE_KEYS
        .iter()
        .filter_map(|k| md.get_str(k))
        .find_map(|t| t.trim().parse::<mime::Mime>().ok())
        .unwrap_or(mime::APPLICATION_OCTET_STREAM);
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
    fn metadata_is_bounded_in_bytes_and_name_characters() {
        assert!(check_metadata(&md(&[("filename", &"a".repeat(255))])).is_ok());
        assert!(check_metadata(&md(&[("filename", &"é".repeat(255)), ("name", &"é".repeat(255))])).is_ok());
        let e = check_metadata(&md(&[("filename", &"a".repeat(256))])).unwrap_err();
        assert!(e.detail.contains("at most 255"), "{}", e.detail);
        let e = check_metadata(&md(&[("name", &"履".repeat(256))])).unwrap_err();
        assert!(e.detail.contains("\"name\""), "{}", e.detail);
        let e = check_metadata(&md(&[("note", &"x".repeat(4000))])).unwrap_err();
        assert!(e.detail.contains("at most 4096"), "{}", e.detail);
    }

    #[test]
    fn metadata_json_is_byte_exact() {
        let mut m = UploadMetadata::new();
        m.insert("filename", Some(b"\xff\xfe\x00abc".to_vec())).unwrap();
        m.insert("note", Some("héllo".as_bytes().to_vec())).unwrap();
        m.insert("flag", None).unwrap();
        let raw = m.to_string();
        let json = serde_json::Value::Object(metadata_json(&raw));
        assert_eq!(json, serde_json::json!({"filename": {"base64": "//4AYWJj"}, "note": "héllo", "flag": null}));
        let back: UploadMetadata = metadata_from_json(&json).unwrap().parse().unwrap();
        assert_eq!(back.get("filename").flatten(), Some(&b"\xff\xfe\x00abc"[..]));
        // Every pair comes back byte-exact; a JSON object does not keep their order.
        let pairs = |m: &UploadMetadata| {
            let mut v = m.pairs().to_vec();
            v.sort();
            v
        };
        assert_eq!(pairs(&back), pairs(&m));
        assert!(metadata_from_json(&serde_json::json!({"n": 5})).is_err());
        assert!(metadata_from_json(&serde_json::json!({"n": {"base64": "%%%"}})).is_err());
        assert!(metadata_from_json(&serde_json::json!(["x"])).is_err());
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
