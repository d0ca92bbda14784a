#!/usr/bin/env bash
# Installs the real BMC peers the bmc service's tests run against, then
# prints the environment they need (eval it):
#   - sushy-tools' Redfish emulator (PyPI, pinned) in a venv under .bcm/;
#   - OpenIPMI's ipmi_sim and ipmitool (Debian packages);
#   - the boot service's clients and reference servers (Debian packages):
#     tftp-hpa's tftp, curl, tftpd-hpa, dnsmasq, the ipxe builds;
#   - bcd's disk tests: gdisk (sgdisk), e2fsprogs, util-linux (losetup,
#     wipefs, blkid), qemu-utils (qemu-img), libfuse2 and fusepy (PyPI,
#     pinned) for a FUSE disk that drops writes;
#   - tinyproxy (Debian package): the site's upstream HTTP proxy that the
#     boot service's image cache fetches through.
# Idempotent; nothing here needs more than PyPI and Debian's mirrors.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="$root/.bcm/venv-sushy"
SUSHY_TOOLS_VERSION=2.2.0
log() { echo "peers: $*" >&2; }

if ! "$venv/bin/python" -c "import sushy_tools, bcrypt" >/dev/null 2>&1 \
   || [ "$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("sushy-tools"))' 2>/dev/null)" != "$SUSHY_TOOLS_VERSION" ]; then
  log "installing sushy-tools==$SUSHY_TOOLS_VERSION into $venv"
  mkdir -p "$root/.bcm"
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install -q --disable-pip-version-check "sushy-tools==$SUSHY_TOOLS_VERSION" bcrypt >&2
fi
if ! command -v ipmi_sim >/dev/null || ! command -v ipmitool >/dev/null; then
  log "installing openipmi and ipmitool"
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openipmi ipmitool >&2
fi
if ! command -v tftp >/dev/null || ! command -v in.tftpd >/dev/null || ! command -v dnsmasq >/dev/null \
   || [ ! -e /usr/lib/ipxe/undionly.kpxe ] || ! command -v curl >/dev/null; then
  log "installing tftp-hpa, tftpd-hpa, dnsmasq-base, ipxe, curl"
  apt-get update -qq >&2
  # tftpd-hpa's maintainer script starts a daemon where it can; stop it.
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    tftp-hpa tftpd-hpa dnsmasq-base ipxe curl >&2
  pkill -x in.tftpd 2>/dev/null || true
fi
if ! command -v sgdisk >/dev/null || ! command -v mkfs.ext4 >/dev/null || ! command -v qemu-img >/dev/null \
   || ! command -v wipefs >/dev/null || [ ! -e /usr/lib/x86_64-linux-gnu/libfuse.so.2 ]; then
  log "installing gdisk, e2fsprogs, fdisk, libfuse2, fuse, qemu-utils"
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    gdisk e2fsprogs util-linux libfuse2 fuse qemu-utils >&2
fi
if ! command -v tinyproxy >/dev/null; then
  log "installing tinyproxy (the site's upstream HTTP proxy in the image cache's test)"
  apt-get update -qq >&2
  # Its maintainer script starts a daemon where it can; stop it.
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends tinyproxy >&2
  pkill -x tinyproxy 2>/dev/null || true
fi
if ! "$venv/bin/python" -c "import fuse" >/dev/null 2>&1; then
  log "installing fusepy==3.0.1 into $venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "fusepy==3.0.1" >&2
fi
echo "export BCM_SUSHY_EMULATOR=$venv/bin/sushy-emulator"
echo "export BCM_SUSHY_PYTHON=$venv/bin/python"
echo "export BCM_IPMI_SIM=$(command -v ipmi_sim)"
echo "export BCM_TINYPROXY=$(command -v tinyproxy)"
