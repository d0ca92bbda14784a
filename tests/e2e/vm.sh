#!/usr/bin/env bash
# The lab's machines and their disks (root; the lab is up: tests/e2e/lab.sh).
#   vm.sh disk PATH [SIZE]        a qcow2 disk (default 2G) with a GPT, an ext4
#                                 partition and random data at the start and
#                                 tail of a second partition; PATH.layout
#                                 says where (offsets, sha256s) for checks
#   vm.sh check-disk PATH         what of that is still there (signatures
#                                 by wipefs/blkid, random data by sha256)
#   vm.sh define DIR NAME FIRMWARE MAC TAP DISK [readonly]
#                                 FIRMWARE bios|uefi; XML in DIR/run/NAME.xml,
#                                 serial console in DIR/logs/NAME.serial; the
#                                 domain is recorded in DIR/run/domains so
#                                 lab.sh down destroys and undefines it
#   vm.sh set-readonly DIR NAME on|off
#                                 the domain's disk read-only or not, from its
#                                 next cold start on
#   vm.sh swap-disk DIR NAME DISK SERIAL
#                                 another disk (file and serial) in the
#                                 domain's slot, from its next cold start on:
#                                 a disk swapped in the machine
# Each disk has a serial (NAME-d0 at first), as real disks do; bcd reports
# it and a wipe must account for the inventory's disks by it.
# The domains are TCG (`type='qemu'`: KVM here is PVM and hangs kernels).
# Boot order is the BMC's: only the disk carries <boot order='1'/> at first;
# sushy's PATCH BootSourceOverrideTarget=Pxe makes the NIC 1 and the disk 2
# (PXE, then the disk when PXE ends), Hdd makes the disk the only one.
# UEFI is OVMF (4M, no secure boot) on q35 with the NIC's option ROM off, so
# OVMF's own PXE client runs (port 4011 and TFTP).
set -euo pipefail
MARK="bcm-e2e-lab"                  # lab.sh down also finds domains by it
VIRSH=(virsh -q -c qemu:///system)
die() { echo "vm: $*" >&2; exit 1; }

disk() {
  local path=$1 size=${2:-2G} raw="$1.raw.tmp" mib=$((1024 * 1024))
  rm -f "$raw"; truncate -s "$size" "$raw"
  local bytes; bytes=$(stat -c %s "$raw")
  (( bytes >= 64 * mib )) || die "disk: $size is too small (64 MiB at least)"
  # p1 ext4 at 1 MiB (32 MiB), p2 from 33 MiB to 1 MiB before the end (the
  # backup GPT is in that last MiB).
  local p2_start=$((33 * mib)) p2_end=$((bytes - mib))
  sfdisk -q "$raw" <<EOF
label: gpt
start=2048, size=65536, type=0FC63DAF-8483-4772-8E79-3D69D8477DE4, name=bcm-e2e-root
start=$((p2_start / 512)), size=$(((p2_end - p2_start) / 512)), type=0FC63DAF-8483-4772-8E79-3D69D8477DE4, name=bcm-e2e-data
EOF
  # No partition devices on this kernel: build the filesystem in a file and
  # copy it in at the partition's offset.
  rm -f "$raw.p1"; truncate -s 32M "$raw.p1"
  mke2fs -q -t ext4 -L bcm-e2e-root -U 6f1e3c2a-0e2e-4c1a-9b0e-0000000e2e01 "$raw.p1"
  dd if="$raw.p1" of="$raw" bs=1M seek=1 conv=notrunc,sparse status=none; rm -f "$raw.p1"
  # Random data: the first and the last MiB of p2.
  head -c $mib /dev/urandom >"$raw.head"; head -c $mib /dev/urandom >"$raw.tail"
  dd if="$raw.head" of="$raw" bs=512 seek=$((p2_start / 512)) conv=notrunc status=none
  dd if="$raw.tail" of="$raw" bs=512 seek=$(((p2_end - mib) / 512)) conv=notrunc status=none
  cat >"$path.layout" <<EOF
size=$bytes
p1_offset=$mib
p1_fs=ext4
p1_uuid=6f1e3c2a-0e2e-4c1a-9b0e-0000000e2e01
p2_head_offset=$p2_start
p2_head_sha256=$(sha256sum <"$raw.head" | cut -d' ' -f1)
p2_tail_offset=$((p2_end - mib))
p2_tail_sha256=$(sha256sum <"$raw.tail" | cut -d' ' -f1)
EOF
  rm -f "$raw.head" "$raw.tail"
  qemu-img convert -f raw -O qcow2 "$raw" "$path"; rm -f "$raw"
}

# What is still on a disk vm.sh made, one finding a line: `signature TYPE
# OFFSET` (wipefs, whole disk), `p1 ext4|none`, `p2_head|p2_tail intact|changed`.
check_disk() {
  local path=$1 raw; raw=$(mktemp "${TMPDIR:-/tmp}/bcme2e-disk.XXXXXX")
  # shellcheck disable=SC2034  # set by the layout file, read via ${!var}
  local size p1_offset p2_head_offset p2_head_sha256 p2_tail_offset p2_tail_sha256
  # shellcheck source=/dev/null
  . "$path.layout"
  qemu-img convert -f qcow2 -O raw "$path" "$raw"
  wipefs -n --noheadings -O TYPE,OFFSET "$raw" | awk '{print "signature", $1, $2}'
  echo "p1 $(blkid -p -O "$p1_offset" -s TYPE -o value "$raw" || echo none)"
  for r in p2_head p2_tail; do
    local off=${r}_offset want=${r}_sha256
    local got; got=$(dd if="$raw" bs=1M iflag=skip_bytes,count_bytes skip="${!off}" count=$((1024 * 1024)) status=none | sha256sum | cut -d' ' -f1)
    [ "$got" = "${!want}" ] && echo "$r intact" || echo "$r changed"
  done
  rm -f "$raw"
}

define() {
  local dir name fw mac tap disk ro=""
  dir=$(cd "$1" && pwd); name=$2; fw=$3; mac=$4; tap=$5; disk=$(realpath "$6")
  case ${7:-} in readonly) ro="<readonly/>" ;; "") ;; *) die "the 7th argument is readonly or nothing" ;; esac
  [ -f "$disk" ] || die "no disk $disk"
  # SeaBIOS named as the loader, so sushy reports (and can set) Legacy mode.
  local machine=pc rom=""
  local os_extra="<loader type='rom'>/usr/share/seabios/bios-256k.bin</loader>
    <bios useserial='yes'/>"
  case $fw in
    bios) ;;
    uefi)
      machine=q35 rom="<rom enabled='no'/>"
      # The nvram name ends in .nosecboot.fd: the one sushy's boot mode PATCH
      # would give it, so such a PATCH keeps the same file.
      os_extra="<loader readonly='yes' secure='no' type='pflash'>/usr/share/OVMF/OVMF_CODE_4M.fd</loader>
    <nvram template='/usr/share/OVMF/OVMF_VARS_4M.fd'>$dir/run/$name.nosecboot.fd</nvram>" ;;
    *) die "firmware must be bios or uefi, not $fw" ;;
  esac
  cat >"$dir/run/$name.xml" <<EOF
<domain type='qemu'>
  <name>$name</name>
  <description>$MARK</description>
  <memory unit='MiB'>768</memory>
  <vcpu>1</vcpu>
  <os>
    <type arch='x86_64' machine='$machine'>hvm</type>
    $os_extra
  </os>
  <features><acpi/><apic/></features>
  <!-- QEMU as root (lab.sh's qemu.conf too), files left as they are. -->
  <seclabel type='static' model='dac' relabel='no'><label>+0:+0</label></seclabel>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>restart</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2'/>
      <source file='$disk'/>
      <target dev='vda' bus='virtio'/>
      <serial>$name-d0</serial>
      <boot order='1'/>
      $ro
    </disk>
    <interface type='ethernet'>
      <mac address='$mac'/>
      <target dev='$tap' managed='no'/>
      <model type='virtio'/>
      $rom
    </interface>
    <serial type='file'>
      <source path='$dir/logs/$name.serial' append='on'/>
      <target port='0'/>
    </serial>
    <console type='file'>
      <source path='$dir/logs/$name.serial' append='on'/>
      <target type='serial' port='0'/>
    </console>
  </devices>
</domain>
EOF
  # Defined before (no <uuid> in the XML, so a define would clash): replace it.
  if "${VIRSH[@]}" domstate "$name" >/dev/null 2>&1; then
    "${VIRSH[@]}" desc --config "$name" | grep -qx "$MARK" || die "domain $name exists and is not the lab's"
    "${VIRSH[@]}" destroy "$name" >/dev/null 2>&1 || true
    "${VIRSH[@]}" undefine --nvram "$name" >/dev/null
  fi
  "${VIRSH[@]}" define "$dir/run/$name.xml" >/dev/null
  grep -qx "$name" "$dir/run/domains" 2>/dev/null || echo "$name" >>"$dir/run/domains"
  # QEMU's own log (libvirt's, appended to across runs): this run's only.
  : >"/var/log/libvirt/qemu/$name.log"
  ln -sf "/var/log/libvirt/qemu/$name.log" "$dir/logs/$name.qemu.log"
}

set_readonly() {
  local dir=$1 name=$2 on=$3
  # The persistent definition: a running machine keeps its disk as it is
  # until its next cold start (a BMC's ForceOff + On, or sushy's
  # ForceRestart, which is destroy + create).
  "${VIRSH[@]}" dumpxml --inactive "$name" | python3 -c '
import sys, xml.etree.ElementTree as ET
t = ET.parse(sys.stdin); d = t.find("./devices/disk[@device=\"disk\"]")
for r in d.findall("readonly"): d.remove(r)
if sys.argv[1] == "on": ET.SubElement(d, "readonly")
t.write(sys.stdout, encoding="unicode")' "$on" >"$dir/run/$name.xml"
  "${VIRSH[@]}" define "$dir/run/$name.xml" >/dev/null
}

swap_disk() {
  local dir=$1 name=$2 disk serial=$4
  disk=$(realpath "$3"); [ -f "$disk" ] || die "no disk $disk"
  "${VIRSH[@]}" dumpxml --inactive "$name" | python3 -c '
import sys, xml.etree.ElementTree as ET
t = ET.parse(sys.stdin); d = t.find("./devices/disk[@device=\"disk\"]")
d.find("source").set("file", sys.argv[1])
s = d.find("serial")
if s is None: s = ET.SubElement(d, "serial")
s.text = sys.argv[2]
t.write(sys.stdout, encoding="unicode")' "$disk" "$serial" >"$dir/run/$name.xml"
  "${VIRSH[@]}" define "$dir/run/$name.xml" >/dev/null
}

case ${1:-} in
  disk) [ $# -ge 2 ] || die "usage: vm.sh disk PATH [SIZE]"; disk "$2" "${3:-2G}" ;;
  define) [ $# -ge 7 ] || die "usage: vm.sh define DIR NAME bios|uefi MAC TAP DISK [readonly]"; shift; define "$@" ;;
  check-disk) [ $# -eq 2 ] || die "usage: vm.sh check-disk PATH"; check_disk "$2" ;;
  set-readonly) [ $# -eq 4 ] && [[ $4 == on || $4 == off ]] || die "usage: vm.sh set-readonly DIR NAME on|off"
    set_readonly "$2" "$3" "$4" ;;
  swap-disk) [ $# -eq 5 ] || die "usage: vm.sh swap-disk DIR NAME DISK SERIAL"; swap_disk "$2" "$3" "$4" "$5" ;;
  *) die "usage: vm.sh disk|check-disk|define|set-readonly|swap-disk ..." ;;
esac
