#!/usr/bin/env bash
# The CamVid trainval schedule on a GPU machine, in one call of the device tool: builds against
# the machine's CUDA LibTorch (scripts/cuda_build.sh), then trains, or resumes, the run in RUN
# until DEADLINE seconds after the start have passed, and copies what came of it to $OUT.
#
#   here:   scripts/pack_carry.sh                       # .carry/deps, .carry/camvid (once)
#   there:  scripts/cuda_train.sh                       # carry: [".carry"]
#
# The schedule is the config's (CONFIG, default configs/camvid-trainval.json: split, epochs,
# recipe, starting weights), fixed before the first epoch; a later call with the run folder
# carried back (.carry/gpu-run, from $OUT) resumes it exactly. Environment: CONFIG, DATA
# (.carry/camvid), RUN (.carry/gpu-run), DEADLINE (540 s), PRECISION (bf16), WORKERS (12),
# BUILD (build-cuda), DEVICE (cuda; cpu for a dry run here), MAX_ITERS (the config's), OUT (where the
# results go: last.lsw, log.jsonl, curve.svg, train.log, nvidia-smi.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$SECONDS
CONFIG=${CONFIG:-configs/camvid-trainval.json}
DATA=${DATA:-.carry/camvid}
RUN=${RUN:-.carry/gpu-run}
DEADLINE=${DEADLINE:-540}
DEVICE=${DEVICE:-cuda}
OUT=${OUT:-out/cuda-train}
mkdir -p "$OUT" "$RUN"
say() { echo "cuda_train: [$((SECONDS - t0)) s] $*" >&2; }
[ -f "$CONFIG" ] || { say "error: no config $CONFIG"; exit 1; }
[ -f "$DATA/train.txt" ] || { say "error: no CamVid copy in $DATA (scripts/pack_carry.sh, then carry .carry)"; exit 1; }
command -v nvidia-smi >/dev/null && nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1 || true

if [ -n "${LIGHTSEG_BIN:-}" ]; then
  bin=$LIGHTSEG_BIN
else
  bin=$(scripts/cuda_build.sh "${BUILD:-build-cuda}")
  cp "${BUILD:-build-cuda}/lightseg-build.log" "$OUT/build.log" 2>/dev/null || true
fi
[ -d .carry/deps/usr/lib/x86_64-linux-gnu ] &&
  export LD_LIBRARY_PATH="$PWD/.carry/deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
say "built: $bin"

left=$((DEADLINE - (SECONDS - t0) - 40))  # 40 s: the last checkpoint and the copies
[ "$left" -ge 60 ] || { say "error: only $left s left for training"; exit 1; }
resume=()
[ -f "$RUN/last.lsw" ] && resume=(--resume) && say "resuming the run in $RUN"
say "training for $left s: $CONFIG on $DATA ($DEVICE, ${PRECISION:-bf16})"
set +e
"$bin" train --data "$DATA" --dataset camvid --config "$CONFIG" --out "$RUN" --device "$DEVICE" \
  --precision "${PRECISION:-bf16}" --workers "${WORKERS:-12}" ${MAX_ITERS:+--max-iters "$MAX_ITERS"} \
  --time-limit "$(awk -v s="$left" 'BEGIN { printf "%.2f", s / 60 }')" "${resume[@]}" 2>&1 |
  tr '\r' '\n' | grep -v -E '^\s*$' >"$OUT/train.log"
rc=${PIPESTATUS[0]}
set -e
tail -n 5 "$OUT/train.log" >&2
for f in last.lsw log.jsonl curve.svg; do [ -f "$RUN/$f" ] && cp "$RUN/$f" "$OUT/"; done
[ -f "$RUN/log.jsonl" ] && say "epochs done: $(wc -l <"$RUN/log.jsonl"); last: $(tail -n 1 "$RUN/log.jsonl")"
say "exit $rc; copy $OUT/last.lsw and log.jsonl into $RUN here to resume in a later call"
exit "$rc"
