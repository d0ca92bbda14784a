#!/usr/bin/env bash
# The end-to-end lab's topology: `lab.sh up DIR` / `lab.sh down DIR` (root).
# Owns, all recorded under DIR (pids in DIR/run/*.pid, logs in DIR/logs/):
#   - netns bcme2e-lan:  bridge br0, taps tap0..tap3 (libvirt attaches VMs to
#     them, managed='no'), and libvirtd (so it finds those taps);
#   - netns bcme2e-dhcp: 10.78.0.2/24 + fd78::2/64, a dnsmasq that hands out
#     10.78.0.100-150 and sends IPv6 RAs, nothing else (PXE is ours);
#   - netns bcme2e-ctl:  10.78.0.3/24 on eth0, lo up: control plane, Postgres,
#     NATS, the test driver and sushy-emulator share its loopback;
#   - virtlogd + libvirtd started by hand (no systemd), the `default` libvirt
#     network left stopped;
#   - the libvirt storage pool `bcme2e` (DIR/run/pool), where sushy-tools'
#     libvirt driver uploads virtual media;
#   - sushy-emulator (libvirt driver, basic auth admin/e2e-password) on
#     127.0.0.1:8000 inside bcme2e-ctl, and a second one (admin/oob-password,
#     :8001) for the agentless machine, whose password its teardown rotates (libvirt's unix socket is reachable
#     from any netns), through tests/peers/sushy_accounts.py (+AccountService);
#   - the libvirt domains tests/e2e/vm.sh defines (listed in DIR/run/domains):
#     `down` destroys and undefines them.
# `up` first takes down what a previous lab left (its DIR is kept in
# /run/bcme2e-lab.dir), `down` works on a half-made lab. DIR/run/env is the
# lab's environment for the test driver (eval it).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
LAN=bcme2e-lan DHCP=bcme2e-dhcp CTL=bcme2e-ctl
MARK="bcm-e2e-lab"                       # <description> of every domain vm.sh defines
LAST=/run/bcme2e-lab.dir
SUSHY_PORT=8000 SUSHY_USER=admin SUSHY_PASSWORD=e2e-password
SUSHY_OOB_PORT=8001 SUSHY_OOB_PASSWORD=oob-password       # the agentless machine's BMC
POOL=bcme2e                              # libvirt storage pool for virtual media
venv="$root/.bcm/venv-sushy"
VIRSH=(virsh -q -c qemu:///system)

usage() { echo "usage: $0 up|down DIR" >&2; exit 2; }
[ $# -eq 2 ] || usage
cmd=$1; dir=$(mkdir -p "$2" && cd "$2" && pwd)
log() { echo "lab: $*" >&2; }

# start NAME NETNS|- CMD...: background, pid in run/NAME.pid, output in logs/NAME.log.
# `ip netns exec` execs the command, so $! is the daemon's own pid.
start() {
  local name=$1 ns=$2; shift 2
  local pre=(); [ "$ns" = - ] || pre=(ip netns exec "$ns")
  "${pre[@]}" "$@" >"$dir/logs/$name.log" 2>&1 </dev/null &
  echo $! >"$dir/run/$name.pid"
}

# alive PID: running and not a zombie (our daemons outlive the shell that
# started them, and init here may take seconds to reap them).
alive() { [ -r "/proc/$1/stat" ] && [ "$(sed 's/.*) //' "/proc/$1/stat" | cut -d' ' -f1)" != Z ]; }

# stop NAME PATTERN: TERM (then KILL) the pid in run/NAME.pid if it is still
# that program.
stop() {
  local f="$dir/run/$1.pid" pid
  [ -f "$f" ] || return 0
  pid=$(cat "$f")
  if [ -n "$pid" ] && alive "$pid" && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q "$2"; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do alive "$pid" || break; sleep 0.1; done
    if alive "$pid"; then kill -9 "$pid" 2>/dev/null || true; fi
  fi
  rm -f "$f"
}

libvirt_up() { [ -f "$dir/run/libvirtd.pid" ] && alive "$(cat "$dir/run/libvirtd.pid")"; }

# Our domains: those vm.sh recorded plus any still carrying the lab's mark.
our_domains() {
  { cat "$dir/run/domains" 2>/dev/null || true
    for d in $("${VIRSH[@]}" list --all --name 2>/dev/null); do
      "${VIRSH[@]}" desc --config "$d" 2>/dev/null | grep -qx "$MARK" && echo "$d"
    done; } | sort -u
}

down() {
  stop sushy sushy
  stop sushy-oob sushy
  local d qpid
  for d in $(if libvirt_up; then our_domains; else cat "$dir/run/domains" 2>/dev/null || true; fi); do
    rm -f "$dir/logs/$d.qemu.log"   # vm.sh's symlink to it; keep a copy
    cp "/var/log/libvirt/qemu/$d.log" "$dir/logs/$d.qemu.log" 2>/dev/null || true
    qpid=$(cat "/run/libvirt/qemu/$d.pid" 2>/dev/null || true)
    if libvirt_up; then
      "${VIRSH[@]}" destroy "$d" >/dev/null 2>&1 || true
      "${VIRSH[@]}" undefine --nvram "$d" >/dev/null 2>&1 || "${VIRSH[@]}" undefine "$d" >/dev/null 2>&1 || true
    elif grep -q "<description>$MARK</description>" "/etc/libvirt/qemu/$d.xml" 2>/dev/null; then
      rm -f "/etc/libvirt/qemu/$d.xml"   # no libvirtd to ask: our definition, by hand
    fi
    # QEMU still there (libvirtd gone or wedged): it is ours, end it by its pid.
    if [ -n "$qpid" ] && alive "$qpid" && grep -q "guest=$d," "/proc/$qpid/cmdline"; then kill -9 "$qpid"; fi
  done
  rm -f "$dir/run/domains"
  if libvirt_up; then
    "${VIRSH[@]}" pool-destroy "$POOL" >/dev/null 2>&1 || true
    "${VIRSH[@]}" pool-undefine "$POOL" >/dev/null 2>&1 || true
  fi
  stop libvirtd libvirtd
  stop virtlogd virtlogd
  stop dnsmasq dnsmasq
  for n in $LAN $DHCP $CTL; do ip netns del "$n" 2>/dev/null || true; done
  [ "$(cat $LAST 2>/dev/null)" = "$dir" ] && rm -f "$LAST"
  return 0
}

# sushy_up NAME PORT PASSWORD: a sushy-emulator (libvirt driver, basic auth
# admin/PASSWORD, with an AccountService) on 127.0.0.1:PORT in bcme2e-ctl.
sushy_up() {
  local name=$1 port=$2 password=$3
  # bcrypt at 4 rounds: sushy checks the hash on every request (0.3 s at 12).
  "$venv/bin/python" -c 'import bcrypt,sys; print(sys.argv[1] + ":" + bcrypt.hashpw(sys.argv[2].encode(), bcrypt.gensalt(4)).decode())' \
    "$SUSHY_USER" "$password" >"$dir/run/$name.htpasswd"
  mkdir -p "$dir/run/$name-state"
  cat >"$dir/run/$name.conf" <<EOF
SUSHY_EMULATOR_LISTEN_IP = '127.0.0.1'
SUSHY_EMULATOR_LISTEN_PORT = $port
SUSHY_EMULATOR_LIBVIRT_URI = 'qemu:///system'
SUSHY_EMULATOR_IGNORE_BOOT_DEVICE = False
SUSHY_EMULATOR_STORAGE_POOL = '$POOL'
SUSHY_EMULATOR_STATE_DIR = '$dir/run/$name-state'
SUSHY_EMULATOR_AUTH_FILE = '$dir/run/$name.htpasswd'
# A PATCH with BootSourceOverrideMode rewrites <loader>/<nvram> from these:
# the same files vm.sh puts there (sushy's defaults name OVMF_CODE.secboot.fd,
# which needs SMM, and no Legacy loader, which libvirt refuses).
SUSHY_EMULATOR_BOOT_LOADER_MAP = {
    'UEFI': {'x86_64': '/usr/share/OVMF/OVMF_CODE_4M.fd'},
    'Legacy': {'x86_64': '/usr/share/seabios/bios-256k.bin'},
}
SUSHY_EMULATOR_SECURE_BOOT_DISABLED_NVRAM = '/usr/share/OVMF/OVMF_VARS_4M.fd'
SUSHY_EMULATOR_SECURE_BOOT_ENABLED_NVRAM = '/usr/share/OVMF/OVMF_VARS_4M.ms.fd'
EOF
  local t1=$SECONDS
  start "$name" $CTL "$venv/bin/python" "$root/tests/peers/sushy_accounts.py" --config "$dir/run/$name.conf"
  local url=http://127.0.0.1:$port ok=""
  for _ in $(seq 300); do
    alive "$(cat "$dir/run/$name.pid")" || { log "$name exited; see $dir/logs/$name.log"; exit 1; }
    ip netns exec $CTL curl -fsS -o /dev/null -u "$SUSHY_USER:$password" "$url/redfish/v1/Systems" 2>/dev/null && { ok=1; break; }
    sleep 0.1
  done
  [ -n "$ok" ] || { log "$name did not answer; see $dir/logs/$name.log"; exit 1; }
  log "$name answered on $port after $((SECONDS - t1)) s"

}

up() {
  local t0=$SECONDS
  # Leftovers: the previous lab (wherever it was), then this DIR, then names.
  prev=$(cat "$LAST" 2>/dev/null || true)
  [ -n "$prev" ] && [ "$prev" != "$dir" ] && [ -d "$prev" ] && bash "$here/lab.sh" down "$prev"
  down
  for p in libvirtd virtlogd; do
    for pid in $(pgrep -x $p || true); do
      if alive "$pid"; then log "a $p this lab did not start is running (pid $pid); stop it first"; exit 1; fi
    done
  done
  rm -rf "$dir/run" "$dir/logs"; mkdir -p "$dir/run" "$dir/logs"
  echo "$dir" >"$LAST"

  # Network: bcme2e-lan's br0 joins the VMs' taps and the two hosts' veths.
  for n in $LAN $DHCP $CTL; do ip netns add $n; ip -n $n link set lo up; done
  ip -n $LAN link add br0 type bridge
  ip -n $LAN link set br0 up
  for h in $DHCP $CTL; do
    ip link add "v-${h#bcme2e-}" netns $LAN type veth peer name eth0 netns $h
    ip -n $LAN link set "v-${h#bcme2e-}" master br0 up
    ip -n $h link set eth0 up
    # Checksums filled in by the sender, not left to "hardware" (pxe-e2e gotcha 6).
    ip netns exec $h ethtool -K eth0 tx off >/dev/null
  done
  ip -n $DHCP addr add 10.78.0.2/24 dev eth0
  ip -n $DHCP addr add fd78::2/64 dev eth0 nodad
  ip -n $CTL addr add 10.78.0.3/24 dev eth0
  for t in tap0 tap1 tap2 tap3; do
    ip -n $LAN tuntap add $t mode tap
    ip -n $LAN link set $t master br0 up
  done

  # The site's DHCP server: addresses and router advertisements only. dnsmasq
  # chdir()s to /, so every path is absolute. Without an RA, iPXE waits ~16 s.
  cat >"$dir/run/dhcp.conf" <<EOF
port=0
interface=eth0
bind-interfaces
dhcp-range=10.78.0.100,10.78.0.150,255.255.255.0,10m
dhcp-leasefile=$dir/run/dhcp.leases
log-dhcp
enable-ra
dhcp-range=::,constructor:eth0,ra-only
EOF
  start dnsmasq $DHCP dnsmasq -k -u root -C "$dir/run/dhcp.conf" --log-facility=-

  # libvirt, by hand: virtlogd, then libvirtd inside the LAN namespace.
  start virtlogd - virtlogd
  # /dev/kvm here is root:root 0600 (no udev): QEMU's capability probe finds
  # KVM, libvirt's own check (as user libvirt-qemu) does not, and libvirt then
  # re-probes QEMU on every call (~45 s per define). So libvirtd runs in its
  # own mount namespace where qemu.conf says QEMU runs as root; the host's
  # /etc and /dev stay as they are. (Hiding /dev/kvm by a bind mount instead
  # breaks the domains' private /dev: libvirt cannot move that mount.)
  printf 'user = "root"\ngroup = "root"\n' >"$dir/run/qemu.conf"
  start libvirtd $LAN unshare -m --propagation private sh -c \
    "mount --bind '$dir/run/qemu.conf' /etc/libvirt/qemu.conf && exec libvirtd"
  local t1=$SECONDS
  for _ in $(seq 100); do
    libvirt_up || { log "libvirtd exited; see $dir/logs/libvirtd.log"; exit 1; }
    "${VIRSH[@]}" uri >/dev/null 2>&1 && break
    sleep 0.1
  done
  # The first use probes QEMU's capabilities (~10 s, cached in
  # /var/cache/libvirt/qemu while QEMU and libvirt stay the same): do it now.
  "${VIRSH[@]}" capabilities >/dev/null || { log "libvirtd does not answer; see $dir/logs/libvirtd.log"; exit 1; }
  "${VIRSH[@]}" domcapabilities --virttype qemu --machine q35 >/dev/null
  log "libvirtd answered (QEMU probed) after $((SECONDS - t1)) s"
  for d in $(our_domains); do "${VIRSH[@]}" destroy "$d" >/dev/null 2>&1 || true
    "${VIRSH[@]}" undefine --nvram "$d" >/dev/null 2>&1 || true; done
  # Where sushy-tools' libvirt driver uploads a virtual media image: a pool
  # of the lab's own (never the host's `default`).
  "${VIRSH[@]}" pool-destroy "$POOL" >/dev/null 2>&1 || true
  "${VIRSH[@]}" pool-undefine "$POOL" >/dev/null 2>&1 || true
  mkdir -p "$dir/run/pool"
  "${VIRSH[@]}" pool-define-as "$POOL" dir --target "$dir/run/pool" >/dev/null
  "${VIRSH[@]}" pool-start "$POOL" >/dev/null

  # sushy-emulator (libvirt driver, basic auth), inside bcme2e-ctl: one for
  # the machines that run bcd, one of its own for the agentless machine,
  # whose password its dedicated teardown rotates (an emulator's accounts
  # are one htpasswd file for every system it serves).
  sushy_up sushy "$SUSHY_PORT" "$SUSHY_PASSWORD"
  sushy_up sushy-oob "$SUSHY_OOB_PORT" "$SUSHY_OOB_PASSWORD"

  cat >"$dir/run/env" <<EOF
export BCM_E2E_DIR=$dir
export BCM_E2E_LAN_NS=$LAN BCM_E2E_DHCP_NS=$DHCP BCM_E2E_CTL_NS=$CTL
export BCM_E2E_CTL_IP=10.78.0.3 BCM_E2E_DHCP_IP=10.78.0.2 BCM_E2E_TAPS="tap0 tap1 tap2 tap3"
export BCM_E2E_SUSHY_URL=http://127.0.0.1:$SUSHY_PORT BCM_E2E_SUSHY_USER=$SUSHY_USER BCM_E2E_SUSHY_PASSWORD=$SUSHY_PASSWORD
export BCM_E2E_SUSHY_OOB_URL=http://127.0.0.1:$SUSHY_OOB_PORT BCM_E2E_SUSHY_OOB_PASSWORD=$SUSHY_OOB_PASSWORD
EOF
  log "up in $((SECONDS - t0)) s: $dir (eval \$(cat $dir/run/env))"
}

# shellcheck disable=SC2154  # rc is the EXIT trap's own
case $cmd in
  up) trap 'rc=$?; if [ $rc -ne 0 ]; then log "up failed; tearing down"; down; fi; exit $rc' EXIT; up ;;
  down) down ;;
  *) usage ;;
esac
