//! Replays every input kept under `fuzz/regressions/<target>/` through the same round-trip check
//! the cargo-fuzz target runs (`ferry_tus::fuzzing::check`), so crash inputs found by fuzzing
//! stay fixed.

use std::path::Path;

#[test]
fn replay_fuzz_regressions() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/regressions");
    let mut dirs: Vec<_> =
        std::fs::read_dir(&root).unwrap_or_else(|e| panic!("{}: {e}", root.display())).map(|e| e.unwrap().path()).filter(|p| p.is_dir()).collect();
    dirs.sort();
    let mut replayed = 0;
    for dir in &dirs {
        let target = dir.file_name().unwrap().to_str().unwrap();
        assert!(ferry_tus::fuzzing::TARGETS.contains(&target), "fuzz/regressions/{target} names no fuzz target");
        let mut files: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
        files.sort();
        for file in files {
            if file.file_name().is_some_and(|n| n == ".gitkeep") {
                continue;
            }
            let data = std::fs::read(&file).unwrap();
            let result = std::panic::catch_unwind(|| ferry_tus::fuzzing::check(target, &data));
            assert!(result.is_ok(), "regression input {} failed its round trip", file.display());
            replayed += 1;
        }
    }
    for t in ferry_tus::fuzzing::TARGETS {
        assert!(root.join(t).is_dir(), "fuzz/regressions/{t} is missing");
    }
    assert!(replayed > 0, "no regression inputs found under {}", root.display());
}
