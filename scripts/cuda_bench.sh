#!/usr/bin/env bash
# Builds lightseg against the CUDA LibTorch of a GPU machine (the one pip's torch ships) and
# benchmarks the fused backend on the GPU: fp32, bf16 and fp16, at 360x480 and 512x1024,
# batch 1 (CUDA graph replay) and batch 8. One run of a few minutes (build ~2-4 min on 16 cores).
#
#   scripts/cuda_bench.sh [build-folder]          # default: build-cuda
#
# The build is scripts/cuda_build.sh's (what it needs is said there). Prints one JSON line per run and
# a table at the end; everything also goes to <build-folder>/cuda_bench.jsonl.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-cuda}

"${PYTHON:-python3}" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' || {
  echo "cuda_bench: error: torch sees no CUDA GPU" >&2
  exit 1
}
scripts/cuda_build.sh "$BUILD" >/dev/null
py=${PYTHON:-python3}
bin="$BUILD/bin/lightseg"
out="$BUILD/cuda_bench.jsonl"
: >"$out"
for precision in fp32 bf16 fp16; do
  for size in 360x480 512x1024; do
    for batch in 1 8; do
      echo "cuda_bench: $precision $size batch $batch" >&2
      "$bin" bench --device cuda --precision "$precision" --size "$size" --batch "$batch" --iters 200 --json |
        tail -n 1 | tee -a "$out"
    done
  done
done

"$py" - "$out" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print(f"\n{'precision':9} {'size':>9} {'batch':>5} {'p50 ms':>8} {'p99 ms':>8} {'images/s':>9} {'GMAC/s':>8} {'of peak':>7}")
for r in rows:
    print(f"{r['precision']:9} {r['size'][0]:>4}x{r['size'][1]:<4} {r['batch']:>5} {r['p50_ms']:8.3f} {r['p99_ms']:8.3f} "
          f"{r['images_per_s']:9.1f} {r['achieved_gmac_s']:8.0f} {100 * r['peak_fraction']:6.0f}%")
print(f"device: {rows[0]['device'] if rows else '?'}")
EOF
