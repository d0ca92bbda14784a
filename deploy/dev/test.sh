#!/usr/bin/env bash
# The test command: formatting, lints, layering checks, contract drift, the
# compose file, and the whole test suite against real Postgres and NATS
# JetStream. Uses DATABASE_URL / NATS_URL when set; otherwise starts
# throwaway instances (deploy/dev/stack.sh) and stops them afterwards.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cd "$repo"

# Each step says when it started and how long the run has taken so far,
# so a slow step shows in the log.
step() { echo "==> [$(date +%T), ${SECONDS}s in] $*"; }

step "toolchain components"
rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt
rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy

# What this run started, stopped at its end whatever happens.
own_stack=""
prep_pid=""
prep_dir=""
static_pid=""
static_dir=""
finish() {
  # The static build is stopped, its whole process group (cargo and its
  # rustc jobs); the installers are waited for rather than killed midway
  # (an interrupted dpkg would stop the next run's apt-get).
  if [ -n "$static_pid" ]; then
    kill -TERM -- "-$static_pid" 2>/dev/null || true
    wait "$static_pid" 2>/dev/null || true
  fi
  if [ -n "$static_dir" ]; then rm -rf "$static_dir"; fi
  if [ -n "$prep_pid" ]; then wait "$prep_pid" 2>/dev/null || true; fi
  if [ -n "$prep_dir" ]; then rm -rf "$prep_dir"; fi
  if [ -n "$own_stack" ]; then "$here/stack.sh" down; rm -rf "$BCM_STACK_DIR"; fi
}
trap finish EXIT

if [ -z "${DATABASE_URL:-}" ] || [ -z "${NATS_URL:-}" ]; then
  export BCM_STACK_DIR="${BCM_STACK_DIR:-$(mktemp -d /tmp/bcm-test-stack.XXXXXX)}"
  export BCM_STACK_PG_PORT="${BCM_STACK_PG_PORT:-55433}" BCM_STACK_NATS_PORT="${BCM_STACK_NATS_PORT:-14223}"
  own_stack=1
  step "throwaway Postgres and NATS in $BCM_STACK_DIR"
  stack_env="$("$here/stack.sh" env)"
  eval "$stack_env"
fi

# The parts that install and validate (apt, pip, npm: they mostly wait on
# downloads) run in the background while clippy compiles; their output is
# printed once they are done.
step "in the background: the compose file, the documents, the real BMC peers, the PXE boot test's parts"
prep_dir="$(mktemp -d /tmp/bcm-test-prep.XXXXXX)"
(
  set -euo pipefail
  prep_step() { echo "==> [$(date +%T)] $*"; }
  prep_step "docker-compose config"
  command -v docker-compose >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-compose; }
  docker-compose -f docker-compose.yml config -q

  prep_step "documents: OpenAPI (openapi-spec-validator), AsyncAPI and its \$refs (@asyncapi/parser), example events (CloudEvents SDK), Nomad jobs (HCL2, against compose)"
  "$repo/tests/deploy/validate-documents.sh"

  prep_step "real BMC peers: sushy-tools' Redfish emulator, ipmi_sim"
  "$repo/tests/peers/install.sh" > "$prep_dir/peers.env"

  prep_step "PXE boot test: QEMU, OVMF, iPXE, dnsmasq; a Debian kernel and a busybox ramdisk"
  "$repo/tests/boot-e2e/build.sh" > "$prep_dir/boot-e2e.env"
) > "$prep_dir/log" 2>&1 &
prep_pid=$!

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy -D warnings"
cargo clippy --workspace --all-targets -q -- -D warnings

step "layers: services depend on shared crates only, shared on no service, bcd links no NATS, core and contracts do no I/O"
cargo run -q -p bcm-layers --bin check-layers

step "layers: no SQL outside shared/db, no subject literal outside shared/bus"
if grep -rnE 'sqlx::query|PgConnection' --include='*.rs' services shared | grep -v '^shared/db/'; then
  echo "SQL belongs in the db crate" >&2; exit 1
fi
# (shared/contracts spells the CloudEvents type names and schema files,
# which look like subjects but are not.)
if grep -rnE '"(events|work|cmd|result|dlq)\.[a-z{]' --include='*.rs' services shared | grep -vE '^shared/(bus|contracts)/'; then
  echo "subjects belong in the bus crate" >&2; exit 1
fi

step "layers: only the bmc service opens credentials"
if grep -rnE 'open_credentials|\.open\(&sealed' --include='*.rs' services shared | grep -vE '^(shared/seal|services/bmc)/|/tests/'; then
  echo "credentials are opened only inside services/bmc" >&2; exit 1
fi

step "the background parts: waiting for them"
prep_ok=1
wait "$prep_pid" || prep_ok=""
prep_pid=""
cat "$prep_dir/log"
[ -n "$prep_ok" ] || { echo "a background part failed (above)" >&2; exit 1; }
eval "$(cat "$prep_dir/peers.env")"
eval "$(cat "$prep_dir/boot-e2e.env")"

step "tests (Postgres $DATABASE_URL, NATS ${NATS_URL/\/\/*@/\/\/})"
# cargo-nextest (on the machine; .config/nextest.toml, profile `ci`) runs
# the tests of every binary side by side, each in its own process, and
# prints the failures again at the end. Without it, cargo test runs them a
# binary at a time. (No crate has a doc test.)
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --profile ci
else
  test_log="$(mktemp /tmp/bcm-cargo-test.XXXXXX)"
  if ! cargo test --workspace --no-fail-fast --lib --bins --tests 2>&1 | tee "$test_log"; then
    echo "==> cargo test failed; the failures again:"
    awk '/^ *Running /{running=$0; shown=0}
         / \.\.\. FAILED$|panicked at|^error: /{if (!shown) {print running; shown=1}; n=5}
         n>0 {print; n--}' "$test_log" | tail -n 300
    rm -f "$test_log"
    exit 1
  fi
  rm -f "$test_log"
fi

step "the ramdisk's static bcd (a release build for the end-to-end run), in the background beside the conformance and chaos runs, which mostly wait"
static_dir="$(mktemp -d /tmp/bcm-static-bcd.XXXXXX)"
# (In a process group of its own, which the end of this script can stop.)
set -m
"$repo/deploy/bcd/build-static.sh" "$static_dir" > "$static_dir/build.log" 2>&1 < /dev/null &
static_pid=$!
set +m

step "API conformance: schemathesis against a running bcm from its OpenAPI document, then a generated Python client"
conformance_dir="$(mktemp -d /tmp/bcm-conformance.XXXXXX)"
"$repo/tests/conformance/run.sh" "$conformance_dir"
rm -rf "$conformance_dir"   # kept (and printed) only when the run failed

step "chaos: the control plane as separate processes, one SIGKILLed every 1.5 s, NATS and Postgres crashed once each; 12 machines to deployed and back"
cargo build -q -p bcm-allinone --bin bcm -p bcm-chaos --bin chaos
target/debug/chaos --nodes 12 --kill-every-ms 1500 --phase-timeout-secs 600

step "compose secrets: none committed; generated at first start (init-secrets.sh), and NATS takes the generated authorization"
if grep -nE '^ *admin_token *=|^ *key *= *"|POSTGRES_PASSWORD:|postgres://[^:/@]+:[^@]+@' docker-compose.yml deploy/config/*.compose.toml; then
  echo "a secret is committed in the compose set-up" >&2; exit 1
fi
secrets_dir="$(mktemp -d /tmp/bcm-compose-secrets.XXXXXX)"
BCM_SECRETS_DIR="$secrets_dir" PATH="$repo/target/debug:$PATH" sh deploy/compose/init-secrets.sh
(cd "$secrets_dir" && "${BCM_NATS_SERVER:-nats-server}" -c nats.conf -t)
rm -rf "$secrets_dir"

step "the ramdisk's static bcd: waiting for its build"
if ! wait "$static_pid"; then
  static_pid=""
  cat "$static_dir/build.log" >&2
  echo "the static bcd did not build" >&2; exit 1
fi
static_pid=""
tail -n 1 "$static_dir/build.log"

step "end to end: QEMU machines behind Redfish, PXE through bcm-boot into bcd, the whole control plane"
e2e_dir="$(mktemp -d /tmp/bcm-e2e.XXXXXX)"
BCD_BIN="$static_dir/bcd" "$repo/tests/e2e/run.sh" "$e2e_dir"
rm -rf "$e2e_dir"   # kept (and printed) only when the run failed
step "done"
