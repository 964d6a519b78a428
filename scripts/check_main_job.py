#!/usr/bin/env python3
"""Checks what the README's first command wrote (standard library only).

    scripts/check_main_job.py [OUT_DIR] [--classes 11] [--size 480x360]

OUT_DIR/0016E5_07959.png must be an 8-bit gray PNG of the example's size whose every value
is a class id (< classes); ..._color.png and ..._overlay.png must be RGB PNGs of that size.
Exit 0 when all hold, 1 (with the reason) otherwise.
"""
import struct
import sys
import zlib
from pathlib import Path

STEM = "0016E5_07959"
CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}


def read_png(path):
    """(width, height, bit_depth, colour_type, rows as bytearrays) of a non-interlaced PNG."""
    data = path.read_bytes()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{path}: not a PNG")
    pos, ihdr, idat = 8, None, bytearray()
    while pos + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        crc = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])[0]
        if zlib.crc32(kind + body) != crc:
            raise ValueError(f"{path}: bad CRC in {kind.decode(errors='replace')} chunk")
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
        pos += 12 + length
    if ihdr is None:
        raise ValueError(f"{path}: no IHDR")
    width, height, depth, ctype, _, _, interlace = ihdr
    if interlace:
        raise ValueError(f"{path}: interlaced (not what lightseg writes)")
    bpp = max(1, CHANNELS[ctype] * depth // 8)
    stride = (width * CHANNELS[ctype] * depth + 7) // 8
    raw = zlib.decompress(bytes(idat))
    if len(raw) != height * (stride + 1):
        raise ValueError(f"{path}: {len(raw)} bytes of pixel data, expected {height * (stride + 1)}")
    rows, prev = [], bytearray(stride)
    for y in range(height):
        f = raw[y * (stride + 1)]
        row = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = row[i - bpp] if i >= bpp else 0
            b, c = prev[i], (prev[i - bpp] if i >= bpp else 0)
            if f == 1:
                row[i] = (row[i] + a) & 255
            elif f == 2:
                row[i] = (row[i] + b) & 255
            elif f == 3:
                row[i] = (row[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                row[i] = (row[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
            elif f != 0:
                raise ValueError(f"{path}: unknown filter {f} in row {y}")
        rows.append(row)
        prev = row
    return width, height, depth, ctype, rows


def main(argv):
    out, classes, size = Path("out"), 11, (480, 360)
    args = list(argv)
    while args:
        a = args.pop(0)
        if a == "--classes":
            classes = int(args.pop(0))
        elif a == "--size":
            w, h = args.pop(0).split("x")
            size = (int(w), int(h))
        else:
            out = Path(a)
    problems = []
    try:
        w, h, depth, ctype, rows = read_png(out / f"{STEM}.png")
        if (w, h) != size:
            problems.append(f"ids PNG is {w}x{h}, expected {size[0]}x{size[1]}")
        if (depth, ctype) != (8, 0):
            problems.append(f"ids PNG has bit depth {depth}, colour type {ctype}; expected 8-bit gray")
        values = set()
        for row in rows:
            values.update(row)
        if max(values) >= classes:
            problems.append(f"ids PNG holds value {max(values)}, not a class id (< {classes})")
        if len(values) < 2:
            problems.append(f"ids PNG holds one label only ({sorted(values)}): no segmentation")
        ids_summary = f"{w}x{h}, 8-bit, {len(values)} distinct labels, max {max(values)}"
    except (OSError, ValueError, KeyError, zlib.error) as e:
        problems.append(str(e))
        ids_summary = "unreadable"
    for suffix in ("_color", "_overlay"):
        p = out / f"{STEM}{suffix}.png"
        try:
            w, h, depth, ctype, _ = read_png(p)
            if (w, h, depth, ctype) != (size[0], size[1], 8, 2):
                problems.append(f"{p}: {w}x{h}, depth {depth}, colour type {ctype}; expected {size[0]}x{size[1]} 8-bit RGB")
        except (OSError, ValueError, KeyError, zlib.error) as e:
            problems.append(str(e))
    if problems:
        for p in problems:
            print(f"check_main_job: FAIL: {p}", file=sys.stderr)
        return 1
    print(f"check_main_job: ok: {out}/{STEM}.png {ids_summary}; _color and _overlay RGB {size[0]}x{size[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
