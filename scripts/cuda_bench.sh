#!/usr/bin/env bash
# Builds lightseg against the CUDA LibTorch of a GPU machine (the one pip's torch ships) and
# benchmarks the fused backend on the GPU: fp32, bf16 and fp16, at 360x480 and 512x1024,
# batch 1 (CUDA graph replay) and batch 8. One run of a few minutes (build ~2-4 min on 16 cores).
#
#   scripts/cuda_bench.sh [build-folder]          # default: build-cuda
#
# Needs: python3 with a CUDA torch (`python3 -c 'import torch'`), cmake >= 3.25, a C++17
# compiler, the CUDA toolkit that torch's CMake package asks for, and the headers/libraries
# the core library needs (nlohmann-json, CLI11, libpng, libjpeg). OpenCV, ONNX, oneDNN, the
# HTTP server, tests and Google Benchmark are switched off. Prints one JSON line per run and
# a table at the end; everything also goes to <build-folder>/cuda_bench.jsonl.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-cuda}

py=${PYTHON:-python3}
if ! "$py" -c 'import torch' 2>/dev/null; then
  echo "cuda_bench: error: '$py' cannot import torch" >&2
  exit 1
fi
prefix=$("$py" -c 'import torch; print(torch.utils.cmake_prefix_path)')
abi=$("$py" -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))')
"$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' || {
  echo "cuda_bench: error: torch sees no CUDA GPU" >&2
  exit 1
}
"$py" -c 'import torch; print("cuda_bench: torch", torch.__version__, "CUDA", torch.version.cuda, "on", torch.cuda.get_device_name(0))' >&2

missing=()
for h in nlohmann/json.hpp CLI/CLI.hpp png.h jpeglib.h; do
  echo "#include <$h>" | ${CXX:-c++} -std=c++17 -x c++ -fsyntax-only - 2>/dev/null || missing+=("$h")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "cuda_bench: error: missing headers: ${missing[*]} (Debian: nlohmann-json3-dev libcli11-dev libpng-dev libjpeg-dev)" >&2
  exit 1
fi

gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
cmake -S . -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_CXX_FLAGS="-D_GLIBCXX_USE_CXX11_ABI=$abi" \
  -DLIGHTSEG_WITH_OPENCV=OFF -DLIGHTSEG_WITH_ONNX=OFF -DLIGHTSEG_WITH_SERVER=OFF -DLIGHTSEG_WITH_DNNL=OFF \
  -DLIGHTSEG_BUILD_TESTS=OFF -DLIGHTSEG_BUILD_BENCH=OFF -DLIGHTSEG_USE_CCACHE=OFF >"$BUILD.cmake.log" 2>&1 || {
  tail -30 "$BUILD.cmake.log" >&2
  exit 1
}
grep -q "define LIGHTSEG_HAVE_TORCH_CUDA 1" "$BUILD/generated/lightseg/features.h" ||
  echo "cuda_bench: warning: this LibTorch was not detected as a CUDA build (no CUDA graphs)" >&2
cmake --build "$BUILD" -j "$(nproc)" --target lightseg

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
