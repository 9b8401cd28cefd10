//! Fuzz target: `plan_creation` — a decision over structured states and requests; see
//! `ferry_tus::fuzzing::check`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    ferry_tus::fuzzing::check("plan_creation", data);
});
