//! Where the test clients' Python virtual environment is (shared with benches/s3.rs, which
//! includes this file by path).

use std::path::PathBuf;

/// The Python virtual environment the test clients run in (tuspy, moto, `mcp`, schemathesis):
/// `FERRY_PY_VENV`, else `ferry-python-venv` in the temp dir (`$TMPDIR` or `/tmp`) — outside the
/// checkout, so the tree holds no path of one machine. `bash .ci/run` creates it there from
/// tests/clients/python/requirements*.txt.
pub fn python_venv() -> PathBuf {
    std::env::var_os("FERRY_PY_VENV").map(PathBuf::from).unwrap_or_else(|| std::env::temp_dir().join("ferry-python-venv"))
}

/// Program `name` of [`python_venv`] (`python`, `moto_server`, `st`…); panics naming how to
/// install it when it is missing.
pub fn venv_bin(name: &str) -> PathBuf {
    let bin = python_venv().join("bin").join(name);
    assert!(
        bin.exists(),
        "{} is missing: run `bash .ci/run`, or `python3 -m venv {venv}` and `{venv}/bin/pip install \
         -r tests/clients/python/requirements.txt` (and requirements-s3, -mcp, -openapi .txt)",
        bin.display(),
        venv = python_venv().display()
    );
    bin
}
