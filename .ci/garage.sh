#!/usr/bin/env bash
# A single-node Garage (https://garagehq.deuxfleurs.fr, crates.io `garage` 2.5.0): a real S3
# server that checks every signature, presigned ones included, unlike moto. A test service only
# (AGPL): never linked into ferry.
#
#   . .ci/garage.sh; garage_up   (what .ci/run does) installs garage when it is missing, starts
#       one on loopback (or reuses the one this script left running) and sets GARAGE_ENV, a file
#       of exports for the tests: FERRY_TEST_S3_ENDPOINT, FERRY_TEST_S3_BUCKET,
#       FERRY_TEST_S3_ACCESS_KEY_ID, FERRY_TEST_S3_SECRET_ACCESS_KEY, FERRY_TEST_S3_REGION
#       (`. "$GARAGE_ENV"` where they are wanted), and GARAGE_PID to the server's PID when it
#       started one (the caller stops it at exit; empty when reused).
#   bash .ci/garage.sh   the same, left running; prints the exports and how to stop it.
#
# Settings (environment): FERRY_CI_GARAGE_PORT (S3 API, default 3900; RPC is +1, admin +3),
# FERRY_CI_GARAGE_DIR (config, metadata and data; default ${TMPDIR:-/tmp}/ferry-ci-garage,
# emptied whenever a new server starts), FERRY_CI_GARAGE_BUCKET (default ferry-ci).

garage_log() { printf '==> garage: %s\n' "$*" >&2; }

# Installs the binary (into ~/.cargo/bin, which is the cache) only when `garage` is missing.
# No default features: no LMDB, no metrics/telemetry, no Kubernetes or Consul discovery;
# bundled-libs builds libsodium from source (no -dev package), sqlite is the metadata engine.
garage_install() {
  if command -v garage >/dev/null 2>&1; then
    return 0
  fi
  if [ -x "$HOME/.cargo/bin/garage" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
    return 0
  fi
  garage_log "installing garage 2.5.0 (not found; about 20 minutes on 2 cores)"
  local t0=$SECONDS
  # The build directory survives a cut-off install (the next one resumes from it) and goes once
  # the binary is in place: it holds gigabytes the tests then lack (`cargo install` keeps a
  # --target-dir it is given).
  local target="${TMPDIR:-/tmp}/garage-target"
  cargo install garage@2.5.0 --locked --no-default-features --features bundled-libs,sqlite --target-dir "$target"
  rm -rf "$target"
  garage_log "installed in $((SECONDS - t0)) s"
  export PATH="$HOME/.cargo/bin:$PATH"
}

# 32 random bytes as hex (rpc_secret, key secret).
garage_hex() { od -An -tx1 -N"$1" /dev/urandom | tr -d ' \n'; }

garage_up() {
  local t0=$SECONDS
  local port="${FERRY_CI_GARAGE_PORT:-3900}"
  local dir="${FERRY_CI_GARAGE_DIR:-${TMPDIR:-/tmp}/ferry-ci-garage}"
  local bucket="${FERRY_CI_GARAGE_BUCKET:-ferry-ci}"
  local s3="http://127.0.0.1:$port" admin="http://127.0.0.1:$((port + 3))"
  GARAGE_PID= GARAGE_ENV=
  garage_install || return 1

  # A server this script started earlier and left running (bash .ci/garage.sh): reuse it.
  if [ -f "$dir/pid" ] && [ -f "$dir/env" ] && kill -0 "$(cat "$dir/pid")" 2>/dev/null \
    && [ "$(curl -sS --noproxy '*' -o /dev/null -w '%{http_code}' "$admin/health" 2>/dev/null)" = 200 ]; then
    GARAGE_ENV="$dir/env"
    garage_log "reusing garage (PID $(cat "$dir/pid")) on $s3, bucket $(sed -n 's/.*FERRY_TEST_S3_BUCKET=//p' "$GARAGE_ENV")"
    return 0
  fi
  if curl -sS --noproxy '*' -o /dev/null "$s3/" 2>/dev/null; then
    garage_log "something else answers on $s3: set FERRY_CI_GARAGE_PORT to a free port"
    return 1
  fi

  rm -rf "$dir"
  mkdir -p "$dir/meta" "$dir/data"
  local key_id key_secret
  key_id="GK$(garage_hex 12)"
  key_secret="$(garage_hex 32)"
  cat >"$dir/garage.toml" <<EOF
metadata_dir = "$dir/meta"
data_dir = "$dir/data"
db_engine = "sqlite"
replication_factor = 1
# Test data: no zstd, so the CPU goes to ferry (benches/s3.rs measures on it).
compression_level = "none"
rpc_bind_addr = "127.0.0.1:$((port + 1))"
rpc_public_addr = "127.0.0.1:$((port + 1))"
rpc_secret = "$(garage_hex 32)"

[s3_api]
s3_region = "garage"
api_bind_addr = "127.0.0.1:$port"
root_domain = ".s3.garage.localhost"

[admin]
api_bind_addr = "127.0.0.1:$((port + 3))"
EOF
  # --single-node lays out this one node; --default-bucket imports the key and creates the
  # bucket with read, write and owner rights for it (all idempotent on a restart of $dir).
  GARAGE_DEFAULT_ACCESS_KEY="$key_id" GARAGE_DEFAULT_SECRET_KEY="$key_secret" GARAGE_DEFAULT_BUCKET="$bucket" \
    RUST_LOG="${FERRY_CI_GARAGE_LOG:-warn}" \
    garage -c "$dir/garage.toml" server --single-node --default-bucket >"$dir/garage.log" 2>&1 &
  GARAGE_PID=$!
  echo "$GARAGE_PID" >"$dir/pid"
  # /health answers 200 once the layout is applied and every partition has its node.
  local i
  for i in $(seq 1 240); do
    [ "$(curl -sS --noproxy '*' -o /dev/null -w '%{http_code}' "$admin/health" 2>/dev/null)" = 200 ] && break
    if ! kill -0 "$GARAGE_PID" 2>/dev/null; then
      garage_log "garage exited; $dir/garage.log:"
      cat "$dir/garage.log" >&2
      GARAGE_PID=
      return 1
    fi
    sleep 0.25
  done
  if [ "$i" = 240 ]; then
    garage_log "garage did not become healthy within 60 s; $dir/garage.log:"
    cat "$dir/garage.log" >&2
    return 1
  fi
  cat >"$dir/env" <<EOF
export FERRY_TEST_S3_ENDPOINT=$s3
export FERRY_TEST_S3_BUCKET=$bucket
export FERRY_TEST_S3_ACCESS_KEY_ID=$key_id
export FERRY_TEST_S3_SECRET_ACCESS_KEY=$key_secret
export FERRY_TEST_S3_REGION=garage
EOF
  GARAGE_ENV="$dir/env"
  garage_log "$(garage --version 2>/dev/null) (PID $GARAGE_PID) on $s3, bucket $bucket, ready in $((SECONDS - t0)) s; log $dir/garage.log"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  garage_up
  cat "$GARAGE_ENV"
  echo "# stop it: kill $(cat "$(dirname "$GARAGE_ENV")/pid")" >&2
fi
