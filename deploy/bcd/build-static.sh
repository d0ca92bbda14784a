#!/usr/bin/env bash
# Builds bcd as one static binary (glibc linked statically: the ramdisk has
# no libc of its own) and prints its path and sha256. Usage:
#   deploy/bcd/build-static.sh [out-dir]      (default .bcm/bcd)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
out="${1:-$root/.bcm/bcd}"
target=x86_64-unknown-linux-gnu
cd "$root"
RUSTFLAGS="-C target-feature=+crt-static" \
  cargo build --release -p bcm-bcd --bin bcd --target "$target" --target-dir "$root/target/static" >&2
bin="$root/target/static/$target/release/bcd"
if ! ldd "$bin" 2>&1 | grep -qE "statically linked|not a dynamic executable"; then
  echo "build-static: $bin is dynamically linked" >&2
  exit 1
fi
mkdir -p "$out"
install -m 0755 -s "$bin" "$out/bcd"
sha256sum "$out/bcd"
