//! Generated catalog records for property tests (issue 23, kind 1): every state a task or an
//! upload record can hold — each status, with and without progress members, input requests
//! (answered or not), results, errors, checkpoints — so the views built from them are checked
//! against their published schemas in states no test lists by hand.

use std::collections::BTreeMap;

use proptest::collection::{btree_map, vec};
use proptest::option;
use proptest::prelude::*;
use serde_json::{json, Value};

use crate::catalog::{Concat, Progress, TaskRecord, TaskStatus, UploadRecord};
use crate::error::ErrorCode;

/// Any JSON value, a few levels deep (what a job may store as a result or a request).
pub fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        (0.0f64..1e9).prop_map(|f| json!(f)),
        "[a-z ]{0,8}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..3).prop_map(Value::Array),
            btree_map("[a-z]{1,6}", inner, 0..3).prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Progress as jobs and `external` producers record it: every member optional.
pub fn progress() -> impl Strategy<Value = Progress> {
    (option::of(0.0f64..=1.0), option::of("[a-z. 0-9]{0,12}"), btree_map("[a-z_]{1,8}", any::<u64>(), 0..3))
        .prop_map(|(fraction, message, counters)| Progress { fraction, message, counters })
}

fn status() -> impl Strategy<Value = TaskStatus> {
    prop_oneof![
        Just(TaskStatus::Working),
        Just(TaskStatus::InputRequired),
        Just(TaskStatus::Completed),
        Just(TaskStatus::Failed),
        Just(TaskStatus::Cancelled)
    ]
}

/// A file handle as built-in kinds store it in a result (`{"id", "name", …}`).
fn stored_handle() -> impl Strategy<Value = Value> {
    "[a-z0-9]{26}".prop_map(|id| json!({ "id": id, "name": "x.tar", "media_type": "application/x-tar", "size": 3, "sha256": "00" }))
}

/// A completed task's result: a built-in kind's `{"file", …}`, an `external` one's
/// `{"files": […], "result"}`, or any JSON.
fn result() -> impl Strategy<Value = Option<String>> {
    let built_in = (stored_handle(), json_value()).prop_map(|(f, extra)| json!({ "file": f, "members": extra }).to_string());
    let external = (vec(stored_handle(), 0..3), json_value()).prop_map(|(fs, r)| json!({ "files": fs, "result": r }).to_string());
    option::of(prop_oneof![built_in, external, json_value().prop_map(|v| v.to_string())])
}

/// A failed task's stored error: `{code, message}` with any catalogue code, another word,
/// or not JSON at all.
fn error() -> impl Strategy<Value = Option<String>> {
    let code = prop_oneof![proptest::sample::select(ErrorCode::ALL.iter().map(|c| c.as_str().to_string()).collect::<Vec<_>>()), "[a-z_]{1,10}"];
    let e = prop_oneof![
        (code, "[a-z ]{0,20}").prop_map(|(c, m)| json!({ "code": c, "message": m }).to_string()),
        "[a-z ]{0,20}".prop_map(|m| json!({ "message": m }).to_string()),
        Just("not json".to_string()),
    ];
    option::of(e)
}

/// A job checkpoint, with or without a byte cursor.
fn checkpoint() -> impl Strategy<Value = Option<String>> {
    option::of(prop_oneof![any::<u64>().prop_map(|o| json!({ "cursor": { "offset": o } }).to_string()), json_value().prop_map(|v| v.to_string())])
}

/// Input requests (key → request with optional `message`/`schema`) and a subset answered.
fn inputs() -> impl Strategy<Value = (String, String)> {
    let request = prop_oneof![
        json_value(),
        ("[a-z ]{0,10}", any::<bool>()).prop_map(|(m, with_schema)| {
            let mut r = json!({ "message": m });
            if with_schema {
                r["schema"] = json!({ "type": "object", "properties": { "ok": { "type": "boolean" } }, "required": ["ok"] });
            }
            r
        }),
    ];
    btree_map("[a-z]{1,5}", (request, any::<bool>()), 0..3).prop_map(|m| {
        let requests: BTreeMap<&String, &Value> = m.iter().map(|(k, (r, _))| (k, r)).collect();
        let answered: BTreeMap<&String, bool> = m.iter().filter(|(_, (_, a))| *a).map(|(k, _)| (k, true)).collect();
        (serde_json::to_string(&requests).unwrap(), serde_json::to_string(&answered).unwrap())
    })
}

/// Any task record the catalog can hold: fresh, after a restart (runs > 1, a checkpoint), in
/// every status, with every optional member present or not.
pub fn task_record() -> impl Strategy<Value = TaskRecord> {
    (
        ("[a-z0-9]{26}", prop_oneof![Just("archive"), Just("compress"), Just("fetch"), Just("command"), Just("external")], status()),
        (option::of("[a-z ]{0,12}"), progress(), checkpoint(), inputs()),
        (result(), error(), option::of("[a-z0-9]{26}"), option::of("[a-z0-9-]{1,12}")),
        (0i64..i64::MAX / 4, 0i64..1_000_000_000, 0u64..5),
    )
        .prop_map(
            |(
                (id, kind, status),
                (status_message, progress, checkpoint, (input_requests, input_responses)),
                (result, error, prior_failure, idempotency_key),
                (created, ttl, runs),
            )| TaskRecord {
                id,
                principal: "local".into(),
                kind: kind.into(),
                args: "{}".into(),
                idempotency_key,
                status,
                status_message,
                progress,
                checkpoint,
                input_requests,
                input_responses,
                result,
                error,
                prior_failure,
                created_at_ms: created,
                updated_at_ms: created,
                ttl_ms: ttl,
                lease_owner: None,
                lease_expires_ms: None,
                fence: runs,
                runs,
                partial_seq: 0,
                partial_dropped: 0,
                partial_mark: 0,
            },
        )
}

/// Upload-Metadata text: a file name and media type or not, keys without values, and a value
/// that is not UTF-8.
fn metadata() -> impl Strategy<Value = String> {
    use base64::Engine as _;
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    (option::of("[a-zA-Z0-9 ._-]{1,12}"), option::of(prop_oneof![Just("text/plain"), Just("application/pdf")]), any::<bool>(), any::<bool>())
        .prop_map(move |(name, media, bare, binary)| {
            let mut pairs = Vec::new();
            if let Some(n) = name {
                pairs.push(format!("filename {}", b64(n.as_bytes())));
            }
            if let Some(m) = media {
                pairs.push(format!("filetype {}", b64(m.as_bytes())));
            }
            if bare {
                pairs.push("flag".into());
            }
            if binary {
                pairs.push(format!("raw {}", b64(&[0xff, 0xfe, 0, b'a'])));
            }
            pairs.join(",")
        })
}

/// Any upload record: unfinished (length known or deferred), finishing, finished, expired.
pub fn upload_record() -> impl Strategy<Value = UploadRecord> {
    (
        "[a-z0-9]{26}",
        option::of(0u64..1 << 40),
        0u64..1 << 40,
        metadata(),
        any::<bool>(),
        option::of(0i64..i64::MAX / 4),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(id, length, offset, metadata, finished, expires, expired, at_end)| {
            let offset = match length {
                Some(l) if at_end || finished => l,
                Some(l) => offset.min(l),
                None => offset,
            };
            let finished = finished && length.is_some();
            UploadRecord {
                id,
                principal: "local".into(),
                length,
                offset,
                metadata,
                hash_state: Vec::new(),
                sha256: finished.then_some([7; 32]),
                expected_sha256: None,
                concat: Concat::None,
                created_at_ms: 1,
                updated_at_ms: 1,
                expires_at_ms: expires,
                finished_at_ms: finished.then_some(2),
                expired,
                blob_state: Vec::new(),
                // A provisional upload is never shown to a client (issue 23 item 4).
                provisional: false,
            }
        })
}
