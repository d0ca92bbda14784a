#!/usr/bin/env bash
# Installs what the boot service's QEMU test needs and builds its ramdisk,
# then prints the environment naming them (eval it):
#   - QEMU (TCG), SeaBIOS with QEMU's iPXE ROMs, OVMF, Debian's iPXE builds,
#     dnsmasq (it hands out addresses and router advertisements only: the
#     PXE part is ours), busybox-static and cpio;
#   - a Debian kernel (only vmlinuz is taken from the .deb) and a busybox
#     initramfs whose /init prints `BCM-RAMDISK-UP <bcm.marker>` from the
#     kernel command line on the serial console and powers off.
# Idempotent and cached under .bcm/boot-e2e; nothing here needs more than
# Debian's mirrors. (qemu-system-x86 from bookworm main removes qemu-utils
# unless both are installed in one command.)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
out="$root/.bcm/boot-e2e"
log() { echo "boot-e2e: $*" >&2; }
mkdir -p "$out/dl"

need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86 qemu-utils)
[ -e /usr/lib/ipxe/qemu/pxe-virtio.rom ] || [ -e /usr/lib/ipxe/qemu/efi-virtio.rom ] || need+=(ipxe-qemu)
[ -e /usr/lib/ipxe/ipxe.efi ] || need+=(ipxe)
[ -e /usr/share/OVMF/OVMF_CODE_4M.fd ] || need+=(ovmf)
[ -x /bin/busybox ] && /bin/busybox --list 2>/dev/null | grep -qx udhcpc || need+=(busybox-static)
command -v cpio >/dev/null || need+=(cpio)
command -v dnsmasq >/dev/null || need+=(dnsmasq-base)
if [ "${#need[@]}" -gt 0 ]; then
  log "installing ${need[*]}"
  # This machine kind ships qemu-utils from bookworm-backports without a
  # backports entry; bookworm's qemu-system-x86 would need to downgrade it.
  # Take QEMU from backports too (same mirror as debian.sources).
  if dpkg-query -W -f='${Version}' qemu-utils 2>/dev/null | grep -q bpo12 \
     && [ ! -e /etc/apt/sources.list.d/bcm-backports.sources ]; then
    uris=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
    printf 'Types: deb\nURIs: %s\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
      "${uris:-http://deb.debian.org/debian}" > /etc/apt/sources.list.d/bcm-backports.sources
  fi
  apt-get update -qq >&2
  backports=()
  [ -e /etc/apt/sources.list.d/bcm-backports.sources ] && backports=(-t bookworm-backports)
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${backports[@]}" \
    "${need[@]}" qemu-utils >&2
fi

if [ ! -s "$out/vmlinuz" ]; then
  kpkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
  kver=${kpkg#linux-image-}
  log "fetching $kpkg"
  (cd "$out/dl" && ls ${kpkg}_*.deb >/dev/null 2>&1 || apt-get download "$kpkg" >&2)
  rm -rf "$out/dl/k" && mkdir -p "$out/dl/k"
  dpkg-deb --fsys-tarfile "$out"/dl/${kpkg}_*.deb | tar -x -C "$out/dl/k" "./boot/vmlinuz-$kver"
  cp "$out/dl/k/boot/vmlinuz-$kver" "$out/vmlinuz.tmp" && mv "$out/vmlinuz.tmp" "$out/vmlinuz"
  rm -rf "$out/dl/k"
fi

if [ ! -s "$out/initrd.img" ] || [ "$0" -nt "$out/initrd.img" ]; then
  rd="$out/initrd"
  rm -rf "$rd" && mkdir -p "$rd/bin" "$rd/proc" "$rd/sys" "$rd/dev"
  cp /bin/busybox "$rd/bin/busybox"
  cat > "$rd/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox mkdir -p /usr/bin /usr/sbin /sbin
/bin/busybox --install -s
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
marker=
for a in $(cat /proc/cmdline); do case $a in bcm.marker=*) marker=${a#bcm.marker=};; esac; done
echo "BCM-RAMDISK-UP $marker uptime=$(cut -d' ' -f1 /proc/uptime)"
poweroff -f
INIT
  chmod +x "$rd/init"
  (cd "$rd" && find . | cpio -o -H newc --quiet | gzip -9) > "$out/initrd.img.tmp"
  mv "$out/initrd.img.tmp" "$out/initrd.img"
fi
echo "export BCM_PXE_E2E_DIR=$out"
