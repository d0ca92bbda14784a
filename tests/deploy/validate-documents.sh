#!/usr/bin/env bash
# The documents other teams consume and the deployment files, checked by
# real validators (pinned, installed on first use under .bcm/):
#  - proto/openapi.json: openapi-spec-validator (PyPI);
#  - proto/asyncapi.json and its $refs: @asyncapi/parser (npm), and every
#    example event (proto/examples/events.json) against CloudEvents 1.0 with
#    the CloudEvents SDK (npm);
#  - deploy/nomad/*.nomad.hcl: parsed as HCL2 (python-hcl2) and checked to
#    agree with docker-compose.yml (check_nomad.py).
# Usage: tests/deploy/validate-documents.sh
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
log() { echo "documents: $*" >&2; }

PY_PINS=(openapi-spec-validator==0.7.1 python-hcl2==7.2.1 pyyaml==6.0.2)
NPM_PINS=(@asyncapi/parser@3.6.6 cloudevents@10.0.0)

venv="$repo/.bcm/venv-documents"
stamp="${PY_PINS[*]}"
if [ "$(cat "$venv/.pins" 2>/dev/null)" != "$stamp" ]; then
  log "installing ${PY_PINS[*]} into $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "${PY_PINS[@]}" >&2
  echo "$stamp" > "$venv/.pins"
fi
node_dir="$repo/.bcm/node-documents"
stamp="${NPM_PINS[*]}"
if [ "$(cat "$node_dir/.pins" 2>/dev/null)" != "$stamp" ]; then
  command -v npm >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >&2; }
  log "installing ${NPM_PINS[*]} into $node_dir"
  mkdir -p "$node_dir"
  (cd "$node_dir" && [ -f package.json ] || echo '{"private": true}' > package.json)
  (cd "$node_dir" && npm install --no-audit --no-fund --silent "${NPM_PINS[@]}" >&2)
  echo "$stamp" > "$node_dir/.pins"
fi

"$venv/bin/openapi-spec-validator" "$repo/proto/openapi.json"
# ES modules resolve packages next to the script: run a copy there.
cp "$here/documents.mjs" "$node_dir/documents.mjs"
node "$node_dir/documents.mjs" "$repo"
"$venv/bin/python" "$here/check_nomad.py" "$repo"
