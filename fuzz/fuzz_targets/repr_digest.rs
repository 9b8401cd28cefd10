//! Fuzz target: `repr_digest` — parse arbitrary input; on success assert parse(display(x)) == x.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    ferry_tus::fuzzing::check("repr_digest", data);
});
