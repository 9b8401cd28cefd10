//! Checking a value a client sent against the JSON Schema ferry declares for it (issue 23,
//! kind 3): MCP tool arguments against their `inputSchema`, answers to a task's input request
//! against the request's `schema`, task arguments against their kind's schema. A refusal names
//! each place that fails by its JSON pointer, and is made before anything is stored.

use serde_json::Value;

/// Most violations one refusal lists.
const MAX_SHOWN: usize = 5;

/// `Ok` when `value` fits `schema`; else every violation (at most five) as
/// `"{place}{pointer}: {what}"`, joined by `; `. `place` names the value (`arguments`,
/// `response`, `args`).
pub fn check(schema: &jsonschema::Validator, value: &Value, place: &str) -> Result<(), String> {
    let errors: Vec<String> = schema.iter_errors(value).take(MAX_SHOWN + 1).map(|e| format!("{place}{}: {e}", e.instance_path())).collect();
    if errors.is_empty() {
        return Ok(());
    }
    let more = if errors.len() > MAX_SHOWN { "; …" } else { "" };
    Err(format!("{}{more}", errors[..errors.len().min(MAX_SHOWN)].join("; ")))
}

/// The pointer of the first violation (`/ttl_ms`), for a hint: `""` for the value itself.
pub fn first_pointer(schema: &jsonschema::Validator, value: &Value) -> Option<String> {
    schema.iter_errors(value).next().map(|e| e.instance_path().to_string())
}

/// The first number in `value` that is a JSON integer past 64 bits (neither `u64` nor `i64`
/// holds it, so serde_json reads it as floating point and a typed field refuses it with
/// "invalid type: floating point"), as `"{pointer}: {n} is outside …"`; `None` when there is
/// none. The bound named is the field's own: `maximum` (and `minimum`) of the place in
/// `schema` (a JSON Schema whose `properties`/`items` lead to it), else the 64-bit range every
/// number ferry reads from a client fits (whole counts: bytes, ms, items).
pub fn number_past_64_bits(value: &Value, schema: Option<&Value>) -> Option<String> {
    fn bound(schema: Option<&Value>, n: &serde_json::Number) -> String {
        let (min, max) = (schema.and_then(|s| s.get("minimum")), schema.and_then(|s| s.get("maximum")));
        match (min, max) {
            (Some(lo), Some(hi)) => format!("from {lo} to {hi}"),
            (None, Some(hi)) => format!("at most {hi}"),
            _ if n.as_f64().is_some_and(|f| f < 0.0) => format!("at least {}", i64::MIN),
            _ => format!("at most {}", u64::MAX),
        }
    }
    fn find(v: &Value, schema: Option<&Value>, at: &mut String) -> Option<String> {
        match v {
            Value::Number(n) if n.as_u64().is_none() && n.as_i64().is_none() && n.as_f64().is_some_and(|f| f.fract() == 0.0) => {
                Some(format!("{at}: {n} is outside the whole numbers accepted here ({})", bound(schema, n)))
            }
            Value::Object(m) => m.iter().find_map(|(k, v)| {
                let len = at.len();
                at.push('/');
                at.push_str(&k.replace('~', "~0").replace('/', "~1"));
                let inner = schema
                    .and_then(|s| s.get("properties").and_then(|p| p.get(k)).or_else(|| s.get("additionalProperties").filter(|a| a.is_object())));
                let found = find(v, inner, at);
                at.truncate(len);
                found
            }),
            Value::Array(a) => a.iter().enumerate().find_map(|(i, v)| {
                let len = at.len();
                at.push_str(&format!("/{i}"));
                let found = find(v, schema.and_then(|s| s.get("items")), at);
                at.truncate(len);
                found
            }),
            _ => None,
        }
    }
    find(value, schema, &mut String::new())
}

/// The first place in JSON text `text` that other readers cannot take as it is written, as
/// `"{pointer}: {what}"`: a string with a lone UTF-16 surrogate escape (`"\ud800"`: no Unicode
/// character; strict parsers refuse it, others replace it), or a number beyond the range of an
/// IEEE 754 double (`1e999`: JavaScript and Python read it as Infinity). `None` when there is
/// none, or when `text` is not JSON (the caller's parser says why). ferry stores client JSON
/// (task args, answers, results, fragments) verbatim, so such a value is refused before it is
/// stored (RFC 8259 §§ 6, 8.2; I-JSON, RFC 7493 §§ 2.1, 2.2).
pub fn unportable_json(text: &str) -> Option<String> {
    enum Frame {
        Obj(Option<String>),
        Arr(usize),
    }
    fn pointer(stack: &[Frame]) -> String {
        let mut p = String::new();
        for f in stack {
            match f {
                Frame::Obj(Some(k)) => {
                    p.push('/');
                    p.push_str(&k.replace('~', "~0").replace('/', "~1"));
                }
                Frame::Obj(None) => {}
                Frame::Arr(i) => p.push_str(&format!("/{i}")),
            }
        }
        p
    }
    let b = text.as_bytes();
    let mut stack: Vec<Frame> = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'{' => stack.push(Frame::Obj(None)),
            b'[' => stack.push(Frame::Arr(0)),
            b'}' | b']' => {
                stack.pop();
            }
            b',' => match stack.last_mut() {
                Some(Frame::Arr(n)) => *n += 1,
                Some(Frame::Obj(k)) => *k = None,
                None => {}
            },
            b'"' => {
                let start = i + 1;
                let mut j = start;
                let mut lone: Option<u16> = None;
                let mut pending_high: Option<u16> = None;
                while j < b.len() && b[j] != b'"' {
                    if b[j] == b'\\' && b.get(j + 1) == Some(&b'u') {
                        let unit = text.get(j + 2..j + 6).and_then(|h| u16::from_str_radix(h, 16).ok())?;
                        match unit {
                            0xD800..=0xDBFF => lone = lone.or(pending_high.replace(unit)),
                            0xDC00..=0xDFFF if pending_high.take().is_none() => lone = lone.or(Some(unit)),
                            _ => lone = lone.or(pending_high.take()),
                        }
                        j += 6;
                        continue;
                    }
                    // Anything but a low surrogate after a high one leaves the high one alone.
                    lone = lone.or(pending_high.take());
                    j += if b[j] == b'\\' { 2 } else { 1 };
                }
                let lone = lone.or(pending_high);
                let raw = text.get(start..j)?;
                let is_key = matches!(stack.last(), Some(Frame::Obj(None)));
                if is_key {
                    let key = serde_json::from_str::<String>(&format!("\"{raw}\"")).unwrap_or_else(|_| raw.to_string());
                    if let Some(u) = lone {
                        return Some(format!(
                            "{}: the member name {raw:?} holds a lone surrogate \\u{u:04x}, which is no Unicode character",
                            pointer(&stack)
                        ));
                    }
                    if let Some(Frame::Obj(k)) = stack.last_mut() {
                        *k = Some(key);
                    }
                } else if let Some(u) = lone {
                    return Some(format!(
                        "{}: the string holds a lone surrogate \\u{u:04x}, which is no Unicode character; \
                         send text as UTF-8, or a pair \\ud83d\\ude00 for a character past U+FFFF",
                        pointer(&stack)
                    ));
                }
                i = j;
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                while i + 1 < b.len() && matches!(b[i + 1], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9') {
                    i += 1;
                }
                let n = &text[start..=i];
                if n.parse::<f64>().is_ok_and(|f| f.is_infinite()) {
                    return Some(format!(
                        "{}: the number {n} is beyond the range of a double (about 1.8e308); other JSON readers take it as Infinity",
                        pointer(&stack)
                    ));
                }
            }
            _ => {}
        }
        i += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::{number_past_64_bits, unportable_json};
    use serde_json::json;

    #[test]
    fn integers_past_64_bits_are_named_by_their_pointer() {
        let v: serde_json::Value = serde_json::from_str(r#"{"a":1,"b":[0,{"c/d":18446744073709551616}]}"#).unwrap();
        let m = number_past_64_bits(&v, None).unwrap();
        assert!(m.starts_with("/b/1/c~1d: ") && m.ends_with("(at most 18446744073709551615)"), "{m}");
        assert_eq!(number_past_64_bits(&json!({ "n": u64::MAX, "m": i64::MIN, "f": 1.5 }), None), None);
        let m = number_past_64_bits(&json!(-1e19), None).unwrap();
        assert!(m.starts_with(": -1") && m.ends_with("(at least -9223372036854775808)"), "{m}");
    }

    #[test]
    fn a_field_with_its_own_bound_is_named_with_it() {
        let schema = json!({ "properties": {
            "ttl_ms": { "type": "integer", "minimum": 1, "maximum": 604800000 },
            "list": { "items": { "maximum": 9 } },
            "m": { "additionalProperties": { "maximum": 5 } }
        } });
        let v: serde_json::Value = serde_json::from_str(r#"{"ttl_ms":18446744073709551616}"#).unwrap();
        let m = number_past_64_bits(&v, Some(&schema)).unwrap();
        assert!(m.starts_with("/ttl_ms: ") && m.ends_with("is outside the whole numbers accepted here (from 1 to 604800000)"), "{m}");
        let v: serde_json::Value = serde_json::from_str(r#"{"list":[1,1e20]}"#).unwrap();
        assert!(number_past_64_bits(&v, Some(&schema)).unwrap().ends_with("(at most 9)"));
        let v: serde_json::Value = serde_json::from_str(r#"{"m":{"a":1e20}}"#).unwrap();
        assert!(number_past_64_bits(&v, Some(&schema)).unwrap().ends_with("(at most 5)"));
        let v: serde_json::Value = serde_json::from_str(r#"{"other":1e20}"#).unwrap();
        assert!(number_past_64_bits(&v, Some(&schema)).unwrap().ends_with("(at most 18446744073709551615)"));
    }

    #[test]
    fn unportable_values_are_named_by_their_pointer() {
        assert_eq!(unportable_json(r#"{"a":[1,{"b":"x\ud800"}]}"#).unwrap().split(':').next(), Some("/a/1/b"));
        assert_eq!(unportable_json(r#"{"a":"\udc00"}"#).unwrap().split(':').next(), Some("/a"));
        assert_eq!(unportable_json(r#"{"a":"\ud800x"}"#).unwrap().split(':').next(), Some("/a"));
        assert_eq!(unportable_json(r#"{"a":"\ud800\ud800\udc00"}"#).unwrap().split(':').next(), Some("/a"));
        assert!(unportable_json(r#"{"a":"\ud83d\ude00 \u00e9 \\ud800"}"#).is_none(), "a pair, a BMP escape and an escaped backslash are fine");
        assert_eq!(unportable_json(r#"{"args":{"n":[0, 1e999]}}"#).unwrap().split(':').next(), Some("/args/n/1"));
        assert_eq!(unportable_json(r#"{"k/~":-1E400}"#).unwrap().split(':').next(), Some("/k~1~0"));
        assert!(unportable_json(r#"{"a":"1e999","b":1e308,"c":-0.0,"d":1e-999,"e":18446744073709551616}"#).is_none());
        assert!(unportable_json(r#"{"\ud800":1}"#).unwrap().contains("member name"));
        assert_eq!(unportable_json("1e999").unwrap().split(':').next(), Some(""));
    }
}
