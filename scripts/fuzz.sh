#!/usr/bin/env bash
# The fuzz targets of fuzz/ on the sanitized build (clang, libFuzzer, ASan + UBSan, leaks on):
# builds build-fuzz/ if needed, then runs each target for SECONDS from its seeds
# (fuzz/corpus/TARGET, read only) and the working corpus build-fuzz/corpus/TARGET (kept
# between runs). A crash, leak, undefined behaviour, broken invariant or time-out (10 s for
# one input) fails the run; the input is saved in build-fuzz/findings/TARGET/.
#   scripts/fuzz.sh 60                 # CI: each target 60 s
#   scripts/fuzz.sh 3600 image http    # an hour each, two targets
#   FUZZ_JOBS=2 scripts/fuzz.sh 3600   # two targets at a time (one core each)
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${1:-60}
shift || true
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(image weights config http)
JOBS=${FUZZ_JOBS:-1}
B=${FUZZ_BUILD:-build-fuzz}

command -v clang++ >/dev/null || { echo "fuzz: clang++ not found (scripts/setup.sh installs clang)" >&2; exit 1; }
t0=$SECONDS
mkdir -p "$B"
if [ ! -f "$B/build.ninja" ]; then
  CC=clang CXX=clang++ cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLIGHTSEG_BUILD_FUZZ=ON \
    -DLIGHTSEG_BUILD_TOOLS=OFF -DLIGHTSEG_BUILD_TESTS=OFF -DLIGHTSEG_BUILD_BENCH=OFF \
    -DLIGHTSEG_WITH_OPENCV=OFF -DLIGHTSEG_WITH_ONNX=OFF -DLIGHTSEG_WITH_DNNL=OFF >"$B/configure.log" 2>&1 ||
    { tail -30 "$B/configure.log" >&2; echo "fuzz: configuring $B failed" >&2; exit 1; }
fi
cmake --build "$B" -j "$(nproc)" >"$B/build.log" 2>&1 ||
  { grep -E -A5 'error|FAILED' "$B/build.log" | head -40 >&2; echo "fuzz: building $B failed (log: $B/build.log)" >&2; exit 1; }
echo "fuzz: sanitized build ready ($((SECONDS - t0)) s)" >&2

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
run_one() {
  local t=$1 corpus="$B/corpus/$1" findings="$B/findings/$1" log="$B/fuzz-$1.log"
  mkdir -p "$corpus" "$findings"
  local rc=0
  "$B/bin/fuzz_$t" -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=3072 -max_len=65536 \
    -print_final_stats=1 -artifact_prefix="$findings/" "$corpus" "fuzz/corpus/$t" >"$log" 2>&1 || rc=$?
  local execs cov
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  if [ "$rc" -eq 0 ]; then
    echo "fuzz: $t: ok, ${execs:-?} executions in ${SECONDS_EACH} s, coverage ${cov:-?} edges, corpus $(ls "$corpus" | wc -l) inputs"
  else
    echo "fuzz: $t: FAILED (exit $rc) after ${execs:-?} executions; input in $findings/, log $log"
    grep -E 'ERROR:|runtime error|invariant broken|SUMMARY' "$log" | head -5 | sed 's/^/fuzz:   /'
  fi
  return "$rc"
}

fail=0
pids=()
names=()
for t in "${TARGETS[@]}"; do
  [ -x "$B/bin/fuzz_$t" ] || { echo "fuzz: no target fuzz_$t" >&2; fail=1; continue; }
  run_one "$t" &
  pids+=($!)
  names+=("$t")
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do sleep 1; done
done
for p in "${pids[@]}"; do wait "$p" || fail=1; done
[ "$fail" -eq 0 ] && echo "fuzz: all ${#names[@]} targets clean" || echo "fuzz: findings (see above)"
exit "$fail"
