#!/usr/bin/env bash
# The API conformance run, driven by the published document itself:
#
#  1. schemathesis (pinned, PyPI) generates requests from the OpenAPI
#     document a running `bcm` serves (every service and a simulated site):
#     examples, coverage, property-based fuzzing and stateful sequences that
#     follow the document's links (enroll -> read -> verbs on the node). It
#     asserts no 5xx, every status and body as documented, schema-invalid
#     requests refused with 400, schema-valid ones refused only for a reason
#     the document states, and (hooks.py) every error body's code.
#  2. openapi-python-client (pinned, PyPI) generates a Python client from
#     proto/openapi.json; client_test.py lists nodes, enrolls a simulated
#     machine, waits for ready and deploys it through that client.
#
# Needs DATABASE_URL and NATS_URL (the test command provides them).
# BCM_CONFORMANCE_REPORTS=junit,har also keeps every request and answer
# (a HAR file in the output dir) to find what a failure did. Usage:
# tests/conformance/run.sh [output dir]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="${1:-$(mktemp -d /tmp/bcm-conformance.XXXXXX)}"
mkdir -p "$out"
SCHEMATHESIS_VERSION="4.32.5"
CLIENT_GENERATOR_VERSION="0.29.1"
log() { echo "conformance: $*" >&2; }

venv="$repo/.bcm/venv-conformance"
if ! "$venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('schemathesis') != '$SCHEMATHESIS_VERSION' or m.version('openapi-python-client') != '$CLIENT_GENERATOR_VERSION')" 2>/dev/null; then
  log "installing schemathesis==$SCHEMATHESIS_VERSION and openapi-python-client==$CLIENT_GENERATOR_VERSION into $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check \
    "schemathesis==$SCHEMATHESIS_VERSION" "openapi-python-client==$CLIENT_GENERATOR_VERSION" >&2
fi

: "${DATABASE_URL:?DATABASE_URL is not set}" "${NATS_URL:?NATS_URL is not set}"
db="bcm_conformance_$$"
psql -q "$DATABASE_URL" -c "CREATE DATABASE $db" >/dev/null
db_url="${DATABASE_URL%/*}/$db"
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
addr="127.0.0.1:$port"
token="bcm_conformance_$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')"
key="$(head -c 32 /dev/urandom | base64)"
cat > "$out/bcm.toml" <<TOML
[api]
listen = "$addr"
database_url = "$db_url"
admin_token = "$token"

[api.bus]
url = "$NATS_URL"
namespace = "conformance$$"

[[api.sealing_keys]]
id = "conformance-1"
key = "$key"

[[api.seed.tenants]]
id = "root"
name = "Root"

[[api.seed.sites]]
id = "local"
name = "Local site (simulated)"

[[api.seed.pools]]
id = "default"
tenant = "root"
site = "local"
hardware_profile = "sim"

[[api.seed.deploy_profiles]]
tenant = "root"
profile = { id = "ubuntu-24.04", version = 1, role = "host", image = { url = "http://127.0.0.1:9/ubuntu-24.04.raw", format = "raw", sha256 = "5d5d5d5d5d5d5d5d5d5d5d5d5d5d5d5d5d5d5d5d5d5d5d5d5d5d5d5d5d5d5d5d", sizeBytes = 2361393152 } }

[reconciler]
metal_poll_ms = 2000

[api.tls]
cert_file = "$out/tls/api.crt"
key_file = "$out/tls/api.key"

[sim]
site = "local"
api_ca_file = "$out/tls/ca.crt"
TOML

(cd "$repo" && cargo build -q -p bcm-allinone --bin bcm)
# HTTPS from a local CA that every client here pins (curl, schemathesis
# through requests, the generated client through httpx).
"$repo/target/debug/bcm" local-tls --dir "$out/tls" --name 127.0.0.1 >/dev/null
ca="$out/tls/ca.crt"
export REQUESTS_CA_BUNDLE="$ca" SSL_CERT_FILE="$ca"
RUST_LOG="${RUST_LOG:-warn}" "$repo/target/debug/bcm" --config "$out/bcm.toml" --sim-machines 0 > "$out/bcm.log" 2>&1 &
bcm_pid=$!
cleanup() {
  kill -TERM "$bcm_pid" 2>/dev/null || true
  wait "$bcm_pid" 2>/dev/null || true
  psql -q "$DATABASE_URL" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true
}
trap cleanup EXIT
for _ in $(seq 1 300); do
  curl -fsS --cacert "$ca" "https://$addr/readyz" >/dev/null 2>&1 && break
  kill -0 "$bcm_pid" 2>/dev/null || { log "bcm exited; its log:"; cat "$out/bcm.log" >&2; exit 1; }
  sleep 0.2
done
curl -fsS --cacert "$ca" "https://$addr/readyz" >/dev/null

# The document the running API serves is the checked-in one.
curl -fsS --cacert "$ca" "https://$addr/api/openapi.json" > "$out/served-openapi.json"
python3 - "$out/served-openapi.json" "$repo/proto/openapi.json" <<'PY'
import json, sys
served, checked = (json.load(open(p)) for p in sys.argv[1:3])
assert served == checked, "the served OpenAPI document differs from proto/openapi.json"
PY

# An agent session for the agent endpoints: a machine adopted into the
# pool through a join token and an ed25519 CSR, as bcd would.
api() { curl -fsS --cacert "$ca" -H "Authorization: Bearer $token" -H 'Content-Type: application/json' "$@"; }
join_token="$(api -d '{"tenantId":"root","poolId":"default"}' "https://$addr/api/compute/metal/joinTokens" \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["token"])')"
openssl genpkey -algorithm ed25519 -out "$out/agent.key" 2>/dev/null
openssl req -new -key "$out/agent.key" -subj /CN=conformance -out "$out/agent.csr"
agent_session="$(python3 - "$join_token" "$out/agent.csr" <<'PY' | curl -fsS --cacert "$ca" -H 'Content-Type: application/json' -d @- "https://$addr/api/agent/join" \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["sessionToken"])'
import json, sys
print(json.dumps({"token": sys.argv[1], "csr": open(sys.argv[2]).read(), "role": "node", "hostname": "conformance-adopted"}))
PY
)"

# One worker: hypothesis describes its strategies with ast.parse, which
# CPython 3.11 does not make safe across threads ("AST constructor
# recursion depth mismatch" with two workers).
log "schemathesis against https://$addr (report in $out)"
started=$(date +%s)
set +e
(cd "$here" && BCM_ADMIN_TOKEN="$token" BCM_AGENT_SESSION="$agent_session" SCHEMATHESIS_HOOKS=hooks \
  "$venv/bin/schemathesis" --config-file "$here/schemathesis.toml" \
  run "https://$addr/api/openapi.json" \
  --checks all --max-examples "${BCM_CONFORMANCE_EXAMPLES:-25}" --workers 1 \
  --report "${BCM_CONFORMANCE_REPORTS:-junit}" --report-dir "$out" --seed 1 --no-color) > "$out/schemathesis.log" 2>&1
st=$?
set -e
if [ "$st" -ne 0 ]; then
  # The errors (a request that got no answer: which operation, which
  # exception) and the failures (operation, check, the curl that
  # reproduces it), not only the summary that ends the log; and what the
  # server logged at WARN and above meanwhile.
  sed -n '/^=* \(ERRORS\|FAILURES\) =*$/,/^=* SUMMARY =*$/p' "$out/schemathesis.log" | head -n 200 >&2
  log "the server's log, WARN and above:"
  grep -E ' (WARN|ERROR) ' "$out/bcm.log" | tail -n 40 >&2 || true
fi
tail -n 40 "$out/schemathesis.log" >&2
log "schemathesis took $(( $(date +%s) - started )) s"
if [ "$st" -ne 0 ]; then
  log "schemathesis found failures (exit $st); the whole log is $out/schemathesis.log"
  exit "$st"
fi

log "generating a Python client from proto/openapi.json"
cat > "$out/client-config.yaml" <<YAML
project_name_override: bcm-client
package_name_override: bcm_client
YAML
rm -rf "$out/bcm-client"
(cd "$out" && "$venv/bin/openapi-python-client" generate --path "$repo/proto/openapi.json" \
  --config "$out/client-config.yaml" --meta none --output-path "$out/bcm-client" >/dev/null)
mkdir -p "$out/pkg" && rm -rf "$out/pkg/bcm_client" && mv "$out/bcm-client" "$out/pkg/bcm_client"
BCM_URL="https://$addr" BCM_CA_FILE="$ca" BCM_TOKEN="$token" PYTHONPATH="$out/pkg" "$venv/bin/python" "$here/client_test.py"
log "passed"
