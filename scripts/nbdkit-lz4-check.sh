#!/usr/bin/env bash
# Checks scripts/nbdkit-lz4.c, the reference scripts/nbd-bench.sh measures `ztier serve`
# against: it builds without warnings, the bundled sample goes in and comes back out of it
# byte for byte through nbdcopy, and unaligned writes, zeroes, trims and reads of
# compressible, incompressible and zero data agree with a model of the disk's bytes (nbdsh).
#
# Usage: scripts/nbdkit-lz4-check.sh   (CI runs it)
# Needs: nbdkit, nbdkit-plugin-dev, liblz4-dev, libnbd-bin (nbdcopy), python3-libnbd (nbdsh),
# zstd, a C compiler.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

cc -O2 -Wall -Wextra -Wno-unused-parameter -Werror -shared -fPIC -o "$dir/nbdkit-lz4.so" \
  scripts/nbdkit-lz4.c -llz4

zstd -d -q samples/sample.pages.zst -o "$dir/in.raw"
nbdkit -U - "$dir/nbdkit-lz4.so" size="$(stat -c %s "$dir/in.raw")" \
  --run "nbdcopy '$dir/in.raw' \"\$uri\" && nbdcopy \"\$uri\" '$dir/out.raw'"
cmp "$dir/in.raw" "$dir/out.raw"
echo "nbdkit-lz4: the sample read back byte for byte"

cat >"$dir/model.py" <<'EOF'
import os
import random

rng = random.Random(26)
size = h.get_size()
disk = bytearray(size)


def data(n):
    kind = rng.randrange(3)
    if kind == 0:
        return os.urandom(n)
    if kind == 1:
        return bytes(n)
    pattern = os.urandom(rng.randrange(1, 24))
    return (pattern * (n // len(pattern) + 1))[:n]


for _ in range(400):
    n = rng.randrange(1, 20000)
    off = rng.randrange(0, size - n)
    op = rng.randrange(4)
    if op == 0:
        buf = data(n)
        h.pwrite(buf, off)
        disk[off:off + n] = buf
    elif op == 1:
        h.zero(n, off)
        disk[off:off + n] = bytes(n)
    elif op == 2:
        h.trim(n, off)
        disk[off:off + n] = bytes(n)
    else:
        assert h.pread(n, off) == disk[off:off + n], f"read of {n} at {off}"
assert h.pread(size, 0) == disk, "the whole disk"
print("nbdkit-lz4: 400 unaligned operations agree with the model")
EOF
# nbdsh runs the python3 on PATH, which must be the one Debian's python3-libnbd installed
# into (a pyenv or venv python found first has no nbd module).
PATH="/usr/bin:$PATH" nbdkit -U - "$dir/nbdkit-lz4.so" size=4M \
  --run "nbdsh -u \"\$uri\" -c 'exec(open(\"$dir/model.py\").read())'"
