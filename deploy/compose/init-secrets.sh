#!/bin/sh
# The compose stack's first start (the `secrets` service, as the image's
# user `bcm`, which owns the volume: the Dockerfile makes the directory so
# a new volume starts with that owner): generates what
# must never be committed, once, into the `secrets` volume, and leaves what
# is there: an nkey per bus identity and the NATS server's authorization
# of them, the join keys (`bcm nats-auth`), the API's TLS (`bcm local-tls`), the quorum's keys and anchor (`bcm quorum-keys`), the admin token, the sealing key, the Postgres
# password, and per service a TOML file of its secrets that the service
# merges over its committed configuration (`<PREFIX>SECRETS`).
set -eu
d="${BCM_SECRETS_DIR:-/var/lib/bcm-secrets}"
umask 077
bcm nats-auth --dir "$d/nats" --site local --site lab >/dev/null
# The API's HTTPS: a local CA (ca.crt, which clients pin) and the API's
# certificate for the names it is reached by.
bcm local-tls --dir "$d/tls" --name api --name localhost --name 127.0.0.1 >/dev/null
# Postgres's TLS: a CA of its own and the server's certificate for the name
# the services reach it by; every database URL says sslmode=verify-full.
bcm local-tls --dir "$d/pg-tls" --name postgres >/dev/null
# The destructive-batch quorum: the API's policy key, three approver keys
# (2 of 3 sign a bulk) and the sites' anchor, which the bmc, boot and
# simulated services verify every destructive command against.
bcm quorum-keys --dir "$d/quorum" --approvers 3 --quorum 2 >/dev/null
new() { [ -s "$d/$1" ] || head -c "$2" /dev/urandom | od -An -tx1 | tr -d ' \n' >"$d/$1"; }
new pg-password 24
# The official postgres image reads POSTGRES_PASSWORD_FILE as its own user
# (uid 999), not as ours: that one file is readable, the directory only
# traversable (0711), every other file ours alone (0600).
chmod 0711 "$d"
chmod 0644 "$d/pg-password"
[ -s "$d/admin-token" ] || echo "bcm_$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')" >"$d/admin-token"
[ -s "$d/sealing-key" ] || head -c 32 /dev/urandom | base64 >"$d/sealing-key"
token="$(cat "$d/admin-token")"
key="$(cat "$d/sealing-key")"
db="postgres://bcm:$(cat "$d/pg-password")@postgres:5432/bcm?sslmode=verify-full&sslrootcert=$d/pg-tls/ca.crt"

cat >"$d/nats.conf" <<EOF
jetstream { store_dir: "/data" }
http_port: 8222
include "nats/auth.conf"
EOF
cat >"$d/api.toml" <<EOF
admin_token = "$token"
database_url = "$db"
[tls]
cert_file = "$d/tls/api.crt"
key_file = "$d/tls/api.key"
[bus]
nkey_file = "$d/nats/api.nk"
[join_key]
file = "$d/nats/join.key"
[quorum]
policy_key_file = "$d/quorum/policy.key"
anchor_file = "$d/quorum/anchor.json"
[[sealing_keys]]
id = "compose-1"
key = "$key"
EOF
for s in workflow reconciler attestation; do
  printf 'database_url = "%s"\n[bus]\nnkey_file = "%s"\n' "$db" "$d/nats/$s.nk" >"$d/$s.toml"
done
printf '[engine.join_key]\nfile = "%s"\n' "$d/nats/join.key" >>"$d/workflow.toml"
cat >"$d/sim.toml" <<EOF
[api]
admin_token = "$token"
database_url = "$db"
[api.bus]
nkey_file = "$d/nats/control.nk"
[api.join_key]
file = "$d/nats/join.key"
[api.quorum]
policy_key_file = "$d/quorum/policy.key"
anchor_file = "$d/quorum/anchor.json"
[[api.sealing_keys]]
id = "compose-1"
key = "$key"
[sim]
nkey_file = "$d/nats/sim-local.nk"
api_ca_file = "$d/tls/ca.crt"
quorum_anchor_file = "$d/quorum/anchor.json"
[sim.join_key]
file = "$d/nats/join-local.key"
EOF
cat >"$d/bmc.toml" <<EOF
quorum_anchor_file = "$d/quorum/anchor.json"
[bus]
nkey_file = "$d/nats/bmc-lab.nk"
[[sealing_keys]]
id = "compose-1"
key = "$key"
EOF
printf 'quorum_anchor_file = "%s"\n[bus]\nnkey_file = "%s"\n[join_key]\nfile = "%s"\n' "$d/quorum/anchor.json" "$d/nats/boot-lab.nk" "$d/nats/join-lab.key" >"$d/boot.toml"
echo "secrets ready in $d (admin token: docker-compose exec api cat $d/admin-token)"
