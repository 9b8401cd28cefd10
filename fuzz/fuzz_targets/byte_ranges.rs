//! Fuzz target: `byte_ranges` — parse arbitrary input as `Range`; on success assert
//! parse(display(x)) == x and that every range resolves inside any length.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    ferry_tus::fuzzing::check("byte_ranges", data);
});
