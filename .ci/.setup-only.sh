#!/usr/bin/env bash
# CI entry point (`bash .ci/run` from the repo root, as root, on a fresh Debian machine).
# Installs what the tests drive — the real TUS clients (tus-js-client, tuspy, curl) — then runs
# the whole test suite. Every install step is idempotent and skipped when already satisfied.
set -euo pipefail

# The test commands. Keep in sync with README. The second reruns the TUS and task suites with
# every server's catalog in PostgreSQL (tests/common/mod.rs reads FERRY_TEST_CATALOG); the third
# reruns the TUS suites as several replicas run: catalog in PostgreSQL, bytes in S3 (moto)
# (FERRY_TEST_BLOBS=s3).
TEST_CMD='cargo nextest run --workspace --no-fail-fast'
PG_SUITES='tus_core tus_extensions tasks_api durability rufh events hooks mcp_facade quotas'
S3_SUITES='tus_core tus_extensions tasks_api durability rufh'
nextest_suites() { printf "cargo nextest run --no-fail-fast -E '%s'" "$(printf 'binary(%s) | ' "$@" | sed 's/ | $//')"; }
PG_TEST_CMD=$(nextest_suites $PG_SUITES)
S3_TEST_CMD=$(nextest_suites $S3_SUITES)

cd "$(dirname "${BASH_SOURCE[0]}")/.."
export DEBIAN_FRONTEND=noninteractive
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

log() { printf '==> %s\n' "$*"; }

APT_UPDATED=0
apt_install() {
  if [ "$APT_UPDATED" = 0 ]; then
    apt-get update -qq
    APT_UPDATED=1
  fi
  apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# --- Rust test runner --------------------------------------------------------------------
if ! cargo nextest --version >/dev/null 2>&1; then
  log "installing cargo-nextest (not found)"
  if ! cargo install cargo-nextest --locked --quiet; then
    log "cargo-nextest could not be installed; falling back to cargo test"
    TEST_CMD='cargo test --workspace --no-fail-fast'
    PG_TEST_CMD="cargo test --no-fail-fast $(printf -- '--test %s ' $PG_SUITES)"
    S3_TEST_CMD="cargo test --no-fail-fast $(printf -- '--test %s ' $S3_SUITES)"
  fi
fi

# --- curl --------------------------------------------------------------------------------
if ! command -v curl >/dev/null 2>&1; then
  log "installing curl"
  apt_install curl ca-certificates
fi

# --- nginx: tests/replicas_s3.rs runs README's round-robin configuration in front of three ---
# replicas (nginx -t, then a real nginx on a loopback port; the package's own service is not used).
if [ ! -x /usr/sbin/nginx ]; then
  log "installing nginx"
  apt_install nginx
fi

# --- openssl: tests/fetch_tls.rs makes a test CA and a server certificate with it ------------
if ! command -v openssl >/dev/null 2>&1; then
  log "installing openssl"
  apt_install openssl
fi

# --- util-linux: tests/limits.rs starts ferry under prlimit; tests/exhaustion.rs mounts a ---
# small tmpfs as the data dir (CI runs as root) to fill the disk for real.
if ! command -v prlimit >/dev/null 2>&1 || ! command -v mount >/dev/null 2>&1; then
  log "installing util-linux + mount (prlimit, mount)"
  apt_install util-linux mount
fi

# --- systemd-analyze: tests/operations.rs checks deploy/ferry.service with `systemd-analyze ---
# verify` and `security --offline` against a root of its own (no running systemd is needed; the
# container has none). Debian's `systemd` package brings the tool and the unit directory.
if ! command -v systemd-analyze >/dev/null 2>&1 || [ ! -f /usr/lib/systemd/system/sysinit.target ]; then
  log "installing systemd (systemd-analyze)"
  apt_install systemd
fi

# --- Node.js + tus-js-client -------------------------------------------------------------
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  log "installing nodejs + npm"
  apt_install nodejs npm
fi
log "node $(node --version); npm ci in tests/clients/node"
(cd tests/clients/node && npm ci --no-audit --no-fund --loglevel=error >/dev/null)

# --- The web pages' bundle (web/): rebuilt from its locked sources, it must equal the committed
# web/dist that the binary embeds (src/http/web.rs). Fails when someone changed web/src or the
# lock without running `(cd web && npm ci && npm run build)`.
log "npm ci + build in web/; web/dist must match its sources"
(cd web && npm ci --no-audit --no-fund --loglevel=error >/dev/null && npm run --silent build)
if ! git diff --exit-code --stat -- web/dist; then
  echo "web/dist differs from what web/src builds: run (cd web && npm ci && npm run build) and commit web/dist" >&2
  exit 1
fi
if [ -n "$(git ls-files --others --exclude-standard -- web/dist)" ]; then
  echo "web/dist has files the repository does not: commit them" >&2
  git ls-files --others --exclude-standard -- web/dist >&2
  exit 1
fi

# --- Python venv + tuspy -----------------------------------------------------------------
PY_DIR=tests/clients/python
if ! command -v python3 >/dev/null 2>&1; then
  log "installing python3"
  apt_install python3 python3-venv
fi
if [ ! -x "$PY_DIR/.venv/bin/python" ]; then
  log "creating $PY_DIR/.venv"
  if ! python3 -m venv "$PY_DIR/.venv" 2>/dev/null; then
    rm -rf "$PY_DIR/.venv"
    apt_install python3-venv
    python3 -m venv "$PY_DIR/.venv"
  fi
fi
log "pip install -r $PY_DIR/requirements.txt"
"$PY_DIR/.venv/bin/python" -m pip install -q --disable-pip-version-check -r "$PY_DIR/requirements.txt"

# --- Local S3 for the S3 blob store tests (tests/s3.rs): moto's server in the same venv ------
log "pip install -r $PY_DIR/requirements-s3.txt"
"$PY_DIR/.venv/bin/python" -m pip install -q --disable-pip-version-check -r "$PY_DIR/requirements-s3.txt"

# --- Chromium (tests/interop_uppy.rs: Uppy in a headless browser via playwright-core) ----
if [ ! -x /usr/bin/chromium ]; then
  log "installing chromium"
  apt_install chromium
fi

# --- MCP clients (tests/mcp_python.rs): Python `mcp` in the same venv, TypeScript SDK -------
log "pip install -r $PY_DIR/requirements-mcp.txt"
"$PY_DIR/.venv/bin/python" -m pip install -q --disable-pip-version-check -r "$PY_DIR/requirements-mcp.txt"
# --- schemathesis (tests/openapi.rs): property-based requests from /api/v1/openapi.json -----
log "pip install -r $PY_DIR/requirements-openapi.txt"
"$PY_DIR/.venv/bin/python" -m pip install -q --disable-pip-version-check -r "$PY_DIR/requirements-openapi.txt"
log "npm ci in tests/clients/mcp-ts"
(cd tests/clients/mcp-ts && npm ci --no-audit --no-fund --loglevel=error >/dev/null)

# --- Format and lints (before the tests: a style failure is cheap to report) ---------------
# rustfmt and clippy are rustup components; add them only when the toolchain lacks them.
for component in rustfmt clippy; do
  if ! rustup component list --installed 2>/dev/null | grep -q "^${component}"; then
    log "installing rustup component $component"
    rustup component add "$component"
  fi
done
log "cargo fmt --all -- --check"
log "cargo clippy --workspace --all-targets -- -D warnings"

# --- PostgreSQL 15 (catalog conformance, the PostgreSQL reruns, tests/replicas.rs) ---------
# The cluster Debian's postgresql-15 package creates; a role `ferry` with a password and
# CREATEDB (tests create a database each), reached over TCP on 127.0.0.1 (scram).
PG_ROLE_PASSWORD=ferry-ci
if [ ! -x /usr/lib/postgresql/15/bin/postgres ]; then
  log "installing postgresql-15"
  apt_install postgresql-15
fi
if ! pg_ctlcluster 15 main status >/dev/null 2>&1; then
  log "starting PostgreSQL 15 (cluster 15/main)"
  pg_ctlcluster 15 main start
fi
for _ in $(seq 1 60); do
  pg_isready -q -h 127.0.0.1 -p 5432 && break
  sleep 0.5
done
pg_isready -h 127.0.0.1 -p 5432
as_postgres() { (cd / && su postgres -c "$1"); }
as_postgres "psql -v ON_ERROR_STOP=1 -q" <<SQL
DO \$\$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'ferry') THEN
    CREATE ROLE ferry LOGIN CREATEDB PASSWORD '$PG_ROLE_PASSWORD';
  ELSE
    ALTER ROLE ferry LOGIN CREATEDB PASSWORD '$PG_ROLE_PASSWORD';
  END IF;
END \$\$;
SQL
export FERRY_TEST_PG="postgres://ferry:$PG_ROLE_PASSWORD@127.0.0.1:5432/postgres"
log "PostgreSQL ready; FERRY_TEST_PG=postgres://ferry:***@127.0.0.1:5432/postgres"

# Databases of test processes that are gone (each test drops its own; a killed one cannot).
drop_test_databases() {
  as_postgres "psql -At -c \"SELECT datname FROM pg_database WHERE datname LIKE 'ferry\\_test\\_%'\"" | while read -r db; do
    pid=${db#ferry_test_}; pid=${pid%%_*}
    if [ ! -d "/proc/$pid" ]; then
      as_postgres "psql -q -c 'DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)'" >/dev/null || true
    fi
  done
}

