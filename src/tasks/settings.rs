//! The task kinds' settings from ferry.toml: `[commands.NAME]` (the `command` kind) and `[fetch]`
//! (the `fetch` kind). `config` fills them; [`crate::tasks::kinds::builtin`] hands them to the kinds.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// `[commands.NAME]` in ferry.toml: a program the `command` task kind may run. Requests name
/// the command; they never supply a command line.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CommandSpec {
    /// Program path.
    pub program: PathBuf,
    /// Fixed arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Name of the produced file (default: `NAME.out`).
    #[serde(default)]
    pub output_name: Option<String>,
    /// Media type of the produced file (default: application/octet-stream).
    #[serde(default)]
    pub media_type: Option<String>,
    /// Working directory (default: the server's).
    #[serde(default)]
    pub cwd: Option<PathBuf>,
    /// Names of variables of the server's environment the program also gets, beside the few
    /// every program gets (`PATH`, `HOME`, `LANG`, `LC_*`, `TZ`, `TMPDIR`): nothing else of the
    /// server's environment reaches it (its credentials stay the server's).
    #[serde(default)]
    pub env: Vec<String>,
    /// What the command does, for tool descriptions.
    #[serde(default)]
    pub description: Option<String>,
    /// A JSON Schema (draft 2020-12 unless `$schema` says otherwise) of the task's `params`:
    /// the MCP tool `export_NAME` shows it as the `params` of its inputSchema, and every start
    /// (MCP or REST) whose params do not match it is refused with 400 `invalid_argument`.
    /// Must describe an object (`type = "object"`); checked at start-up. Absent params are
    /// validated as `{}`.
    #[serde(default)]
    pub params_schema: Option<serde_json::Value>,
}

/// The validator of a `params_schema`, or why it is not a usable schema for params.
pub fn params_validator(schema: &serde_json::Value) -> Result<jsonschema::Validator, String> {
    if schema.get("type").and_then(serde_json::Value::as_str) != Some("object") {
        return Err("it must describe a JSON object (type = \"object\"), as params are one".into());
    }
    jsonschema::validator_for(schema).map_err(|e| format!("it is not a valid JSON Schema: {e} (at {})", e.instance_path()))
}

/// `[fetch]` in ferry.toml: hosts the `fetch` task kind may download from (none by default),
/// and extra certificate authorities it trusts for `https://`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FetchConfig {
    /// Host names or `host:port`, matched exactly (case-insensitive).
    #[serde(default)]
    pub allow_hosts: Vec<String>,
    /// PEM file of certificate authorities trusted for `https://` besides the system's (a
    /// company CA, a test CA). Checked at start-up.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
}
