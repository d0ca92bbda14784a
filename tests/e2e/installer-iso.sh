#!/usr/bin/env bash
# The installer an agentless machine is handed as virtual media: a BIOS
# bootable ISO (isolinux) with the ramdisk's kernel and an initramfs whose
# /init writes the e2e OS image to /dev/vda and powers the machine off —
# the hand-off the control plane waits for, since nothing on the machine
# reports to it. No agent runs in it (no bcd is started); it stands in for
# a real installer such as Talos' ISO.
#
#   tests/e2e/installer-iso.sh RAMDISK_DIR OS_RAW OUT_DIR
#
# The initramfs is the ramdisk's (busybox and the disk modules) with a
# second cpio archive appended that replaces /init and carries the image;
# the kernel unpacks both in order. Writes OUT_DIR/installer.iso and prints
# its sha256 and size.
set -euo pipefail
rd=$1 os=$2 out=$3
mkdir -p "$out"
stage="$out/stage" extra="$out/extra"
rm -rf "$stage" "$extra"
mkdir -p "$stage/isolinux" "$extra"
gzip -1 -c "$os" > "$extra/os.raw.gz"
sha256sum "$os" | cut -d' ' -f1 > "$extra/os.sha256"
cat > "$extra/init" <<'INIT'
#!/bin/busybox sh
# An agentless installer: write the image, power off. Nothing here talks to
# the control plane.
/bin/busybox --install -s
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
echo "bcm-installer: up (agentless: no agent runs here)"
for m in $(cat /lib/modules/load-order); do insmod "/lib/modules/$m" 2>/dev/null; done
for _ in $(seq 1 50); do [ -b /dev/vda ] && break; sleep 0.2; done
if [ ! -b /dev/vda ]; then echo "bcm-installer: no /dev/vda; not handing back"; exec sh; fi
if ! gunzip -c /os.raw.gz | dd of=/dev/vda bs=1M conv=fsync 2>/dev/null; then
  echo "bcm-installer: writing /dev/vda failed; not handing back"; exec sh
fi
sync
echo "bcm-installer: wrote the OS image $(cat /os.sha256) to /dev/vda; powering off (the hand-off)"
poweroff -f
INIT
chmod 0755 "$extra/init"
cp "$rd/vmlinuz" "$stage/vmlinuz"
{ cat "$rd/initrd.img"; (cd "$extra" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc --quiet --owner=0:0 | gzip -1); } \
  > "$stage/installer.img"
cp /usr/lib/ISOLINUX/isolinux.bin /usr/lib/syslinux/modules/bios/ldlinux.c32 "$stage/isolinux/"
cat > "$stage/isolinux/isolinux.cfg" <<'CFG'
SERIAL 0 115200
DEFAULT install
PROMPT 0
TIMEOUT 0
LABEL install
  LINUX /vmlinuz
  INITRD /installer.img
  APPEND console=ttyS0 bcm.installer=1
CFG
xorriso -as mkisofs -quiet -o "$out/installer.iso" -V BCM_INSTALLER \
  -b isolinux/isolinux.bin -c isolinux/boot.cat -no-emul-boot -boot-load-size 4 -boot-info-table \
  "$stage" 2>/dev/null
rm -rf "$stage" "$extra"
echo "$(sha256sum "$out/installer.iso" | cut -d' ' -f1) $(stat -c %s "$out/installer.iso")"
