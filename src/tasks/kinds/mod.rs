//! Built-in job kinds (DESIGN §4): `archive`, `compress`, `fetch`, `command` (one per program
//! declared in ferry.toml), `external` (driven over REST by its producer), `concat` (the
//! final upload of a TUS concatenation) and `check` (re-read finished files, [`crate::check`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::de::DeserializeOwned;

use super::settings::{CommandSpec, FetchConfig};
use super::{Job, JobError};

pub mod archive;
pub mod check;
pub mod command;
mod command_group;
pub mod compress;
pub mod concat;
pub mod external;
pub mod fetch;

/// Every built-in kind, configured with `[fetch]` and `[commands.NAME]`.
pub fn builtin(fetch: FetchConfig, commands: BTreeMap<String, CommandSpec>) -> Vec<Arc<dyn Job>> {
    vec![
        Arc::new(archive::ArchiveJob),
        Arc::new(compress::CompressJob),
        Arc::new(fetch::FetchJob::new(fetch)),
        Arc::new(command::CommandJob::new(commands)),
        Arc::new(external::ExternalJob),
        Arc::new(concat::ConcatJob),
        Arc::new(check::CheckJob),
    ]
}

/// How many ids an input-file refusal lists before "and N more".
const MAX_IDS_NAMED: usize = 20;

fn name_ids(ids: &[&str]) -> String {
    let shown: Vec<&str> = ids.iter().take(MAX_IDS_NAMED).copied().collect();
    let more = ids.len().saturating_sub(MAX_IDS_NAMED);
    if more > 0 {
        format!("{} and {more} more", shown.join(", "))
    } else {
        shown.join(", ")
    }
}

/// The input files `ids` of a `kind` task must be finished uploads of `principal`
/// ([`Job::check_inputs`]): ids that are not (unknown, another principal's, expired or
/// deleted) → 404 `not_found` naming them; else ids still uploading → 409
/// `upload_incomplete` naming them (with `partial.cursor` = the offset when there is one).
pub(crate) async fn check_input_files(
    kind: &str,
    principal: &str,
    ids: &[String],
    uploads: &crate::upload::UploadEngine,
) -> Result<(), crate::error::Refusal> {
    use crate::error::{ErrorCode, Next, Refusal};
    let mut unknown: Vec<&str> = Vec::new();
    let mut incomplete: Vec<(&str, u64)> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for id in ids.iter().filter(|id| seen.insert(id.as_str())) {
        match uploads.get(principal, id).await {
            Ok(r) if r.is_finished() && r.length.is_some() => {}
            Ok(r) => incomplete.push((id, r.offset)),
            Err(e) if matches!(e.code, ErrorCode::NotFound | ErrorCode::UploadExpired) => unknown.push(id),
            Err(e) => return Err(e),
        }
    }
    if !unknown.is_empty() {
        let list = name_ids(&unknown);
        let what = if unknown.len() == 1 { "id" } else { "ids" };
        return Err(Refusal::new(
            404,
            ErrorCode::NotFound,
            format!("{kind}: unknown file {what}: {list}"),
            Next::UnknownFiles { ids: list, many: unknown.len() > 1 },
        ));
    }
    if !incomplete.is_empty() {
        let ids: Vec<&str> = incomplete.iter().map(|(id, _)| *id).collect();
        let list = name_ids(&ids);
        let mut e = Refusal::new(
            409,
            ErrorCode::UploadIncomplete,
            if ids.len() == 1 { format!("{kind}: file {list} is not complete") } else { format!("{kind}: files {list} are not complete") },
            Next::UnfinishedFiles { ids: list },
        );
        if let [(_, offset)] = incomplete[..] {
            e = e.with_cursor(offset);
        }
        return Err(e);
    }
    Ok(())
}

/// Where a resumable built-in job starts, from the checkpoint it was given.
pub(crate) enum Resume<T> {
    /// The job already finished (it crashed between finishing its file and recording the
    /// result, which its last checkpoint holds as `{"result": …}`).
    Done(serde_json::Value),
    /// Continue from this checkpoint (`None`: from the start).
    From(Option<T>),
}

/// Decode `checkpoint` for job `kind` into [`Resume`].
pub(crate) fn resume<T: DeserializeOwned>(kind: &str, checkpoint: Option<serde_json::Value>) -> Result<Resume<T>, JobError> {
    match checkpoint {
        None => Ok(Resume::From(None)),
        Some(c) => match c.get("result") {
            Some(done) => Ok(Resume::Done(done.clone())),
            None => serde_json::from_value(c).map(|cp| Resume::From(Some(cp))).map_err(|e| JobError::Internal(format!("{kind} checkpoint: {e}"))),
        },
    }
}

#[cfg(test)]
mod args_schema_tests {
    use super::*;

    /// Every built-in kind's args schema is a JSON Schema (a start never runs without it), and
    /// the arguments each kind's tests take as valid fit it.
    #[test]
    fn every_kinds_args_schema_compiles_and_admits_valid_args() {
        let spec = CommandSpec {
            program: "/bin/true".into(),
            args: vec![],
            output_name: None,
            media_type: None,
            cwd: None,
            env: vec![],
            description: None,
            params_schema: Some(serde_json::json!({ "type": "object", "required": ["month"], "properties": { "month": { "type": "string" } } })),
        };
        let jobs: Vec<(Arc<dyn Job>, serde_json::Value)> = vec![
            (Arc::new(archive::ArchiveJob), serde_json::json!({ "file_ids": ["a"], "format": "tar" })),
            (Arc::new(compress::CompressJob), serde_json::json!({ "file": "a", "format": "gzip", "level": 9 })),
            (Arc::new(fetch::FetchJob::new(Default::default())), serde_json::json!({ "url": "http://example.com/a", "name": null })),
            (
                Arc::new(command::CommandJob::new(std::collections::BTreeMap::from([("orders".to_string(), spec)]))),
                serde_json::json!({ "command": "orders", "params": { "month": "x" } }),
            ),
        ];
        for (job, valid) in jobs {
            let schema = job.args_schema().unwrap_or_else(|| panic!("{} has an args schema", job.kind()));
            let v = jsonschema::validator_for(&schema).unwrap_or_else(|e| panic!("{}: {e}", job.kind()));
            assert!(v.is_valid(&valid), "{}: {valid}", job.kind());
            assert!(!v.is_valid(&serde_json::Value::Null), "{}: null args", job.kind());
        }
    }
}
