#!/usr/bin/env bash
# Builds the ramdisk the boot service hands to machines: Debian's kernel and
# a minimal initramfs (busybox-static, the virtio/e1000, FAT, ACPI button
# and evdev modules in load order, udhcpc, acpid honouring the power
# button) whose /init starts the real, statically linked `bcd`.
#
#   deploy/ramdisk/build.sh [out-dir]            (default .bcm/ramdisk)
#
# The same initramfs serves these modes, chosen by /init:
#   - a kernel command line with `bcm.join=` (the boot service's entry):
#     `bcd ramdisk` (inspect, diag, wipe, deploy);
#   - with `bcm.mode=rescue` as well (a node in `rescue`): before bcd, a
#     root shell on the serial console and, for the rescue's key
#     (`bcm.ssh=<type>:<base64>`), dropbear on port 22 (key logins only);
#   - otherwise (booted from an installed disk): the first partition with a
#     NoCloud seed (`/var/lib/cloud/seed/nocloud/user-data`, written by
#     `bcd` at deploy time) is mounted and `bcd node --env-file` joins with
#     the token in it, keeping its identity on that partition
#     (`var/lib/bcd`, root only), which it rejoins with after a reboot;
#     a quorum anchor on that partition (`etc/bcd/trust/quorum-anchor.json`,
#     its operator's) is what a `node.wipe` is verified against.
#
# Reproducible: files sorted, times clamped to SOURCE_DATE_EPOCH (default:
# the kernel package's date), `cpio --reproducible`, `gzip -n`. Prints the
# sha256 of each artifact and writes `catalog.toml` (the boot service's
# `[[images]]` entries, file:// URLs) and SHA256SUMS next to them.
# Environment: BCD_BIN (a static bcd; default: deploy/bcd/build-static.sh),
# KERNEL_PACKAGE (default: what linux-image-amd64 depends on today),
# BCD_TRUST_DIR (what bcd pins, copied to /etc/bcd/trust: `ca.crt`, the
# control plane's CA, and `image-keys`, one base64 ed25519 image-signing
# key a line; bcd never takes either from a network answer),
# RAMDISK_EXTRA_BIN (a directory whose executables go to /usr/bin: tools a
# site adds, such as a GPU stack's dcgmi, or a test's stand-ins).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
out="$(mkdir -p "${1:-$root/.bcm/ramdisk}" && cd "${1:-$root/.bcm/ramdisk}" && pwd)"
log() { echo "ramdisk: $*" >&2; }

need=()
# The initramfs has no libc: only a static busybox runs there (Debian's
# `busybox` package is dynamic; `busybox-static` replaces it).
{ [ -x /bin/busybox ] && ldd /bin/busybox 2>&1 | grep -q "not a dynamic" \
  && /bin/busybox --list 2>/dev/null | grep -qx udhcpc; } || need+=(busybox-static)
command -v cpio >/dev/null || need+=(cpio)
# The rescue ramdisk's SSH server (key logins only, in rescue mode only).
[ -x /usr/sbin/dropbear ] || need+=(dropbear-bin)
if [ "${#need[@]}" -gt 0 ]; then
  log "installing ${need[*]}"
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
fi

# The agent: one static binary (the ramdisk has no libc).
bcd="${BCD_BIN:-}"
if [ -z "$bcd" ]; then
  "$root/deploy/bcd/build-static.sh" "$out/bin" >&2
  bcd="$out/bin/bcd"
fi
if ! ldd "$bcd" 2>&1 | grep -qE "statically linked|not a dynamic executable"; then
  log "$bcd is not statically linked"; exit 1
fi

# The kernel: vmlinuz and the few modules the ramdisk loads, from the .deb
# (unpacking the whole package is 391 MB).
dl="$root/.bcm/dl"
mkdir -p "$dl"
kpkg="${KERNEL_PACKAGE:-$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}')}"
[ -n "$kpkg" ] || { log "no kernel package found (apt-get update? or set KERNEL_PACKAGE)"; exit 1; }
kver="${kpkg#linux-image-}"
deb="$(ls "$dl"/"${kpkg}"_*.deb 2>/dev/null | head -n1 || true)"
if [ -z "$deb" ]; then
  log "fetching $kpkg"
  (cd "$dl" && apt-get download "$kpkg" >&2)
  deb="$(ls "$dl"/"${kpkg}"_*.deb | head -n1)"
fi
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(stat -c %Y "$deb")}"
# Load order matters: a module's dependencies first.
modules=(
  net/core/failover drivers/net/net_failover
  drivers/virtio/virtio_ring drivers/virtio/virtio drivers/virtio/virtio_pci_legacy_dev
  drivers/virtio/virtio_pci_modern_dev drivers/virtio/virtio_pci
  drivers/net/virtio_net drivers/block/virtio_blk drivers/net/ethernet/intel/e1000/e1000
  drivers/acpi/button drivers/input/evdev
  fs/fat/fat fs/fat/vfat fs/nls/nls_cp437 fs/nls/nls_ascii fs/nls/nls_utf8 fs/nls/nls_iso8859-1
)
k="$out/.kernel"
rm -rf "$k" && mkdir -p "$k"
paths=("./boot/vmlinuz-$kver")
for m in "${modules[@]}"; do paths+=("./lib/modules/$kver/kernel/$m.ko"); done
dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$k" "${paths[@]}"
cp "$k/boot/vmlinuz-$kver" "$out/vmlinuz"

rd="$out/.initrd"
rm -rf "$rd"
mkdir -p "$rd"/{bin,sbin,usr/bin,usr/sbin,proc,sys,dev,run,tmp,mnt,etc/bcd,etc/acpi/PWRF,lib/modules,usr/share/udhcpc}
cp /bin/busybox "$rd/bin/busybox"
install -m 0755 "$bcd" "$rd/bin/bcd"
: > "$rd/lib/modules/load-order"
for m in "${modules[@]}"; do
  cp "$k/lib/modules/$kver/kernel/$m.ko" "$rd/lib/modules/"
  echo "$(basename "$m").ko" >> "$rd/lib/modules/load-order"
done
cat > "$rd/usr/share/udhcpc/default.script" <<'DHCP'
#!/bin/busybox sh
# udhcpc's hook: configure the interface and the default route.
case "$1" in
  deconfig) ip -4 addr flush dev "$interface"; ip link set "$interface" up ;;
  bound|renew)
    ip -4 addr flush dev "$interface"
    ip addr add "$ip/${mask:-24}" dev "$interface"
    for r in $router; do ip route replace default via "$r" dev "$interface"; break; done
    echo "bcm-ramdisk: $interface $ip/${mask:-24}" ;;
esac
DHCP
# A graceful power-off (the BMC's ACPI power button) is honoured: busybox
# acpid runs this on the button's press (its built-in table maps it to
# PWRF/00000080 under /etc/acpi).
cat > "$rd/etc/acpi/PWRF/00000080" <<'ACPI'
#!/bin/busybox sh
echo "bcm-ramdisk: ACPI power button: syncing and powering off"
sync
poweroff -f
ACPI
chmod 0755 "$rd/etc/acpi/PWRF/00000080"
# Rescue: dropbear with the libraries it links (the only dynamic program
# here), root's account, and nothing else; /init starts it in rescue mode
# only, with the rescue's key as root's one authorized key.
install -m 0755 /usr/sbin/dropbear "$rd/usr/sbin/dropbear"
for lib in $(ldd /usr/sbin/dropbear | grep -oE '/[^ ]+\.so[^ ]*'); do
  mkdir -p "$rd$(dirname "$lib")"
  cp -L "$lib" "$rd$lib"
done
mkdir -p "$rd/root" "$rd/etc/dropbear" "$rd/var/log"
chmod 0700 "$rd/root"
echo "root:x:0:0:root:/root:/bin/sh" > "$rd/etc/passwd"
echo "root:x:0:" > "$rd/etc/group"
echo "/bin/sh" > "$rd/etc/shells"
if [ -n "${RAMDISK_EXTRA_BIN:-}" ]; then
  for f in "$RAMDISK_EXTRA_BIN"/*; do
    [ -f "$f" ] && [ -x "$f" ] || continue
    install -m 0755 "$f" "$rd/usr/bin/$(basename "$f")"
    log "added /usr/bin/$(basename "$f") from $RAMDISK_EXTRA_BIN"
  done
fi
if [ -n "${BCD_TRUST_DIR:-}" ]; then
  mkdir -p "$rd/etc/bcd/trust"
  for f in ca.crt image-keys; do
    [ -s "$BCD_TRUST_DIR/$f" ] || { log "BCD_TRUST_DIR=$BCD_TRUST_DIR has no $f"; exit 1; }
    cp "$BCD_TRUST_DIR/$f" "$rd/etc/bcd/trust/$f"
  done
  log "pinned: the control plane's CA and $(grep -c . "$rd/etc/bcd/trust/image-keys") image key(s)"
else
  log "WARNING: no BCD_TRUST_DIR: this ramdisk pins no CA and no image key; it reaches only a plain-http control plane and deploys no signed image"
fi
cat > "$rd/init" <<'INIT'
#!/bin/busybox sh
# The ramdisk's /init: mounts, modules, DHCP on every NIC, then bcd.
/bin/busybox --install -s
export PATH=/sbin:/usr/sbin:/bin:/usr/bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
mkdir -p /dev/pts && mount -t devpts devpts /dev/pts
echo "bcm-ramdisk: up after $(cut -d' ' -f1 /proc/uptime) s; kernel $(uname -r)"
for m in $(cat /lib/modules/load-order); do insmod "/lib/modules/$m" 2>/dev/null; done
# The power button (graceful power-off from the BMC) powers the machine off.
acpid -c /etc/acpi -l /dev/console 2>/dev/null || echo "bcm-ramdisk: no acpid: a graceful power-off will be forced"
ip link set lo up
sleep 1
for n in /sys/class/net/*; do
  i=${n##*/}; [ "$i" = lo ] && continue
  ip link set "$i" up
  udhcpc -i "$i" -n -q -t 10 -T 2 -s /usr/share/udhcpc/default.script || echo "bcm-ramdisk: no DHCP on $i"
done
run() {
  # bcd runs until the machine is powered off. Its join token was one-time:
  # a bcd that exits cannot join again, so the machine reboots (the
  # workflow's step times out and its retry or cleanup takes over).
  "$@"
  echo "bcm-ramdisk: bcd exited ($?); rebooting in 10 s"
  sleep 10; reboot -f
}
if grep -q "bcm.mode=rescue" /proc/cmdline; then
  # Rescue: the operator's way in, beside bcd (which tells the control
  # plane the rescue ramdisk is up). SSH for root with the rescue's key
  # only (no passwords, no forwarding); the serial console gets a root shell.
  echo "bcm-ramdisk: mode rescue"
  key=$(tr ' ' '\n' < /proc/cmdline | sed -n 's/^bcm\.ssh=//p' | head -n1)
  if [ -n "$key" ]; then
    mkdir -p /root/.ssh && chmod 0700 /root /root/.ssh
    echo "${key%%:*} ${key#*:}" > /root/.ssh/authorized_keys
    chmod 0600 /root/.ssh/authorized_keys
    if dropbear -R -s -j -k -E -p 22 -P /run/dropbear.pid; then
      echo "bcm-ramdisk: rescue SSH on port 22: root, with the rescue's ${key%%:*} key only"
    else
      echo "bcm-ramdisk: rescue SSH did not start"
    fi
  else
    echo "bcm-ramdisk: the rescue names no SSH key: the serial console only"
  fi
  setsid sh -c 'exec sh </dev/ttyS0 >/dev/ttyS0 2>&1' &
  echo "bcm-ramdisk: rescue shell on ttyS0"
fi
if grep -q "bcm.join=" /proc/cmdline; then
  echo "bcm-ramdisk: mode ramdisk"
  run /bin/bcd ramdisk
fi
# Booted from disk: the installed system's seed carries the join token.
for p in $(ls /sys/class/block | grep -E '^(vd|sd|nvme)'); do
  [ -e "/sys/class/block/$p/partition" ] || continue
  mount -o ro "/dev/$p" /mnt 2>/dev/null || continue
  seed=/mnt/var/lib/cloud/seed/nocloud/user-data
  if [ -f "$seed" ]; then
    cp "$seed" /etc/bcd/join.env
    # The quorum anchor the machine's operator pinned on its own disk (an
    # adopted machine's retire wipes through bcd node, which verifies the
    # wipe against it); one built into this initramfs comes first.
    anchor=etc/bcd/trust/quorum-anchor.json
    if [ -f "/mnt/$anchor" ] && [ ! -f "/$anchor" ]; then
      mkdir -p /etc/bcd/trust && cp "/mnt/$anchor" "/$anchor"
    fi
    umount /mnt
    # bcd keeps its identity (root only) on the installed disk: after a
    # reboot it rejoins with it, no token (the seed's was one-time).
    state=/run/bcd-node
    if mount -o rw,umask=077,quiet "/dev/$p" /mnt 2>/dev/null || mount -o rw "/dev/$p" /mnt 2>/dev/null; then
      state=/mnt/var/lib/bcd
    fi
    echo "bcm-ramdisk: mode node (seed on $p, identity kept in $state)"
    run /bin/bcd node --env-file /etc/bcd/join.env --state-dir "$state"
  fi
  umount /mnt
done
echo "bcm-ramdisk: no bcm.join= on the command line and no seed on any disk; nothing to do"
exec sh
INIT
chmod 0755 "$rd/init" "$rd/usr/share/udhcpc/default.script"
find "$rd" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
(cd "$rd" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc --quiet --reproducible --owner=0:0 | gzip -9 -n) > "$out/initrd.img.tmp"
mv "$out/initrd.img.tmp" "$out/initrd.img"
rm -rf "$k"

(cd "$out" && sha256sum vmlinuz initrd.img > SHA256SUMS)
{
  echo "# The ramdisk, built by deploy/ramdisk/build.sh ($kpkg, bcd $(sha256sum "$bcd" | cut -c1-16))."
  for f in vmlinuz initrd.img; do
    printf '[[images]]\nname = "ramdisk/%s"\nurl = "file://%s/%s"\nsha256 = "%s"\n\n' \
      "$f" "$out" "$f" "$(sha256sum "$out/$f" | cut -d' ' -f1)"
  done
} > "$out/catalog.toml"
log "kernel $kver, initrd $(stat -c %s "$out/initrd.img") bytes"
cat "$out/SHA256SUMS"
