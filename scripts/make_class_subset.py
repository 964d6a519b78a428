#!/usr/bin/env python3
"""Derives a list dataset with fewer classes from a CamVid-layout folder: a worked own-data
example for fine-tuning (docs/guide/fine-tuning.md) and the data of its measurement.

    scripts/make_class_subset.py SRC DST --classes car=8 [--classes road=3,4] \
        [--val-groups 0006R0] [--split train,val]

SRC holds CamVid's list files (train.txt, val.txt: "image label" relative to SRC, as
../shared/data/camvid or scripts/pack_carry.sh's .carry/camvid). DST gets dataset.json
({"classes": ["background", NAME...], "ignore_index": 255}), the remapped label PNGs and
train.txt / val.txt whose image paths point into SRC (relative to DST). A label value named
in --classes becomes that class; CamVid's void (11) becomes the ignore id; every other value
background. With --val-groups the frames of those drives (the file-name prefix up to '_')
are val.txt and the rest train.txt (sequence-disjoint); without, SRC's own splits.
Needs Pillow (Debian: python3-pil).
"""
import argparse
import json
import os
import sys

try:
    from PIL import Image
except ImportError:
    sys.exit("make_class_subset: error: needs Pillow (apt-get install python3-pil)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--classes", action="append", required=True, help="NAME=V[,V...] (CamVid label values)")
    ap.add_argument("--void", type=int, default=11, help="the source's ignored value (CamVid: 11)")
    ap.add_argument("--split", default="train,val", help="the source's splits to read")
    ap.add_argument("--val-groups", default="", help="drives held out as val (e.g. 0006R0)")
    a = ap.parse_args()

    names, table = ["background"], [0] * 256
    for spec in a.classes:
        name, _, values = spec.partition("=")
        if not name or not values:
            sys.exit(f"make_class_subset: error: --classes wants NAME=V[,V...], got '{spec}'")
        names.append(name)
        for v in values.split(","):
            if not v.isdigit() or int(v) > 255:
                sys.exit(f"make_class_subset: error: label value '{v}' in '{spec}' is not 0..255")
            table[int(v)] = len(names) - 1
    table[a.void] = 255

    pairs = []
    for split in a.split.split(","):
        lst = os.path.join(a.src, split + ".txt")
        if not os.path.exists(lst):
            sys.exit(f"make_class_subset: error: no {lst}")
        for line in open(lst):
            if line.strip():
                img, lab = line.split()
                pairs.append((split, img, lab))
    held = set(g for g in a.val_groups.split(",") if g)
    os.makedirs(os.path.join(a.dst, "labels"), exist_ok=True)
    rel = os.path.relpath(os.path.abspath(a.src), os.path.abspath(a.dst))
    out = {"train": [], "val": []}
    for split, img, lab in pairs:
        stem = os.path.splitext(os.path.basename(lab))[0]
        mapped = Image.open(os.path.join(a.src, lab)).point(table)
        mapped.save(os.path.join(a.dst, "labels", stem + ".png"))
        side = ("val" if stem.split("_")[0] in held else "train") if held else ("val" if split == "val" else "train")
        out[side].append(f"{os.path.join(rel, img)} labels/{stem}.png\n")
    if held and not out["val"]:
        sys.exit(f"make_class_subset: error: no frame of {sorted(held)} in {a.src}")
    for side, lines in out.items():
        open(os.path.join(a.dst, side + ".txt"), "w").writelines(lines)
    palette = [[0, 0, 0]] + [[[255, 0, 0], [0, 160, 255], [255, 200, 0], [0, 200, 80]][i % 4] for i in range(len(names) - 1)]
    json.dump({"name": os.path.basename(os.path.abspath(a.dst)), "classes": names, "palette": palette, "ignore_index": 255},
              open(os.path.join(a.dst, "dataset.json"), "w"))
    print(f"make_class_subset: {a.dst}: classes {names}; train {len(out['train'])}, val {len(out['val'])} images",
          file=sys.stderr)


if __name__ == "__main__":
    main()
