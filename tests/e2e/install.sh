#!/usr/bin/env bash
# Installs everything the end-to-end lab (tests/e2e/lab.sh, vm.sh) needs, then
# prints the environment naming it (eval it). Owns:
#   - the peers (tests/peers/install.sh: sushy-tools in .bcm/venv-sushy, ...)
#     and the boot artifacts (tests/boot-e2e/build.sh: QEMU 10 from
#     bookworm-backports, OVMF, iPXE, dnsmasq, kernel + busybox ramdisk);
#   - libvirt 9.0 from bookworm main (libvirtd/virtlogd started by hand by
#     lab.sh; the Debian packages' services are never started: no systemd);
#     it must not replace the backports QEMU, which is checked afterwards;
#   - libvirt-python (pinned, compiled against libvirt-dev) in the sushy venv,
#     for sushy-emulator's libvirt driver;
#   - host-side disk tools for images with partitions on a kernel without
#     partition or device-mapper support: sfdisk/sgdisk, mke2fs, mtools,
#     dosfstools, syslinux (BIOS + EFI), wipefs/blkid;
#   - ethtool (the lab turns tx checksum offload off on its veths);
#   - ssh (openssh-client): the operator's login into the rescue ramdisk.
# Idempotent; needs only Debian's mirrors and PyPI.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="$root/.bcm/venv-sushy"
LIBVIRT_PYTHON_VERSION=12.8.0
log() { echo "e2e: $*" >&2; }

peers_env=$(bash "$root/tests/peers/install.sh")
boot_env=$(bash "$root/tests/boot-e2e/build.sh")

qemu_before="$(qemu-system-x86_64 --version | head -1) / $(qemu-img --version | head -1)"
need=()
command -v libvirtd >/dev/null || need+=(libvirt-daemon-system)
[ -e /usr/lib/x86_64-linux-gnu/libvirt/connection-driver/libvirt_driver_qemu.so ] || need+=(libvirt-daemon-driver-qemu)
command -v virsh >/dev/null || need+=(libvirt-clients)
[ -e /usr/include/libvirt/libvirt.h ] || need+=(libvirt-dev)
command -v pkg-config >/dev/null || need+=(pkg-config)
command -v sfdisk >/dev/null || need+=(fdisk)
command -v sgdisk >/dev/null || need+=(gdisk)
command -v mke2fs >/dev/null || need+=(e2fsprogs)
command -v mcopy >/dev/null || need+=(mtools)
command -v ssh >/dev/null || need+=(openssh-client)
command -v mkfs.vfat >/dev/null || need+=(dosfstools)
command -v syslinux >/dev/null || need+=(syslinux)
[ -e /usr/lib/syslinux/mbr/gptmbr.bin ] || need+=(syslinux-common)
[ -e /usr/lib/SYSLINUX.EFI/efi64/syslinux.efi ] || need+=(syslinux-efi)
[ -e /usr/lib/ISOLINUX/isolinux.bin ] || need+=(isolinux)   # the agentless installer ISO
command -v xorriso >/dev/null || need+=(xorriso)
command -v cpio >/dev/null || need+=(cpio)
command -v jq >/dev/null || need+=(jq)                # run.sh reads the API's JSON
command -v ip >/dev/null || need+=(iproute2)
command -v pgrep >/dev/null || need+=(procps)
command -v flock >/dev/null || need+=(util-linux)
command -v psql >/dev/null || need+=(postgresql-client)
command -v ethtool >/dev/null || need+=(ethtool)   # tx checksum offload off on the veths
command -v gcc >/dev/null || need+=(gcc)          # libvirt-python builds from source
python3 -c 'import sysconfig,os,sys; sys.exit(not os.path.exists(sysconfig.get_paths()["include"] + "/Python.h"))' \
  || need+=(python3-dev)
if [ "${#need[@]}" -gt 0 ]; then
  log "installing ${need[*]}"
  apt-get update -qq >&2
  # From bookworm main: libvirt 9.0 works with the backports QEMU 10 and
  # does not pull qemu-system (checked below).
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
fi
qemu_after="$(qemu-system-x86_64 --version | head -1) / $(qemu-img --version | head -1)"
if [ "$qemu_before" != "$qemu_after" ]; then
  log "QEMU changed under the libvirt install: $qemu_before -> $qemu_after"; exit 1
fi

if [ "$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("libvirt-python"))' 2>/dev/null)" \
     != "$LIBVIRT_PYTHON_VERSION" ]; then
  log "installing libvirt-python==$LIBVIRT_PYTHON_VERSION into $venv (compiles, ~1 min)"
  "$venv/bin/pip" install -q --disable-pip-version-check "libvirt-python==$LIBVIRT_PYTHON_VERSION" >&2
fi
"$venv/bin/python" -c 'import libvirt' >&2

echo "$peers_env"       # BCM_SUSHY_EMULATOR, BCM_SUSHY_PYTHON, BCM_IPMI_SIM
echo "$boot_env"        # BCM_PXE_E2E_DIR
echo "export BCM_E2E_LIBVIRTD=$(command -v libvirtd) BCM_E2E_VIRSH=$(command -v virsh)"
