#!/usr/bin/env bash
# End to end on emulated machines, through the public API only: QEMU VMs
# (TCG) behind sushy-tools' Redfish (libvirt driver) are enrolled, PXE-boot
# through our boot service into the bcd ramdisk, are inspected,
# commissioned, deployed with a signed image and released — one VM per
# firmware path (UEFI-native PXE: TFTP + 4011 + iPXE + HTTP; BIOS: QEMU's
# iPXE ROM + HTTP) — then two negative runs at once: the BIOS VM's disk
# turned read-only before a release, and the UEFI VM's disk swapped for
# another (another serial) before a release, must each end in `failed` with
# UNVERIFIED_WIPE (the second naming the recorded disk that did not report).
# The BIOS machine's first deploy is aborted mid-way and recovered to
# ready, and once deployed it is rescued and unrescued: each rescue first
# asks the installed OS's bcd to power the machine off (node.powerOff,
# checked against the quorum anchor the deploy left on its disk) and waits
# for the BMC to read it off; after unrescue the installed OS's
# bcd rejoins with the identity it kept on its disk, no token; the UEFI
# machine is rescued with an SSH key (its rescue ramdisk
# comes up, root logs in over SSH with that key, another key is refused) and
# undeployed from rescue; the read-only machine is then retired, its virtio
# disk crypto-erased by a full overwrite read back (the method reported),
# and the swapped one's NIC unplugged before a recover, whose ramdisk join
# times out (the site's step time-out) into the node's lastError. The
# ramdisk honours the BMC's graceful power-off (ACPI), as libvirt's logs show;
# the emulator's request log shows each ramdisk boot a one-time PXE override
# and the GracefulShutdown asked.
# Beside them an agentless machine (pool agentMode none, BIOS) goes the same
# way through its BMC alone: out-of-band inspection, an installer ISO
# inserted as sushy-tools' virtual media and booted once, which writes the
# OS and powers the machine off, the eject and the disk boot into what it
# wrote; its release cannot be attested (sushy-tools offers no drive erase),
# so it publishes node.release.unverified and the pool's policy returns it.
# Its profile is dedicated: the lease goes leased → bound → ending, and the
# teardown rotates its BMC's password (its own emulator refuses the old one
# after, and the control plane powers it on with the new one).
# Beside the negative runs a fifth VM, with no BMC and an OS of its own on
# its disk (bcd's join file and the site's quorum anchor put there by its
# operator), is started and adopted with a pool's one-time token, then
# retired through its own bcd: the disk's file system remounted read-only,
# the disk crypto-erased by a verified overwrite, the machine powered off
# by itself, every byte of its disk zero after.
#
#   tests/e2e/run.sh [DIR]      (root; default DIR .bcm/e2e/<time>)
#
# Prints each phase with its duration; on failure names the failing phase
# and leaves every log (services, serial consoles, dnsmasq, libvirt,
# sushy-tools, events, the API's node records) in DIR/logs. Everything it
# started is stopped and every namespace deleted, also on failure.
# E2E_FIRMWARE="uefi bios" picks the VMs; E2E_NEGATIVE=0 skips the
# negative run; E2E_AGENTLESS=0 the agentless machine; E2E_KEEP=1 leaves the
# lab up.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
dir="${1:-$root/.bcm/e2e/$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$dir/logs" "$dir/run" "$dir/img"
dir="$(cd "$dir" && pwd)"
chmod a+rx "$dir"               # Postgres (user postgres) lives under it
lab="$dir/lab"                 # the lab's own files: tests/e2e/lab.sh
CTL=bcme2e-ctl
IP=10.78.0.3
API="https://$IP:8080"
TOKEN="e2e-admin-token-$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')"
FIRMWARE="${E2E_FIRMWARE:-uefi bios}"
AGENTLESS="${E2E_AGENTLESS:-1}"
ISO_PORT=8099                  # the installer ISO's server, on the control namespace's loopback
JOIN_TIMEOUT=120               # the site's time-out of wait-ramdisk-join (a join takes ~30 s here)
T0=$(date +%s.%N)
phase_name=""

elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
say() { echo "e2e [$(elapsed "$T0") s] $*"; }
in_ctl() { ip netns exec "$CTL" "$@"; }

# phase NAME CMD...: runs one phase, prints its duration, names it on failure.
phase() {
  phase_name=$1; shift
  local t; t=$(date +%s.%N)
  say "▶ $phase_name"
  "$@"
  say "✔ $phase_name ($(elapsed "$t") s)"
}

cleanup() {
  local rc=$?
  set +e
  if [ "$rc" -ne 0 ]; then
    say "✘ FAILED in phase: ${phase_name:-?} (exit $rc)"
    collect_state
  fi
  for p in "$dir"/run/svc-*.pid; do
    [ -f "$p" ] || continue
    kill "$(cat "$p")" 2>/dev/null
  done
  # SIGTERM is a graceful stop; whatever is left after 10 s is killed.
  for p in "$dir"/run/svc-*.pid; do
    [ -f "$p" ] || continue
    for _ in $(seq 1 100); do kill -0 "$(cat "$p")" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$(cat "$p")" 2>/dev/null; rm -f "$p"
  done
  if [ -d "$dir/stack" ]; then
    in_ctl env -u DATABASE_URL -u NATS_URL BCM_STACK_DIR="$dir/stack" "$root/deploy/dev/stack.sh" down >/dev/null 2>&1
  fi
  if [ "${E2E_KEEP:-0}" != 1 ]; then "$here/lab.sh" down "$lab" >/dev/null 2>&1; fi
  [ -d "$lab/logs" ] && ln -sfn ../lab/logs "$dir/logs/lab"
  if [ "$rc" -ne 0 ] && [ "${E2E_TAILS:-1}" = 1 ]; then
    # CI keeps only what was printed: the end of every log.
    for f in "$dir"/logs/*.log "$dir"/logs/*.txt "$dir"/logs/*.json "$lab"/logs/*; do
      [ -f "$f" ] || continue
      echo "----- ${f#"$dir"/} (last 40 lines)"; tail -n 40 "$f"
    done
  fi
  say "logs: $dir/logs"
  exit "$rc"
}
# One lab per machine: namespaces and libvirt are the machine's.
exec 9>/run/bcme2e.lock
flock -n 9 || { echo "e2e: another run holds /run/bcme2e.lock" >&2; exit 1; }
trap cleanup EXIT
trap 'exit 130' INT TERM

# What the on-call engineer wants next to the logs: the nodes as the API
# sees them, and their commands.
collect_state() {
  [ -n "${DATABASE_URL:-}" ] || return 0
  for n in "$dir"/run/node-*; do
    [ -f "$n" ] || continue
    ctl show "$(cat "$n")" -o json > "$dir/logs/$(basename "$n").json" 2>&1
  done
  psql_ctl -c "SELECT node_id, kind, status, attempt, attested_by IS NOT NULL AS attested, created_at, result->>'error' AS error FROM commands ORDER BY created_at" \
    > "$dir/logs/commands.txt" 2>&1
}

ctl() { in_ctl env BCM_API_URL="$API" BCM_CA_FILE="$dir/tls/ca.crt" BCM_TOKEN="$TOKEN" NATS_URL="$NATS_URL" "$root/target/debug/metalctl" "$@"; }
psql_ctl() { in_ctl psql -X -q "$DATABASE_URL" "$@"; }

# start NAME CMD...: a service in the control namespace, pid and log in DIR.
start() {
  local name=$1; shift
  ip netns exec "$CTL" "$@" > "$dir/logs/$name.log" 2>&1 < /dev/null &
  echo $! > "$dir/run/svc-$name.pid"
}

install() {
  local e; e=$("$here/install.sh" 2>>"$dir/logs/install.log")
  eval "$e"
}

build() {
  (cd "$root" && cargo build -q -p bcm-allinone -p bcm-bmc -p bcm-boot -p metalctl) 2>&1 | tail -n 20
  # What the ramdisk pins in its build (never from a network answer): the
  # control plane's CA (the API serves HTTPS from it) and the key images
  # are signed with.
  "$root/target/debug/bcm" local-tls --dir "$dir/tls" --name "$IP" >/dev/null
  rm -f "$dir/img/publisher.key"
  PUBLIC_KEY=$("$root/target/debug/metalctl" -o json image keygen "$dir/img/publisher.key" | jq -r .publicKey)
  mkdir -p "$dir/trust"
  cp "$dir/tls/ca.crt" "$dir/trust/ca.crt"
  echo "$PUBLIC_KEY" > "$dir/trust/image-keys"
  # The test ramdisk carries a stand-in dcgmi (a sim, saying so): the
  # machines have no GPU, and commissioning's diagnostic must pass.
  RAMDISK_EXTRA_BIN="$here/ramdisk-sim" BCD_TRUST_DIR="$dir/trust" \
    "$root/deploy/ramdisk/build.sh" "$dir/ramdisk" 2>>"$dir/logs/build.log" | sed 's/^/  /'
}

lab_up() {
  "$here/lab.sh" up "$lab" 2>>"$dir/logs/lab.log"
  # shellcheck disable=SC1091
  . "$lab/run/env"
}

stack_up() {
  # Its own servers on the control namespace's loopback, whatever the
  # caller's environment names (the test command's stack is not reachable
  # from there).
  # Each process connects with its own nkey and only its permissions: the
  # control plane as `control`, the site's services as `bmc-lab`, `boot-lab`.
  "$root/target/debug/bcm" nats-auth --dir "$dir/nats" --site lab >/dev/null
  # The destructive-batch quorum: the API's policy key and the site's
  # anchor, which the bmc service and (on the kernel command line, from
  # bcm-boot) bcd verify every destructive command against.
  "$root/target/debug/bcm" quorum-keys --dir "$dir/quorum" --approvers 3 --quorum 2 >/dev/null
  local e; e=$(in_ctl env -u DATABASE_URL -u NATS_URL -u BCM_STACK_PG_PORT -u BCM_STACK_NATS_PORT \
    BCM_STACK_DIR="$dir/stack" BCM_STACK_NATS_USERS="$dir/nats/users.conf" "$root/deploy/dev/stack.sh" env 2>>"$dir/logs/stack.log")
  DATABASE_URL="" NATS_URL=""
  eval "$e"
  [ -n "$DATABASE_URL" ] && [ -n "$NATS_URL" ] || { echo "stack.sh named no servers; see logs/stack.log" >&2; return 1; }
  export DATABASE_URL NATS_URL
  NATS_ADDR="nats://${NATS_URL##*@}"   # without the admin password
}

images() {
  "$here/os-image.sh" "$dir/ramdisk" "$dir/img" | sed 's/^/  os image /'
  # The same system as raw and as qcow2 (bcd converts while it streams):
  # the BIOS machine gets one, the UEFI machine the other.
  qemu-img convert -f raw -O qcow2 "$dir/img/os.raw" "$dir/img/os.qcow2"
  local f
  # The agentless machine's installer: an ISO that writes os.raw and
  # powers off; its sha256 and size go into the profile.
  local iso; iso=$("$here/installer-iso.sh" "$dir/ramdisk" "$dir/img/os.raw" "$dir/iso")
  ISO_SHA256=${iso% *} ISO_SIZE=${iso#* }
  say "  installer ISO: sha256 $ISO_SHA256, $ISO_SIZE bytes"
  for f in raw qcow2; do
    ctl image sign --key-file "$dir/img/publisher.key" --url "http://$IP:8081/images/os/e2e-os.$f" \
      --format "$f" "$dir/img/os.$f" > "$dir/img/os.$f.ref.json"
    jq -c . "$dir/img/os.$f.ref.json" | sed 's/^/  signed /'
  done
  # The raw image's runs of zeros (the space after its partition's files)
  # give it a block map; the qcow2 image has none.
  jq -e '(.dataRanges | length) > 0' "$dir/img/os.raw.ref.json" >/dev/null \
    || { echo "metalctl image sign gave the raw image no block map" >&2; return 1; }
}

configure() {
  mkdir -p "$dir/tftp" "$dir/cache" "$dir/pki"
  cp -L /usr/lib/ipxe/undionly.kpxe /usr/lib/ipxe/ipxe.efi "$dir/tftp/"
  local seal="AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="
  # A raw image's signed block map comes along: the ramdisk fetches its
  # runs as HTTP ranges from the boot server's image directory.
  toml_ref() { jq -c '{url, format, sha256, sizeBytes, signature} + (if .dataRanges then {dataRanges} else {} end)' "$dir/img/os.$1.ref.json" \
    | sed -E 's/"([a-zA-Z0-9]+)":/\1 = /g; s/^\{/{ /; s/\}$/ }/'; }
  cat > "$dir/run/bcm.toml" <<EOF
[api]
listen = "0.0.0.0:8080"
database_url = "$DATABASE_URL"
admin_token = "$TOKEN"
[api.agents]
# A lab of five machines, not a fleet: an idle installed OS beats every
# 5 s (the default, 60 s, spares 10,000 nodes' worth of requests), so a
# rescue's ask to power off reaches it within about 5 s.
idle_heartbeat_secs = 5
[api.bus]
url = "$NATS_ADDR"
nkey_file = "$dir/nats/control.nk"
[api.join_key]
file = "$dir/nats/join.key"
[api.quorum]
policy_key_file = "$dir/quorum/policy.key"
anchor_file = "$dir/quorum/anchor.json"
[api.tls]
cert_file = "$dir/tls/api.crt"
key_file = "$dir/tls/api.key"
[[api.sealing_keys]]
id = "e2e"
key = "$seal"
[api.telemetry]
log_filter = "info"
[api.hardware_profiles.qemu-virtio]
description = "QEMU behind sushy-tools' Redfish, iPXE boot, image streaming from the ramdisk"
drivers = { power = "redfish", management = "redfish", boot = "ipxe", deploy = "image-stream", inspect = "agent" }
[[api.seed.tenants]]
id = "root"
name = "Root"
[[api.seed.sites]]
id = "lab"
name = "e2e lab"
[[api.seed.pools]]
id = "e2e"
tenant = "root"
site = "lab"
hardware_profile = "qemu-virtio"
[[api.seed.deploy_profiles]]
tenant = "root"
profile = { id = "e2e-os-raw", version = 1, role = "host", image = $(toml_ref raw) }
[api.hardware_profiles.qemu-oob]
description = "QEMU behind sushy-tools' Redfish, nothing in band: virtual media, no agent"
drivers = { power = "redfish", management = "redfish", boot = "none", deploy = "none", inspect = "none" }
[[api.seed.pools]]
id = "e2e-oob"
tenant = "root"
site = "lab"
hardware_profile = "qemu-oob"
agent_mode = "none"
unattested_release = "ready"
[[api.seed.deploy_profiles]]
tenant = "root"
profile = { id = "e2e-installer", version = 1, role = "dedicated", image = { url = "http://127.0.0.1:$ISO_PORT/installer.iso", format = "iso", sha256 = "$ISO_SHA256", sizeBytes = $ISO_SIZE } }
[engine]
control_plane_url = "$API"
[engine.step_timeouts]
wait-ramdisk-join = $JOIN_TIMEOUT
[reconciler]
metal_poll_ms = 5000
[attestation]
generate_ca = true
image_keys = ["$PUBLIC_KEY"]
[sim]
site = "lab"
EOF
  cat > "$dir/run/bmc.toml" <<EOF
site = "lab"
power_timeout_secs = 120
graceful_timeout_secs = 5
quorum_anchor_file = "$dir/quorum/anchor.json"
[bus]
url = "$NATS_ADDR"
nkey_file = "$dir/nats/bmc-lab.nk"
[[sealing_keys]]
id = "e2e"
key = "$seal"
EOF
  {
    cat <<EOF
site = "lab"
server_ip = "$IP"
tftp_listen = "$IP:69"
http_listen = "$IP:8081"
boot_files = "$dir/tftp"
image_cache = "$dir/cache"
quorum_anchor_file = "$dir/quorum/anchor.json"
[dhcp]
interface = "eth0"
[bus]
url = "$NATS_ADDR"
nkey_file = "$dir/nats/boot-lab.nk"
[join_key]
file = "$dir/nats/join-lab.key"
EOF
    grep -v '^#' "$dir/ramdisk/catalog.toml"
    for f in raw qcow2; do
      printf '[[images]]\nname = "os/e2e-os.%s"\nurl = "file://%s"\nsha256 = "%s"\n' \
        "$f" "$dir/img/os.$f" "$(jq -r .sha256 "$dir/img/os.$f.ref.json")"
    done
  } > "$dir/run/boot.toml"
}

control_plane_up() {
  start allinone env BCM_ALL_CONFIG="$dir/run/bcm.toml" RUST_LOG=info \
    "$root/target/debug/bcm" --services api,relay,workflow,reconciler,attestation
  start bmc "$root/target/debug/bcm-bmc" --config "$dir/run/bmc.toml"
  start boot "$root/target/debug/bcm-boot" --config "$dir/run/boot.toml"
  # The installer ISO, where sushy-tools (on this loopback) fetches it.
  start iso python3 -m http.server "$ISO_PORT" --bind 127.0.0.1 --directory "$dir/iso"
  for _ in $(seq 1 120); do
    in_ctl curl -fsS --cacert "$dir/tls/ca.crt" "$API/healthz" >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  echo "the API did not come up; see logs/allinone.log" >&2
  return 1
}

# wait_state NAME NODE STATE TIMEOUT: follows the node, printing each move.
wait_state() {
  local name=$1 node=$2 want=$3 timeout=$4 t; t=$(date +%s)
  local last="" s
  while :; do
    s=$(ctl show "$node" -o json | jq -r '.provisionState')
    if [ "$s" != "$last" ]; then say "  $name: $s"; last=$s; fi
    [ "$s" = "$want" ] && return 0
    if [ "$s" = failed ] && [ "$want" != failed ]; then
      ctl show "$node" -o json | jq '{provisionState, failedFrom, lastError}' >&2
      return 1
    fi
    if (( $(date +%s) - t > timeout )); then
      echo "$name: still $s after $timeout s (waiting for $want)" >&2
      return 1
    fi
    sleep 2
  done
}

# One machine per firmware path: tap, MAC and disk of its own.
define_vms() {
  local i=0 fw
  for fw in $FIRMWARE; do
    local name="e2e-$fw" mac; mac=$(printf '52:54:00:78:00:%02x' $((i + 1)))
    "$here/vm.sh" disk "$dir/img/$name.qcow2" 2G >/dev/null
    "$here/vm.sh" define "$lab" "$name" "$fw" "$mac" "tap$i" "$dir/img/$name.qcow2" >/dev/null
    echo "$mac" > "$dir/run/mac-$name"
    echo "tap$i" > "$dir/run/tap-$name"
    i=$((i + 1))
  done
  if [ "$AGENTLESS" = 1 ]; then
    local mac=52:54:00:78:00:10
    "$here/vm.sh" disk "$dir/img/e2e-oob.qcow2" 2G >/dev/null
    "$here/vm.sh" define "$lab" e2e-oob bios "$mac" tap2 "$dir/img/e2e-oob.qcow2" >/dev/null
    echo "$mac" > "$dir/run/mac-e2e-oob"
  fi
  say "  defined: $FIRMWARE$([ "$AGENTLESS" = 1 ] && echo " oob")"
}

# disk_raw NAME OUT: the VM's disk as the host reads it.
disk_raw() { qemu-img convert -U -f qcow2 -O raw "$dir/img/$1.qcow2" "$2"; }

# No driver named: the pool's hardware profile (qemu-virtio, from the
# configuration) binds Redfish.
enroll() {
  local name=$1 pool=${2:-e2e} port=${3:-8000} password=${4:-e2e-password} uuid view
  uuid=$(virsh -q -c qemu:///system domuuid "$name")
  view=$(ctl -o json enroll --pool "$pool" \
    --address "http://127.0.0.1:$port/redfish/v1/Systems/$uuid" \
    --username admin --password "$password")
  jq -e '.bmc.driver == "redfish"' <<<"$view" >/dev/null \
    || { echo "$name: the profile did not bind redfish: $view" >&2; return 1; }
  jq -r .nodeId <<<"$view" > "$dir/run/node-$name"
  say "  $name: node $(cat "$dir/run/node-$name")"
}

check_inventory() {
  local name=$1 node; node=$(cat "$dir/run/node-$name")
  local inv; inv=$(ctl show "$node" -o json | jq .inventory)
  local xml="$lab/run/$name.xml"
  local want_cpus want_mib want_mac want_size
  want_cpus=$(sed -n 's:.*<vcpu[^>]*>\([0-9]*\)</vcpu>.*:\1:p' "$xml")
  want_mib=$(sed -n "s:.*<memory unit='MiB'>\([0-9]*\)</memory>.*:\1:p" "$xml")
  want_mac=$(cat "$dir/run/mac-$name")
  want_size=$(qemu-img info --output json -U "$dir/img/$name.qcow2" | jq '."virtual-size"')
  local got_cpus got_mib got_macs got_size
  got_cpus=$(jq .cpus <<<"$inv")
  got_mib=$(jq .memoryMiB <<<"$inv")
  got_macs=$(jq -r '[.nics[].mac] | join(" ")' <<<"$inv")
  got_size=$(jq '[.disks[] | select(.name == "vda") | .sizeBytes][0]' <<<"$inv")
  say "  $name inventory: $got_cpus CPUs, $got_mib MiB, NICs $got_macs, vda $got_size B"
  [ "$got_cpus" = "$want_cpus" ] || { echo "CPUs: $got_cpus, the VM has $want_cpus" >&2; return 1; }
  # The kernel keeps some memory for itself: MemTotal is a little below.
  (( got_mib <= want_mib && got_mib >= want_mib * 85 / 100 )) \
    || { echo "memory: $got_mib MiB, the VM has $want_mib MiB" >&2; return 1; }
  grep -qw "$want_mac" <<<"$got_macs" || { echo "MACs $got_macs lack $want_mac" >&2; return 1; }
  [ "$got_size" = "$want_size" ] || { echo "vda: $got_size B, the disk is $want_size B" >&2; return 1; }
  # The out-of-band inspection found the same MAC before any boot.
  ctl show "$node" -o json | jq -e --arg m "$want_mac" '.macs | index($m)' >/dev/null \
    || { echo "the node's PXE MACs do not list $want_mac" >&2; return 1; }
}

# After deploy: outside the partition the disk is the image byte for byte;
# inside it every file of the image is there unchanged, plus bcd's seed.
check_deployed_disk() {
  local name=$1 node; node=$(cat "$dir/run/node-$name")
  local raw="$dir/img/$name.check.raw"
  disk_raw "$name" "$raw"
  local part_offset part_size size
  # shellcheck disable=SC1091
  . "$dir/img/os.layout"
  cmp -n "$part_offset" "$dir/img/os.raw" "$raw" \
    || { echo "the disk's head differs from the image" >&2; return 1; }
  local after=$((part_offset + part_size))
  cmp -i "$after" -n $((size - after)) "$dir/img/os.raw" "$raw" \
    || { echo "the disk's tail (backup GPT) differs from the image" >&2; return 1; }
  local f n=0 a="$dir/img/a.tmp" b="$dir/img/b.tmp"
  export MTOOLS_SKIP_CHECK=1
  while read -r f; do
    [ -n "$f" ] || continue
    mtype -i "$dir/img/os.raw@@$part_offset" "$f" > "$a" || { echo "cannot read $f in the image" >&2; return 1; }
    mtype -i "$raw@@$part_offset" "$f" > "$b" || { echo "$f is missing on the disk" >&2; return 1; }
    cmp -s "$a" "$b" || { echo "$f differs from the image's" >&2; return 1; }
    n=$((n + 1))
  done < <(mdir -/ -b -i "$dir/img/os.raw@@$part_offset" ::/ | grep -v '/$')
  rm -f "$a" "$b"
  (( n >= 5 )) || { echo "only $n files compared: the image listing failed" >&2; return 1; }
  mtype -i "$raw@@$part_offset" ::/var/lib/cloud/seed/nocloud/meta-data | grep -q "$node" \
    || { echo "no NoCloud seed naming $node on the installed partition" >&2; return 1; }
  say "  $name: disk = image outside the partition, $n files unchanged, seed for $node present"
  rm -f "$raw"
}

# After the release: no signature left, head and tail zero.
check_wiped_disk() {
  local name=$1 raw="$dir/img/$1.check.raw"
  disk_raw "$name" "$raw"
  local sigs; sigs=$(wipefs --no-act "$raw" 2>&1 || true)
  [ -z "$sigs" ] || { echo "wipefs still finds: $sigs" >&2; return 1; }
  if blkid -p "$raw" >/dev/null 2>&1; then
    echo "blkid still finds: $(blkid -p "$raw")" >&2; return 1
  fi
  local bytes; bytes=$(stat -c %s "$raw") mib=$((1024 * 1024))
  cmp -n $((64 * mib)) "$raw" /dev/zero || { echo "the head is not zero" >&2; return 1; }
  cmp -i $((bytes - 64 * mib)) -n $((64 * mib)) "$raw" /dev/zero \
    || { echo "the tail is not zero" >&2; return 1; }
  say "  $name: wipefs and blkid find nothing; head and tail 64 MiB are zero"
  rm -f "$raw"
}

# The node's events, in order: exactly the spec's provision sequence,
# versions never going back, no duplicate, no gap.
check_events() {
  local name=$1 node; node=$(cat "$dir/run/node-$name"); shift
  local want="$*"
  timeout 5 ip netns exec "$CTL" env NATS_URL="$NATS_URL" "$root/target/debug/metalctl" watch "$node" -o json \
    > "$dir/logs/events-$name.jsonl" 2>/dev/null || true
  local got
  got=$(jq -r 'select(.type == "node.enrolled" or (.type | startswith("node.provision."))) | .type | sub("^node\\.(provision\\.)?"; "")' \
    "$dir/logs/events-$name.jsonl" | tr '\n' ' ' | sed 's/ $//')
  [ "$got" = "$want" ] || { printf 'events of %s:\n  got  %s\n  want %s\n' "$name" "$got" "$want" >&2; return 1; }
  # Versions: non-decreasing, each (type, version) once, no version missing.
  jq -s -e '[.[] | select(.type | startswith("node."))] as $e
    | ($e | map(.nodeversion)) as $v
    | ($v == ($v | sort)) and (($e | map([.type, .nodeversion]) | unique | length) == ($e | length))
      and (($v | unique) == [range($v[0]; $v[-1] + 1)])' "$dir/logs/events-$name.jsonl" >/dev/null \
    || { echo "events of $name: versions out of order, duplicated or with a gap (logs/events-$name.jsonl)" >&2; return 1; }
  say "  $name: $(wc -l < "$dir/logs/events-$name.jsonl") events; provision sequence as the spec says"
}

# Every wipe and diag result is signed and was verified by attestation.
# check_attested NAME [RELEASES]: commissioning's diag and wipe, then one
# wipe per release (default one).
check_attested() {
  local name=$1 releases=${2:-1} node; node=$(cat "$dir/run/node-$name")
  local rows
  rows=$(psql_ctl -At -c "SELECT kind || ' ' || status || ' ' || (attested_by IS NOT NULL) || ' ' || (signature IS NOT NULL) FROM commands WHERE node_id = '$node' AND kind IN ('disk.wipe', 'diag.dcgm') ORDER BY created_at")
  say "  $name commands: $(tr '\n' ';' <<<"$rows")"
  # Each signed, verified, succeeded.
  local want=$'diag.dcgm succeeded true true\ndisk.wipe succeeded true true' i
  for i in $(seq 1 "$releases"); do want+=$'\ndisk.wipe succeeded true true'; done
  [ "$rows" = "$want" ] || { printf 'commands of %s:\n%s\nwant:\n%s\n' "$name" "$rows" "$want" >&2; return 1; }
}

# wf_steps NODE STATE CLEANUP: the steps of the node's first workflow of
# STATE, `name=status` in order (main steps, or the cleanup ones).
wf_steps() {
  psql_ctl -At -c "SELECT string_agg(s.name || '=' || s.status, ' ' ORDER BY s.idx) FROM workflow_steps s
    WHERE s.workflow_id = (SELECT id FROM workflows WHERE node_id = '$1' AND for_state = '$2' ORDER BY created_at LIMIT 1)
    AND s.cleanup = $3"
}

# wf_status NODE PROFILE: the status of the node's newest workflow of PROFILE.
wf_status() {
  psql_ctl -At -c "SELECT status FROM workflows WHERE node_id = '$1' AND profile_id = '$2' ORDER BY created_at DESC LIMIT 1"
}

# Abort in the middle of a deploy (its ramdisk booting), then recover: the
# deploy's workflow ends cancelled with its cleanup run (boot entry
# cleared, powered off), the node fails from deploying, and recover wipes
# it again through releasing back to ready.
abort_deploy() {
  local name=$1 format=$2 node i steps=""; node=$(cat "$dir/run/node-$name")
  ctl deploy "$node" --profile "e2e-os-$format" --profile-version 1 >/dev/null
  for i in $(seq 1 300); do
    steps=$(wf_steps "$node" deploying false)
    grep -q "wait-ramdisk-join=running" <<<"$steps" && break
    sleep 1
  done
  grep -q "wait-ramdisk-join=running" <<<"$steps" \
    || { echo "the deploy never waited for its ramdisk: $steps" >&2; return 1; }
  ctl abort "$node" --reason "e2e: abort mid-deploy" >/dev/null
  local view; view=$(ctl show "$node" -o json)
  jq -e '.provisionState == "failed" and .failedFrom == "deploying" and (.lastError | contains("abort mid-deploy"))' <<<"$view" >/dev/null \
    || { echo "abort: $(jq -c '{provisionState, failedFrom, lastError}' <<<"$view")" >&2; return 1; }
  local status=""
  for i in $(seq 1 120); do
    status=$(psql_ctl -At -c "SELECT status FROM workflows WHERE node_id = '$node' AND for_state = 'deploying' ORDER BY created_at LIMIT 1")
    [ "$status" = cancelled ] && break
    sleep 1
  done
  local cleanup; cleanup=$(wf_steps "$node" deploying true)
  say "  $name: aborted mid-deploy: workflow $status, cleanup $cleanup"
  [ "$status" = cancelled ] && [ "$cleanup" = "clear-boot-entry=succeeded power-off=succeeded" ] \
    || { echo "want the deploy cancelled with its cleanup run" >&2; return 1; }
  ctl recover "$node" >/dev/null
  wait_state "$name" "$node" ready 900
}

# wait_rescue_up NODE: the rescue ramdisk is up (metal-rescue succeeded
# once it joined), within 15 minutes.
wait_rescue_up() {
  local i status=""
  for i in $(seq 1 450); do
    status=$(wf_status "$1" metal-rescue)
    case "$status" in succeeded|failed|cancelled) break ;; esac
    sleep 2
  done
  [ "$status" = succeeded ] || { echo "the rescue ramdisk did not come up: metal-rescue $status" >&2; return 1; }
}

# check_clean_shutdown NAME NODE FROM: the rescue asked the installed OS to
# power the machine off, and it did before the BMC booted the ramdisk: its
# bcd answered node.powerOff (the serial console since line FROM says so)
# and the BMC read the machine off (os-power-off and wait-os-off succeeded,
# not skipped), so the BMC's own power-off found it off (bmc-power-off).
check_clean_shutdown() {
  local name=$1 node=$2 from=$3 steps line
  steps=$(wf_steps "$node" rescue false)
  grep -q "os-power-off=succeeded wait-os-off=succeeded bmc-power-off=succeeded" <<<"$steps" \
    || { echo "the rescue did not shut the installed OS down cleanly: $steps" >&2; return 1; }
  line=$(tail -n +"$from" "$lab/logs/$name.serial" | tr -d '\r' | grep -m1 "powering off (node.powerOff" || true)
  [ -n "$line" ] || { echo "the installed OS's bcd did not say it powers off (logs/lab/$name.serial)" >&2; return 1; }
  say "  $name: the installed OS shut down for the rescue: $line"
}

# Rescue a deployed machine with an operator's SSH key (the rescue ramdisk
# boots: the metal-rescue workflow succeeds once it joined), log in as root
# over SSH with that key at the address the ramdisk's serial console shows,
# see another key refused, then undeploy it from rescue.
rescue_undeploy() {
  local name=$1 node serial="$lab/logs/$1.serial" from ip out key="$dir/run/rescue-$1"
  node=$(cat "$dir/run/node-$name")
  from=$(wc -l < "$serial")
  rm -f "$key" "$key.pub" "$key-other" "$key-other.pub"
  ssh-keygen -q -t ed25519 -N '' -C "operator@e2e" -f "$key"
  ssh-keygen -q -t ed25519 -N '' -C "intruder@e2e" -f "$key-other"
  ctl rescue "$node" --ssh-public-key "$key.pub" >/dev/null
  wait_rescue_up "$node"
  say "  $name: rescue ramdisk up ($(wf_steps "$node" rescue false))"
  check_clean_shutdown "$name" "$node" "$from"
  tail -n +"$from" "$serial" | tr -d '\r' | grep -q "bcm-ramdisk: rescue SSH on port 22" \
    || { echo "the rescue ramdisk started no SSH server (logs/lab/$name.serial)" >&2; return 1; }
  ip=$(tail -n +"$from" "$serial" | tr -d '\r' | sed -n 's|.*bcm-ramdisk: eth0 \([0-9.]*\)/.*|\1|p' | tail -n1)
  [ -n "$ip" ] || { echo "the rescue ramdisk's address is not on its serial console" >&2; return 1; }
  local opts=(-o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o ConnectTimeout=10 -o LogLevel=ERROR)
  out=$(in_ctl ssh "${opts[@]}" -i "$key" "root@$ip" 'echo "uid=$(id -u)"; cat /proc/cmdline' 2>&1) \
    || { echo "the rescue key's SSH login failed: $out" >&2; return 1; }
  grep -q "^uid=0$" <<<"$out" && grep -q "bcm.mode=rescue" <<<"$out" \
    || { echo "the SSH login did not reach the rescue ramdisk as root: $out" >&2; return 1; }
  if out=$(in_ctl ssh "${opts[@]}" -i "$key-other" "root@$ip" true 2>&1); then
    echo "another key logged in to the rescue ramdisk" >&2; return 1
  fi
  grep -q "Permission denied" <<<"$out" || { echo "another key: want Permission denied, got: $out" >&2; return 1; }
  say "  $name: root over SSH at $ip with the rescue's key ($(ssh-keygen -lf "$key.pub" | cut -d' ' -f2)); another key: Permission denied"
  say "  $name: undeploy from rescue"
  ctl undeploy "$node" >/dev/null
}

# Rescue a deployed machine, then unrescue it: the disk boots again, and
# the installed OS's bcd rejoins with the identity it kept on its disk (no
# token: its seed's was spent at the first boot), which is what
# metal-unrescue waits for before the node is deployed again.
rescue_unrescue() {
  local name=$1 node serial="$lab/logs/$1.serial" from line
  node=$(cat "$dir/run/node-$name")
  from=$(wc -l < "$serial")
  ctl rescue "$node" >/dev/null
  wait_rescue_up "$node"
  check_clean_shutdown "$name" "$node" "$from"
  say "  $name: rescue ramdisk up; unrescue"
  from=$(wc -l < "$serial")
  ctl unrescue "$node" >/dev/null
  wait_state "$name" "$node" deployed 900
  line=$(tail -n +"$from" "$serial" | tr -d '\r' | grep -m1 "rejoined as node $node with its identity") \
    || { echo "the installed OS's bcd did not rejoin with its kept identity (logs/lab/$name.serial)" >&2; return 1; }
  say "  $name: unrescued (metal-unrescue $(wf_status "$node" metal-unrescue)): $line"
}

SEQ_READY="enrolled enrolling workflow inspecting workflow commissioning workflow ready"
SEQ_POSITIVE="$SEQ_READY deploying workflow deployed releasing workflow ready"

# The whole positive scenario for one VM. The BIOS machine's first deploy
# is aborted mid-way and recovered; the UEFI machine is rescued before its
# release, which it is undeployed from.
scenario() {
  local name=$1 node
  enroll "$name"; node=$(cat "$dir/run/node-$name")
  wait_state "$name" "$node" ready 900
  check_inventory "$name"
  # vm.sh's disk had a GPT, an ext4 and random data at its tail: the
  # commissioning wipe took them.
  check_wiped_disk "$name"
  local format=raw; [ "$name" = e2e-uefi ] && format=qcow2
  local seq="$SEQ_POSITIVE" releases=1
  if [ "$name" = e2e-bios ]; then
    abort_deploy "$name" "$format"
    seq="$SEQ_READY deploying workflow failed releasing workflow ready deploying workflow deployed rescue workflow unrescuing workflow deployed releasing workflow ready"
    releases=2
  elif [ "$name" = e2e-uefi ]; then
    seq="$SEQ_READY deploying workflow deployed rescue workflow releasing workflow ready"
  fi
  ctl deploy "$node" --profile "e2e-os-$format" --profile-version 1 >/dev/null
  wait_state "$name" "$node" deployed 900
  check_deployed_disk "$name"
  # The qcow2 profile names the catalog image the site pre-warmed: the
  # ramdisk streamed it from its boot server's cache.
  local source
  source=$(psql_ctl -At -c "SELECT result->'output'->>'source' FROM commands WHERE node_id = '$node' AND kind = 'deploy.image' AND status = 'succeeded' ORDER BY created_at DESC LIMIT 1")
  say "  $name: image streamed from $source"
  if [ "$format" = qcow2 ] && [[ "$source" != */images/catalog/root/e2e-os-qcow2 ]]; then
    echo "the catalog image did not come from the site's cache: $source" >&2; return 1
  fi
  # The raw profile's image carries its signed block map: the ramdisk
  # fetched its runs of data as HTTP ranges, each checked, and not its zeros.
  if [ "$format" = raw ]; then
    local ranged
    ranged=$(psql_ctl -At -c "SELECT coalesce(result->'output'->>'dataRangesChecked', 'none') || ' ' || (result->'output'->>'bytesDownloaded') || ' ' || (result->'output'->>'virtualSizeBytes') FROM commands WHERE node_id = '$node' AND kind = 'deploy.image' AND status = 'succeeded' ORDER BY created_at DESC LIMIT 1")
    say "  $name: block map: runs, bytes fetched, image bytes: $ranged"
    local runs fetched whole; read -r runs fetched whole <<<"$ranged"
    [ "$runs" = "$(jq '.dataRanges | length' "$dir/img/os.raw.ref.json")" ] && [ "$fetched" -lt "$whole" ] \
      || { echo "the raw image was not fetched by its block map's runs: $ranged" >&2; return 1; }
  fi
  # No --wipe: the pool's releaseWipe (quick).
  if [ "$name" = e2e-uefi ]; then
    rescue_undeploy "$name"
  elif [ "$name" = e2e-bios ]; then
    rescue_unrescue "$name"
    ctl undeploy "$node" >/dev/null
  else
    ctl undeploy "$node" >/dev/null
  fi
  wait_state "$name" "$node" ready 900
  check_wiped_disk "$name"
  # shellcheck disable=SC2086
  check_events "$name" $seq
  check_attested "$name" "$releases"
  # Commissioning's diagnostic passed through the ramdisk's stand-in dcgmi
  # (the pool does not accept unsupported), and the result says sim.
  local diag
  diag=$(psql_ctl -At -c "SELECT (result->'output'->>'status') || ' sim=' || coalesce(result->'output'->>'sim', 'false') FROM commands WHERE node_id = '$node' AND kind = 'diag.dcgm'")
  say "  $name: diag.dcgm $diag"
  [ "$diag" = "pass sim=true" ] || { echo "want the diagnostic passed by the sim dcgmi: $diag" >&2; return 1; }
}

# The agentless machine: no ramdisk, no agent, nothing signed. Its BMC
# (sushy-tools, libvirt) inspects it, the deploy inserts the installer ISO
# as virtual media and boots it once; the installer writes the OS image and
# powers off, and the machine then boots from disk what it wrote. The
# release has no attested erase: node.release.unverified, and the pool's
# policy (ready) returns it.
agentless() {
  local name=e2e-oob node serial="$lab/logs/e2e-oob.serial"
  # Its BMC is an emulator of its own (lab.sh): its teardown rotates the
  # password, which the other machines' emulator must not share.
  enroll "$name" e2e-oob 8001 oob-password; node=$(cat "$dir/run/node-$name")
  wait_state "$name" "$node" ready 600
  local kinds
  kinds=$(psql_ctl -At -c "SELECT string_agg(DISTINCT kind, ' ' ORDER BY kind) FROM commands WHERE node_id = '$node'")
  say "  $name: commands so far: $kinds"
  if grep -Eq 'inventory|disk\.wipe|diag\.dcgm|bootEntry' <<<"$kinds"; then
    echo "an agentless node was sent an agent or network-boot command: $kinds" >&2; return 1
  fi
  ctl deploy "$node" --profile e2e-installer --profile-version 1 >/dev/null
  wait_state "$name" "$node" deployed 900
  grep -q "bcm-installer: wrote the OS image $(sha256sum < "$dir/img/os.raw" | cut -d' ' -f1)" "$serial" \
    || { echo "the installer did not write the image (logs/lab/e2e-oob.serial)" >&2; return 1; }
  # Then the disk boot: the image's syslinux and kernel come up from disk
  # (no join on its command line, no seed: nothing to do).
  local i
  for i in $(seq 1 120); do
    sed -n '/bcm-installer: wrote/,$p' "$serial" | grep -q "nothing to do" && break
    sleep 2
  done
  sed -n '/bcm-installer: wrote/,$p' "$serial" | grep -q "nothing to do" \
    || { echo "the machine did not boot what the installer wrote (logs/lab/e2e-oob.serial)" >&2; return 1; }
  local part_offset part_size size raw="$dir/img/$name.check.raw"
  # shellcheck disable=SC1091
  . "$dir/img/os.layout"
  disk_raw "$name" "$raw"
  cmp -n "$size" "$dir/img/os.raw" "$raw" \
    || { echo "the disk is not the image the installer wrote" >&2; return 1; }
  rm -f "$raw"
  local media
  media=$(psql_ctl -At -c "SELECT string_agg(params->>'action', ' ' ORDER BY created_at) FROM commands WHERE node_id = '$node' AND kind = 'bmc.virtualMedia' AND status = 'succeeded'")
  say "  $name: installed through virtual media ($media), booted from disk"
  ctl undeploy "$node" >/dev/null
  wait_state "$name" "$node" ready 600
  check_events "$name" $SEQ_POSITIVE
  # A dedicated lease (the installer profile's role): leased, bound,
  # ending, in order.
  local leases
  leases=$(jq -r 'select(.type | startswith("node.tenant-root.")) | .data.state' "$dir/logs/events-$name.jsonl" | tr '\n' ' ')
  say "  $name: lease $leases"
  [ "$leases" = "leased bound ending " ] || { echo "want the lease leased bound ending: $leases" >&2; return 1; }
  # Its teardown rotated the BMC password: the emulator refuses the one
  # the machine was enrolled with, and the control plane's new one works
  # (a power-on through the bmc service after the release).
  local code
  code=$(in_ctl curl -s -o /dev/null -w '%{http_code}' -u admin:oob-password http://127.0.0.1:8001/redfish/v1/Systems)
  [ "$code" = 401 ] || { echo "the emulator still takes the enrolled password ($code)" >&2; return 1; }
  ctl power "$node" on >/dev/null
  local power=""
  for i in $(seq 1 60); do
    power=$(psql_ctl -At -c "SELECT status FROM commands WHERE node_id = '$node' AND kind = 'bmc.power' ORDER BY created_at DESC LIMIT 1")
    case "$power" in succeeded|failed) break ;; esac
    sleep 1
  done
  [ "$power" = succeeded ] || { echo "a power-on with the rotated password: $power" >&2; return 1; }
  say "  $name: BMC password rotated: the enrolled one is refused (401), the new one powers the machine on"
  local unverified
  unverified=$(jq -c 'select(.type == "node.release.unverified") | .data | {outcome, reason}' "$dir/logs/events-$name.jsonl")
  say "  $name: $unverified"
  [ "$(wc -l <<<"$unverified")" = 1 ] && jq -e '.outcome == "ready"' <<<"$unverified" >/dev/null \
    || { echo "want exactly one node.release.unverified (outcome ready): $unverified" >&2; return 1; }
}

# The negative run: the disk turns read-only under a deployed machine; the
# release's wipe cannot take effect and must not reach ready.
negative() {
  local name=$1 node; node=$(cat "$dir/run/node-$name")
  ctl deploy "$node" --profile e2e-os-raw --profile-version 1 >/dev/null
  wait_state "$name" "$node" deployed 900
  "$here/vm.sh" set-readonly "$lab" "$name" on >/dev/null
  ctl undeploy "$node" --wipe quick >/dev/null
  wait_state "$name" "$node" failed 900
  local err; err=$(ctl show "$node" -o json | jq -r .lastError)
  say "  $name: failed: $err"
  grep -q UNVERIFIED_WIPE <<<"$err" || { echo "the release failed without UNVERIFIED_WIPE" >&2; return 1; }
  # The disk is writable again, and the machine is retired: its virtio
  # disk has no erase command of its own, so the crypto-erase is carried
  # out (the pool's default policy admits it) as a full overwrite read
  # back byte for byte, and the result says so.
  "$here/vm.sh" set-readonly "$lab" "$name" off >/dev/null
  ctl retire "$node" >/dev/null
  wait_state "$name" "$node" retired 900
  local erase
  erase=$(psql_ctl -At -c "SELECT string_agg((d->>'name') || ' ' || (d->>'method') || ' by ' || (d->>'erase') || ' ' || (d->>'outcome'), '; ')
    FROM commands c, jsonb_array_elements(c.result->'output'->'disks') d
    WHERE c.node_id = '$node' AND c.kind = 'disk.wipe' AND c.status = 'succeeded' AND c.params->>'mode' = 'crypto-erase'")
  say "  $name: retired; wipe: $erase"
  [ "$erase" = "vda crypto-erase by overwrite-verified verified" ] \
    || { echo "want vda crypto-erased by overwrite-verified, verified" >&2; return 1; }
  local raw="$dir/img/$name.check.raw"
  disk_raw "$name" "$raw"
  # All zero: cmp reaches the end of the disk (EOF) before any difference.
  local diff; diff=$(cmp "$raw" /dev/zero 2>&1 || true)
  grep -q "EOF on $raw" <<<"$diff" \
    || { echo "the retired disk is not zero from end to end: $diff" >&2; return 1; }
  say "  $name: every byte of the retired disk is zero"
  rm -f "$raw"
}

# The swapped-disk run: a deployed machine's disk is swapped for another
# (a blank disk with another serial); the release wipes and verifies the
# new disk, but the disk the inventory recorded is not in the result, so
# the release must not reach ready, and the error names that disk.
swapped() {
  local name=$1 node; node=$(cat "$dir/run/node-$name")
  ctl deploy "$node" --profile e2e-os-raw --profile-version 1 >/dev/null
  wait_state "$name" "$node" deployed 900
  "$here/vm.sh" disk "$dir/img/$name-swapped.qcow2" 2G >/dev/null
  "$here/vm.sh" swap-disk "$lab" "$name" "$dir/img/$name-swapped.qcow2" "$name-d1" >/dev/null
  ctl undeploy "$node" --wipe quick >/dev/null
  wait_state "$name" "$node" failed 900
  local err; err=$(ctl show "$node" -o json | jq -r .lastError)
  say "  $name: failed: $err"
  grep -q "UNVERIFIED_WIPE.*missing.*vda ($name-d0)" <<<"$err" \
    || { echo "the release did not fail naming the swapped-out disk" >&2; return 1; }
  # The disk now in the machine was wiped and read back all the same.
  check_wiped_disk "$name-swapped"
  step_timeout "$name"
}

# A step time-out on a real machine: its NIC is unplugged, so the ramdisk a
# recover boots can never join; the site's time-out of wait-ramdisk-join
# (engine.step_timeouts) ends the wait, the step's policy allows one
# attempt, and the workflow fails naming the step and the time-out.
step_timeout() {
  local name=$1 node; node=$(cat "$dir/run/node-$name")
  virsh -q -c qemu:///system domif-setlink "$name" "$(cat "$dir/run/tap-$name")" down --config >/dev/null
  ctl recover "$node" >/dev/null
  wait_state "$name" "$node" failed $((JOIN_TIMEOUT + 300))
  local err; err=$(ctl show "$node" -o json | jq -r .lastError)
  say "  $name: NIC unplugged, recover: failed: $err"
  [ "$err" = "wait-ramdisk-join: wait-ramdisk-join timed out after $JOIN_TIMEOUT s (after 1 attempt)" ] \
    || { echo "want the join wait's time-out in lastError" >&2; return 1; }
}

# A machine with an OS of its own, already running when it is adopted:
# not enrolled, no BMC (libvirt starts it; no emulator is told of it). Its
# operator put bcd's join file (the API and a pool's one-time token) and
# the site's quorum anchor on its disk; it boots from that disk, bcd node
# joins and the pool's acceptance moves it to adopted. Its retire has no
# BMC to boot a ramdisk: its own bcd remounts the disk's file system
# read-only, crypto-erases the disk by a verified overwrite (reported),
# powers the machine off itself, and its identity is revoked.
adopt() {
  local name=e2e-adopt mac=52:54:00:78:00:20 token node
  token=$(ctl -o json join-token --pool e2e --ttl-secs 900 | jq -r .token)
  local raw="$dir/img/$name.raw" part_offset
  cp "$dir/img/os.raw" "$raw"
  # shellcheck disable=SC1091
  . "$dir/img/os.layout"
  printf 'BCD_API=%s\nBCD_JOIN_TOKEN=%s\n' "$API" "$token" > "$dir/run/$name.join.env"
  export MTOOLS_SKIP_CHECK=1
  mmd -i "$raw@@$part_offset" ::/var ::/var/lib ::/var/lib/cloud ::/var/lib/cloud/seed \
    ::/var/lib/cloud/seed/nocloud ::/etc/bcd ::/etc/bcd/trust
  mcopy -i "$raw@@$part_offset" "$dir/run/$name.join.env" ::/var/lib/cloud/seed/nocloud/user-data
  mcopy -i "$raw@@$part_offset" "$dir/quorum/anchor.json" ::/etc/bcd/trust/quorum-anchor.json
  rm -f "$dir/run/$name.join.env"
  qemu-img convert -f raw -O qcow2 "$raw" "$dir/img/$name.qcow2"
  rm -f "$raw"
  "$here/vm.sh" define "$lab" "$name" bios "$mac" tap3 "$dir/img/$name.qcow2" >/dev/null
  virsh -q -c qemu:///system start "$name" >/dev/null
  local serial="$lab/logs/$name.serial" i
  for i in $(seq 1 180); do
    node=$(grep -ao 'joined as node node_[0-9a-z]*' "$serial" 2>/dev/null | head -n1 | awk '{print $4}' || true)
    [ -n "$node" ] && break
    sleep 1
  done
  [ -n "$node" ] || { echo "$name: bcd node did not join (see $serial)" >&2; return 1; }
  echo "$node" > "$dir/run/node-$name"
  say "  $name: running, joined as node $node with the pool's token"
  wait_state "$name" "$node" adopted 120
  local inv
  inv=$(ctl show "$node" -o json | jq -c '{cpus: .inventory.cpus, disks: [.inventory.disks[] | {name, serial}], bmc: .bmc.driver}')
  say "  $name: adopted: $inv"
  jq -e --arg s "$name-d0" '.disks == [{name: "vda", serial: $s}]' <<<"$inv" >/dev/null \
    || { echo "$name: the inventory does not list vda ($name-d0)" >&2; return 1; }
  ctl retire "$node" >/dev/null
  wait_state "$name" "$node" retired 600
  local erase
  erase=$(psql_ctl -At -c "SELECT string_agg((d->>'name') || ' ' || (d->>'method') || ' by ' || (d->>'erase') || ' ' || (d->>'outcome'), '; ')
    FROM commands c, jsonb_array_elements(c.result->'output'->'disks') d
    WHERE c.node_id = '$node' AND c.kind = 'node.wipe' AND c.status = 'succeeded' AND c.attested_by IS NOT NULL")
  say "  $name: retired; its own bcd's wipe: $erase"
  [ "$erase" = "vda crypto-erase by overwrite-verified verified" ] \
    || { echo "want vda crypto-erased by overwrite-verified, verified and attested" >&2; return 1; }
  grep -aq "remounted read-only before the wipe" "$serial" \
    || { echo "$name: bcd did not remount the disk's file system read-only first" >&2; return 1; }
  local st=""
  for i in $(seq 1 60); do
    st=$(virsh -q -c qemu:///system domstate "$name" 2>/dev/null || true)
    [ "$st" = "shut off" ] && break
    sleep 1
  done
  [ "$st" = "shut off" ] || { echo "$name: still $st after node.powerOff" >&2; return 1; }
  grep -q "shutting down, reason=shutdown" "$lab/logs/$name.qemu.log" \
    || { echo "$name: libvirt did not see the guest power itself off" >&2; return 1; }
  say "  $name: powered itself off (libvirt: reason=shutdown)"
  local raw2="$dir/img/$name.check.raw" diff
  disk_raw "$name" "$raw2"
  diff=$(cmp "$raw2" /dev/zero 2>&1 || true)
  grep -q "EOF on $raw2" <<<"$diff" \
    || { echo "the retired disk is not zero from end to end: $diff" >&2; return 1; }
  rm -f "$raw2"
  say "  $name: every byte of the retired disk is zero"
  check_events "$name" enrolled adopting adopted retiring workflow retired
}

# Both negative runs at once, each on its own machine, beside the adopted
# machine's run.
negatives() {
  local pids=() rc=0 p
  ( negative "$neg" ) > >(sed -u "s/^/[$neg] /") 2>&1 &
  pids+=($!)
  ( adopt ) > >(sed -u "s/^/[adopt] /") 2>&1 &
  pids+=($!)
  if [ -n "$swap" ]; then
    ( swapped "$swap" ) > >(sed -u "s/^/[$swap] /") 2>&1 &
    pids+=($!)
  fi
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  return $rc
}

scenarios() {
  local pids=() fw fws=()
  for fw in $FIRMWARE; do
    # (Not `scenario || …`: errexit is off in a function called so.)
    ( scenario "e2e-$fw" ) > >(sed -u "s/^/[$fw] /") 2>&1 &
    pids+=($!); fws[$!]=$fw
  done
  if [ "$AGENTLESS" = 1 ]; then
    ( agentless ) > >(sed -u "s/^/[oob] /") 2>&1 &
    pids+=($!); fws[$!]=oob
  fi
  # The first failure stops the other machines' runs: no waiting out their
  # timeouts.
  local left=("${pids[@]}") done_pid rc p
  while (( ${#left[@]} > 0 )); do
    rc=0; wait -n -p done_pid "${left[@]}" || rc=$?
    if (( rc != 0 )); then
      say "e2e-${fws[$done_pid]:-?} failed; stopping the others"
      kill "${pids[@]}" 2>/dev/null
      return 1
    fi
    local next=()
    for p in "${left[@]}"; do [ "$p" = "$done_pid" ] || next+=("$p"); done
    left=("${next[@]}")
  done
}

phase install install
phase build build
phase "lab up (netns, libvirtd, sushy-tools)" lab_up
phase "postgres + nats in the control namespace" stack_up
phase "OS image, signed" images
phase configure configure
phase "control plane up (api, relay, workflow, reconciler, attestation, bmc, boot)" control_plane_up
# The qcow2 image is registered in the tenant's image catalog and
# pre-warmed into the site's cache (a site.httpProxy command the boot
# service runs: a real HTTP fetch, checked against size and sha256); its
# profile is published through the API naming the catalog image (the raw
# one is seeded). A published version is immutable, so publishing it again
# is a no-op.
publish_profiles() {
  jq '{url, format, sha256, sizeBytes, signature}' "$dir/img/os.qcow2.ref.json" > "$dir/run/image-qcow2.json"
  ctl image register e2e-os-qcow2 "$dir/run/image-qcow2.json" | sed 's/^/  /'
  ctl image prewarm e2e-os-qcow2 --site lab | sed 's/^/  /'
  local status="" i
  for i in $(seq 1 60); do
    status=$(ctl -o json image show e2e-os-qcow2 | jq -r '.sites[0].status // ""')
    case "$status" in succeeded|failed) break ;; esac
    sleep 1
  done
  ctl image show e2e-os-qcow2 | sed 's/^/  /'
  [ "$status" = succeeded ] || { echo "the site did not cache the catalog image: $status" >&2; return 1; }
  cmp "$dir/cache/catalog/root/e2e-os-qcow2" "$dir/img/os.qcow2"
  jq -n '{id: "e2e-os-qcow2", version: 1, role: "host", userDataTemplate: "bcd-preinstalled",
       catalogImage: "e2e-os-qcow2"}' > "$dir/run/profile-qcow2.json"
  ctl profiles publish "$dir/run/profile-qcow2.json" | sed 's/^/  /'
  ctl -o json profiles publish "$dir/run/profile-qcow2.json" \
    | jq -e '.profile.id == "e2e-os-qcow2" and .profile.catalogImage == "e2e-os-qcow2"' >/dev/null
  ctl hardware-profiles | sed 's/^/  /'
}
phase "catalog image registered and pre-warmed at the site; deploy profile published through the API; hardware profiles" publish_profiles
phase "define VMs" define_vms
phase "scenario: enroll → ready → deploy → release → ready ($FIRMWARE$([ "$AGENTLESS" = 1 ] && echo ", agentless oob"))" scenarios
if [ "${E2E_NEGATIVE:-1}" = 1 ]; then
  neg=e2e-bios; grep -qw bios <<<"$FIRMWARE" || neg="e2e-$(awk '{print $1}' <<<"$FIRMWARE")"
  swap=$(tr ' ' '\n' <<<"$FIRMWARE" | grep -vx "${neg#e2e-}" | head -n1 || true)
  [ -z "$swap" ] || swap="e2e-$swap"
  phase "negatives: read-only disk ($neg), swapped disk (${swap:-none}) at release → failed UNVERIFIED_WIPE; then $neg retired (crypto-erase by a verified overwrite), ${swap:-none} unplugged (a step time-out); beside them a running VM adopted and retired through its own bcd" negatives
fi
# What the BMC was asked, in the emulator's request log (tests/peers/
# sushy_accounts.py logs every write with its body): the ramdisk boots were
# one-time PXE overrides, and power-offs asked for a GracefulShutdown first
# (the ACPI power button); the ramdisk's acpid powers the machine off, and
# libvirt's log of each machine says the guest shut itself down
# (reason=shutdown) instead of being destroyed after the graceful time-out.
emulator_log() {
  local fw name uuid f="$lab/logs/sushy.log" once graceful n total=0 asked=0
  [ -f "$f" ] || { echo "no emulator log at $f" >&2; return 1; }
  for fw in $FIRMWARE; do
    name=e2e-$fw
    uuid=$(virsh -q -c qemu:///system domuuid "$name" 2>/dev/null) || continue
    once=$(grep -cE "sushy-request: PATCH /redfish/v1/Systems/$uuid \{\"Boot\": \{\"BootSourceOverrideEnabled\": \"Once\", [^}]*\"BootSourceOverrideTarget\": \"Pxe\"" "$f" || true)
    graceful=$(grep -cF "sushy-request: POST /redfish/v1/Systems/$uuid/Actions/ComputerSystem.Reset {\"ResetType\": \"GracefulShutdown\"}" "$f" || true)
    n=$(grep -c "shutting down, reason=shutdown" "$lab/logs/$name.qemu.log" 2>/dev/null || true)
    say "  $name: emulator: $once one-time PXE boot overrides, $graceful GracefulShutdown resets; libvirt: $n graceful power-offs, $(grep -c "shutting down, reason=destroyed" "$lab/logs/$name.qemu.log" 2>/dev/null || true) destroyed"
    (( once > 0 )) || { echo "$name: no one-time PXE boot override in the emulator's log" >&2; return 1; }
    total=$((total + n)); asked=$((asked + graceful))
  done
  (( asked > 0 )) || { echo "no GracefulShutdown was asked of the emulator" >&2; return 1; }
  (( total > 0 )) || { echo "no machine was powered off gracefully" >&2; return 1; }
}
phase "one-time boot overrides and graceful power-offs seen in the emulator's log" emulator_log
# Every process ran under its own bus identity: a request its permissions
# refuse is a bug (a refused JetStream request waits out its timeout).
bus_permissions() {
  if grep -h "Permissions Violation" "$dir"/logs/allinone.log "$dir"/logs/bmc.log "$dir"/logs/boot.log; then
    echo "a service was refused by the bus's permissions (above)" >&2
    return 1
  fi
}
phase "no service refused by the bus's permissions" bus_permissions
# Join and session tokens reached the machines (they joined) and nothing
# else: not a service's log, not the database (the machines' own consoles,
# which print their kernel command line, are theirs).
no_tokens() {
  local pg_dump; pg_dump=$(ls -d /usr/lib/postgresql/*/bin/pg_dump | sort -V | tail -1)
  in_ctl "$pg_dump" "$DATABASE_URL" > "$dir/logs/db.dump"
  grep -q 'bcmjref_' "$dir/logs/db.dump" || { echo "the commands carry no join reference" >&2; return 1; }
  if grep -EHo 'bcm[js]_[0-9a-f]{64}' "$dir"/logs/allinone.log "$dir"/logs/bmc.log "$dir"/logs/boot.log "$dir/logs/db.dump"; then
    echo "a join or session token is in a log or the database (above)" >&2
    return 1
  fi
}
phase "no join or session token in a service's log or the database" no_tokens
phase_name=""
say "PASS"
