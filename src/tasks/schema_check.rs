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
/// none. Every number ferry reads from a client is a whole count (bytes, ms, items) within
/// 64 bits.
pub fn number_past_64_bits(value: &Value) -> Option<String> {
    fn find(v: &Value, at: &mut String) -> Option<String> {
        match v {
            Value::Number(n) if n.as_u64().is_none() && n.as_i64().is_none() && n.as_f64().is_some_and(|f| f.fract() == 0.0) => {
                Some(format!("{at}: {n} is outside the whole numbers accepted here (at most {})", u64::MAX))
            }
            Value::Object(m) => m.iter().find_map(|(k, v)| {
                let len = at.len();
                at.push('/');
                at.push_str(&k.replace('~', "~0").replace('/', "~1"));
                let found = find(v, at);
                at.truncate(len);
                found
            }),
            Value::Array(a) => a.iter().enumerate().find_map(|(i, v)| {
                let len = at.len();
                at.push_str(&format!("/{i}"));
                let found = find(v, at);
                at.truncate(len);
                found
            }),
            _ => None,
        }
    }
    find(value, &mut String::new())
}

#[cfg(test)]
mod tests {
    use super::number_past_64_bits;
    use serde_json::json;

    #[test]
    fn integers_past_64_bits_are_named_by_their_pointer() {
        let v: serde_json::Value = serde_json::from_str(r#"{"a":1,"b":[0,{"c/d":18446744073709551616}]}"#).unwrap();
        let m = number_past_64_bits(&v).unwrap();
        assert!(m.starts_with("/b/1/c~1d: ") && m.contains("outside"), "{m}");
        assert_eq!(number_past_64_bits(&json!({ "n": u64::MAX, "m": i64::MIN, "f": 1.5 })), None);
        assert!(number_past_64_bits(&json!(-1e19)).unwrap().starts_with(": -1"));
    }
}
