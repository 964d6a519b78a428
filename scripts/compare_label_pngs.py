#!/usr/bin/env python3
"""Share of equal pixels between label-id PNGs (8-bit gray, as `lightseg segment --format ids`
writes them), with the standard library only (GPU machines may lack numpy and PIL).

  scripts/compare_label_pngs.py A.png B.png [--json]
Prints the share of pixels with the same label (and the counts); exits 1 when the sizes differ.
"""
import json
import struct
import sys
import zlib


def read_gray8(path):
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise SystemExit(f"error: {path} is not a PNG")
    pos, idat, w = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        pos += 12 + n
        if kind == b"IHDR":
            w, h, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
            if depth != 8 or colour != 0 or interlace != 0:
                raise SystemExit(f"error: {path}: not an 8-bit gray, non-interlaced PNG")
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
    raw = zlib.decompress(idat)
    rows, prev = [], bytearray(w)
    for y in range(h):
        f, line = raw[y * (w + 1)], bytearray(raw[y * (w + 1) + 1:(y + 1) * (w + 1)])
        for x in range(w):
            a = line[x - 1] if x else 0
            b, c = prev[x], prev[x - 1] if x else 0
            if f == 1:
                line[x] = (line[x] + a) & 255
            elif f == 2:
                line[x] = (line[x] + b) & 255
            elif f == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(line)
        prev = line
    return w, h, rows


def main():
    args = [a for a in sys.argv[1:] if a != "--json"]
    if len(args) != 2:
        raise SystemExit(__doc__)
    wa, ha, ra = read_gray8(args[0])
    wb, hb, rb = read_gray8(args[1])
    if (wa, ha) != (wb, hb):
        print(f"sizes differ: {wa}x{ha} and {wb}x{hb}")
        return 1
    same = sum(sum(1 for p, q in zip(x, y) if p == q) for x, y in zip(ra, rb))
    r = {"a": args[0], "b": args[1], "pixels": wa * ha, "equal": same, "share": same / (wa * ha)}
    print(json.dumps(r) if "--json" in sys.argv else f"{100 * r['share']:.3f} % of {r['pixels']} pixels equal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
