//! `check`: [`crate::check`] in the background, at a chosen rate — re-reads the task
//! principal's finished files and compares each with its stored sha256.
//!
//! Args: `{"file_ids": [ids…] (default: every finished file of the principal), "rate":
//! bytes per second (default: no limit), "repair_catalog": bool (default false), "orphans":
//! bool (default false)}`. Only the principal's own files are read (ids of other principals'
//! files are `skipped` as `unknown`, as they do not exist for it). With `orphans` the store is
//! also searched for orphans; as those belong to nobody the result gives only their counts.
//!
//! Result: the [`crate::check::CheckReport`] (with `orphan_blobs` / `orphan_multiparts` as
//! counts). Resumable: the checkpoint after each file is `{"after": id, "report": …}`, so a
//! restarted run skips what it checked. `/metrics` counts files, bytes and findings
//! (`ferry_check_*`).

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::check::{CheckOptions, CheckReport, Checker, Observer};
use crate::metrics::FindingLabel;
use crate::tasks::{Job, JobContext, JobError};

pub struct CheckJob;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    #[serde(default)]
    file_ids: Vec<String>,
    #[serde(default)]
    rate: Option<u64>,
    #[serde(default)]
    repair_catalog: bool,
    #[serde(default)]
    orphans: bool,
}

#[derive(Serialize, Deserialize)]
struct Cursor {
    after: String,
    report: CheckReport,
}

struct Count<'a>(&'a crate::metrics::Metrics);

impl Observer for Count<'_> {
    fn read(&self, n: u64) {
        self.0.check_bytes_read.inc_by(n);
    }
}

#[async_trait]
impl Job for CheckJob {
    fn kind(&self) -> &str {
        "check"
    }

    fn args_schema(&self) -> Option<serde_json::Value> {
        Some(serde_json::json!({
            "type": "object",
            "properties": {
                "file_ids": {
                    "type": "array",
                    "items": { "type": "string", "minLength": 1 },
                    "description": "Finished uploads to re-read; default: every finished file of yours."
                },
                "rate": { "type": ["integer", "null"], "minimum": 1, "description": "Most bytes read per second; default: no limit." },
                "repair_catalog": {
                    "type": "boolean",
                    "description": "Mark damaged files so downloads answer 500 damaged (and clear the mark of files found whole)."
                },
                "orphans": { "type": "boolean", "description": "Also count blobs and S3 multipart uploads no upload references." }
            },
            "additionalProperties": false
        }))
    }

    fn validate(&self, args: &RawValue) -> Result<(), String> {
        serde_json::from_str::<Args>(args.get()).map(|_| ()).map_err(|e| e.to_string())
    }

    async fn run(&self, ctx: &JobContext, args: &RawValue, checkpoint: Option<serde_json::Value>) -> Result<serde_json::Value, JobError> {
        let a: Args = serde_json::from_str(args.get()).map_err(|e| JobError::failed(e.to_string()))?;
        let (after, mut report) = match checkpoint {
            Some(c) => {
                let c: Cursor = serde_json::from_value(c).map_err(|e| JobError::Internal(format!("check checkpoint: {e}")))?;
                (c.after, c.report)
            }
            None => (String::new(), CheckReport::default()),
        };
        let engine = ctx.uploads();
        let metrics = engine.metrics.clone();
        let checker = Checker::new(
            engine.catalog.clone(),
            engine.blobs.clone(),
            CheckOptions { ids: a.file_ids.clone(), repair_catalog: a.repair_catalog, rate: a.rate, principal: Some(ctx.principal().to_string()) },
        );
        let mut skipped = CheckReport::default();
        let targets = checker.targets(&mut skipped).await.map_err(internal)?;
        if after.is_empty() {
            report.skipped = skipped.skipped;
        }
        let total: u64 = targets.iter().map(|t| t.size).sum::<u64>().max(1);
        let mut done: u64 = targets.iter().filter(|t| t.id <= after).map(|t| t.size).sum();
        let mut pace = checker.pace();
        for t in targets.iter().filter(|t| t.id > after) {
            ctx.check()?;
            let before = (report.mismatched.len(), report.missing.len(), report.files_checked);
            checker.check_one(t, &mut report, &mut pace, &Count(&metrics)).await.map_err(internal)?;
            metrics.check_files.inc_by(report.files_checked - before.2);
            metrics.check_findings.get_or_create(&FindingLabel { kind: "sha256_mismatch" }).inc_by((report.mismatched.len() - before.0) as u64);
            metrics.check_findings.get_or_create(&FindingLabel { kind: "missing" }).inc_by((report.missing.len() - before.1) as u64);
            done += t.size;
            let counters =
                [("files_checked", report.files_checked), ("mismatched", report.mismatched.len() as u64), ("missing", report.missing.len() as u64)];
            ctx.progress(Some(done as f64 / total as f64), Some("re-reading finished files"), &counters).await?;
            ctx.checkpoint(&Cursor { after: t.id.clone(), report: report.clone() }).await?;
        }
        let mut orphans = CheckReport::default();
        if a.orphans {
            ctx.check()?;
            checker.orphans(&mut orphans).await.map_err(internal)?;
            metrics.check_findings.get_or_create(&FindingLabel { kind: "orphan_blob" }).inc_by(orphans.orphan_blobs.len() as u64);
            metrics.check_findings.get_or_create(&FindingLabel { kind: "orphan_multipart" }).inc_by(orphans.orphan_multiparts.len() as u64);
        }
        let mut out = serde_json::to_value(&report).map_err(|e| JobError::Internal(e.to_string()))?;
        out["orphans_searched"] = serde_json::json!(a.orphans);
        out["orphan_blobs"] = serde_json::json!(orphans.orphan_blobs.len());
        out["orphan_multiparts"] = serde_json::json!(orphans.orphan_multiparts.len());
        // Like orphans, a count: they are found across the store, not among this principal's files.
        out["leftovers"] = serde_json::json!(orphans.leftovers.len());
        Ok(out)
    }
}

fn internal(e: crate::check::CheckError) -> JobError {
    JobError::Internal(e.to_string())
}
