#!/usr/bin/env python3
"""Writes a training checkpoint (.lsw with the optimizer state) as inference weights: the same
tensors, configuration, metadata and training record, without the blobs (the optimizer's
state, ~2/3 of a checkpoint), as the trainer writes best.lsw.

    scripts/strip_checkpoint.py ../runs/camvid/last.lsw models/camvid-train.lsw
Standard library only; the output is written to a temporary file and renamed.
"""
import json
import os
import struct
import sys

MAGIC = b"LSEGWTS1"


def main(src, dst):
    with open(src, "rb") as f:
        data = f.read()
    if data[:8] != MAGIC:
        sys.exit(f"error: {src} is not a lightseg weights file")
    (n,) = struct.unpack("<Q", data[8:16])
    h = json.loads(data[16:16 + n])
    base = 16 + n
    tensors = bytearray()
    for t in h["tensors"]:  # copied in order, each at its new offset
        off, size = t["offset"], t["bytes"]
        if off + size > len(data) - base:
            sys.exit(f"error: {src}: tensor {t['name']} lies past the end of the file")
        t["offset"] = len(tensors)
        tensors += data[base + off:base + off + size]
    dropped = [b["name"] for b in h.get("blobs", [])]
    h["blobs"] = []
    header = json.dumps(h, separators=(",", ":")).encode()
    tmp = f"{dst}.tmp.{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(MAGIC + struct.pack("<Q", len(header)) + header + bytes(tensors))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, dst)
    print(f"wrote {dst}: {len(h['tensors'])} tensors, {os.path.getsize(dst)} bytes "
          f"(dropped blobs: {', '.join(dropped) or 'none'})")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
