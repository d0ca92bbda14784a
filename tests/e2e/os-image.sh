#!/usr/bin/env bash
# The small OS image the e2e deploys: a raw GPT disk with one FAT partition
# (EFI system partition, also marked legacy-BIOS-bootable) holding
# syslinux for both firmware paths (gptmbr + ldlinux.sys for BIOS,
# \EFI\BOOT\BOOTX64.EFI for UEFI), the ramdisk's kernel and initramfs and
# an /etc, so `bcd` writes its NoCloud seed there at deploy time and the
# initramfs (no `bcm.join=` on this command line) joins as the installed
# OS with the token in it.
#
#   tests/e2e/os-image.sh RAMDISK_DIR OUT_DIR
#
# Writes OUT_DIR/os.raw and OUT_DIR/os.layout (the partition's offset and
# size, for the host-side checks). Built with sgdisk, mtools and syslinux:
# no loop device, no partition support needed.
set -euo pipefail
rd=$1 out=$2
mkdir -p "$out"
img="$out/os.raw" part="$out/os.part"
mib=$((1024 * 1024))
size=$((48 * mib))
rm -f "$img" "$part"
truncate -s "$size" "$img"
# One partition from 1 MiB to 1 MiB before the end (the backup GPT).
sgdisk -o -n 1:2048:$(((size - mib) / 512 - 1)) -t 1:ef00 -c 1:bcm-e2e-os -A 1:set:2 "$img" >/dev/null
dd if=/usr/lib/SYSLINUX/gptmbr.bin of="$img" bs=440 count=1 conv=notrunc status=none
start=$((2048 * 512))
psize=$((size - mib - start))
truncate -s "$psize" "$part"
mkfs.vfat -F 16 -n BCMOS -i 0bc0e2e0 "$part" >/dev/null
export MTOOLS_SKIP_CHECK=1
mmd -i "$part" ::/etc ::/syslinux ::/EFI ::/EFI/BOOT
cfg="$out/syslinux.cfg"
cat > "$cfg" <<'CFG'
SERIAL 0 115200
DEFAULT bcm
PROMPT 0
TIMEOUT 0
LABEL bcm
  LINUX /vmlinuz
  INITRD /initrd.img
  APPEND console=ttyS0 bcm.installed=1
CFG
printf 'bcm-e2e-os\n' > "$out/hostname"
mcopy -i "$part" "$rd/vmlinuz" "$rd/initrd.img" ::/
mcopy -i "$part" "$out/hostname" ::/etc/hostname
mcopy -i "$part" "$cfg" ::/syslinux/syslinux.cfg
mcopy -i "$part" /usr/lib/syslinux/modules/bios/ldlinux.c32 ::/syslinux/
mcopy -i "$part" /usr/lib/SYSLINUX.EFI/efi64/syslinux.efi ::/EFI/BOOT/BOOTX64.EFI
mcopy -i "$part" /usr/lib/syslinux/modules/efi64/ldlinux.e64 "$cfg" ::/EFI/BOOT/
syslinux --install --directory /syslinux "$part"
dd if="$part" of="$img" bs=1M seek=1 conv=notrunc status=none
rm -f "$part"
printf 'part_offset=%s\npart_size=%s\nsize=%s\n' "$start" "$psize" "$size" > "$out/os.layout"
sha256sum "$img"
