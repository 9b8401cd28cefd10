//! Fuzz target: `rufh_length` — see `ferry_tus::fuzzing::check`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    ferry_tus::fuzzing::check("rufh_length", data);
});
