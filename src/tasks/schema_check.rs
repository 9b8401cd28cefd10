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
