#!/usr/bin/env bash
# Prepares, on this (Debian) machine, what a GPU machine without our packages or data needs,
# in the git-ignored folder .carry/ (the device tool's `carry`: 64 MiB in all):
#   .carry/deps    the files of the Debian packages the core library and the CLI build against
#                  (headers of nlohmann-json and CLI11; libpng, libjpeg-turbo, zlib with headers;
#                  GoogleTest's static libraries and CMake package, for the Cuda.* tests),
#                  for scripts/cuda_build.sh;
#   .carry/camvid  CamVid train + val: images re-encoded as JPEG quality 95, labels as they are
#                  (PNG), list files train.txt / val.txt; for scripts/cuda_train.sh.
#
#   scripts/pack_carry.sh [CAMVID]        # default ../shared/data/camvid
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=${1:-../shared/data/camvid}
OUT=.carry

rm -rf "$OUT/deps"
mkdir -p "$OUT/deps"
for pkg in nlohmann-json3-dev libcli11-dev libpng-dev libpng16-16 libjpeg62-turbo-dev libjpeg62-turbo zlib1g-dev zlib1g libgtest-dev; do
  dpkg -L "$pkg" >/dev/null 2>&1 || { echo "pack_carry: error: package $pkg is not installed (scripts/setup.sh)" >&2; exit 1; }
  dpkg -L "$pkg" | grep -v -E '^/usr/share/(doc|man|lintian)' | while read -r f; do
    [ -f "$f" ] || [ -L "$f" ] || continue
    d="$OUT/deps/usr${f#/usr}"  # merged /usr: /lib/x86_64-linux-gnu/... goes to usr/lib/...
    mkdir -p "$(dirname "$d")"
    cp -a "$f" "$d"
  done
done
find "$OUT/deps" -name '*.a' ! -name 'libgtest*.a' -delete  # shared libraries only (and GoogleTest's, for the Cuda.* tests)

rm -rf "$OUT/camvid"
/usr/bin/python3 - "$SRC" "$OUT/camvid" <<'EOF'
import os, shutil, sys
src, dst = sys.argv[1], sys.argv[2]
try:
    import cv2
    def to_jpeg(a, b):
        img = cv2.imread(a, cv2.IMREAD_COLOR)
        if img is None:
            raise SystemExit(f"pack_carry: error: cannot read {a}")
        cv2.imwrite(b, img, [cv2.IMWRITE_JPEG_QUALITY, 95])
except ImportError:
    from PIL import Image
    def to_jpeg(a, b):
        Image.open(a).convert("RGB").save(b, quality=95)
for split in ("train", "val"):
    lst = os.path.join(src, split + ".txt")
    if not os.path.exists(lst):
        raise SystemExit(f"pack_carry: error: no {lst}")
    out = []
    for line in open(lst):
        if not line.strip():
            continue
        img, lab = line.split()
        jpg = os.path.splitext(img)[0] + ".jpg"
        for rel in (jpg, lab):
            os.makedirs(os.path.dirname(os.path.join(dst, rel)), exist_ok=True)
        to_jpeg(os.path.join(src, img), os.path.join(dst, jpg))
        shutil.copyfile(os.path.join(src, lab), os.path.join(dst, lab))
        out.append(f"{jpg} {lab}\n")
    open(os.path.join(dst, split + ".txt"), "w").writelines(out)
    print(f"pack_carry: {split}: {len(out)} images", file=sys.stderr)
EOF
du -sh "$OUT/deps" "$OUT/camvid" >&2
# What travels to the device machine: the tracked files, the untracked ones git does not
# ignore, and the carried paths, 64 MiB in all.
tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 -r du -cb 2>/dev/null | tail -1 | cut -f1)
carry=$(du -sb "$OUT" | cut -f1)
total=$(( (tree + carry) / 1048576 ))
echo "pack_carry: working tree $((tree / 1048576)) MiB + .carry $((carry / 1048576)) MiB = $total MiB (limit 64)" >&2
[ "$total" -lt 64 ] || echo "pack_carry: warning: over the limit; the tree should hold only the shipped weights: training state (resumable checkpoints) belongs in run folders outside the repository, never in the tree" >&2
