//! Fuzz target: `upload_draft_interop_version` — see `ferry_tus::fuzzing::check`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    ferry_tus::fuzzing::check("upload_draft_interop_version", data);
});
