#!/usr/bin/env bash
# Recipe study 3 (issue 36): every arm of configs/study3/ on the seqval protocol (train on the
# 367 frames of drives 0001TP + 0016E5, i.e. the train and val splits pooled without 0006R0;
# validate on the 101 frames of 0006R0), from scratch, at equal budget: the same seed, batch,
# crop, poly schedule and epochs (EPOCHS; the `long` arm 2 x EPOCHS), val every VAL_EVERY.
# Resumable: a call trains every unfinished arm for at most MINUTES (--time-limit: a checkpoint
# is written when it stops), then writes the table (docs/recipe-study-3.md); call it again to
# go on. On a GPU every arm runs at once, one process each; on the CPU one after another.
#
#   DEVICE=cuda scripts/recipe_study3.sh 8      # GPU: all arms concurrently, 8 minutes each
#   scripts/recipe_study3.sh 120                # CPU: arms in turn (JOBS=1), 120 minutes each
#   scripts/recipe_study3.sh 0                  # only the table, from the run folders' logs
#
# Environment: DEVICE (cpu | cuda), RUNS (../runs/study3; on a device machine a carried folder
# such as .carry/study3), DATA (../shared/data/camvid), BIN (build/bin/lightseg; on a GPU
# machine $(scripts/cuda_build.sh)), EPOCHS (300), VAL_EVERY (2), ARMS (every config in
# configs/study3), JOBS (arms at once: all on cuda, 1 on cpu), THREADS (intra-op threads per
# arm: 1 on cuda, all cores on cpu), WORKERS (data-loading threads per arm: cores / JOBS on
# cuda, 2 on cpu), PRECISION (auto: bf16 on CUDA), NICE (10 on cpu), DOC (docs/recipe-study-3.md),
# OUT (if set: each run's log.jsonl and last.lsw are copied to $OUT/study3/RUN, and the table),
# EXTRA (more train flags for every arm, for smoke tests only: "--max-iters 1 --crop 64x64").
# FOLDS: the held-out drives, "0006R0" (seqval, run folders RUNS/ARM) by default;
# FOLDS="0001TP 0006R0 0016E5" adds the other two folds of leave-one-drive-out (run folders
# RUNS/ARM@DRIVE), and the table their mean.
set -uo pipefail
cd "$(dirname "$0")/.."
MINUTES=${1:-60}
DEVICE=${DEVICE:-cpu}
RUNS=${RUNS:-../runs/study3}
DATA=${DATA:-../shared/data/camvid}
BIN=${BIN:-build/bin/lightseg}
EPOCHS=${EPOCHS:-300}
VAL_EVERY=${VAL_EVERY:-2}
FOLDS=${FOLDS:-0006R0}
DOC=${DOC:-docs/recipe-study-3.md}
CORES=$(nproc)
ARMS=${ARMS:-$(for f in configs/study3/*.json; do basename "$f" .json; done | tr '\n' ' ')}
n_arms=$(wc -w <<<"$ARMS")
n_folds=$(wc -w <<<"$FOLDS")
if [ "$DEVICE" = cpu ]; then
  JOBS=${JOBS:-1}; WORKERS=${WORKERS:-2}; NICE=${NICE:-10}
else
  JOBS=${JOBS:-$((n_arms * n_folds))}; WORKERS=${WORKERS:-$(( CORES / JOBS > 1 ? CORES / JOBS : 1 ))}; NICE=${NICE:-0}
  THREADS=${THREADS:-1}
fi
say() { echo "recipe_study3: $*" >&2; }
epochs_of() { case "$1" in long) echo $((2 * EPOCHS)) ;; *) echo "$EPOCHS" ;; esac; }
run_dir() { if [ "$2" = 0006R0 ]; then echo "$RUNS/$1"; else echo "$RUNS/$1@$2"; fi; }
done_epochs() { [ -f "$1/log.jsonl" ] && wc -l <"$1/log.jsonl" || echo 0; }
# The distill arm learns from the wide arm of the same fold, once that has finished.
teacher_of() { [ "$1" = distill ] && echo "$(run_dir wide "$2")/last.lsw"; }

for arm in $ARMS; do
  [ -f "configs/study3/$arm.json" ] || { say "error: no arm configs/study3/$arm.json"; exit 2; }
done
failed=()
if [ "$MINUTES" != 0 ]; then
  mkdir -p "$RUNS"
  [ -x "$BIN" ] || { say "error: no binary $BIN (build it, or BIN=...)"; exit 2; }
  started=()
  for fold in $FOLDS; do
    for arm in $ARMS; do
      out=$(run_dir "$arm" "$fold") ep=$(epochs_of "$arm")
      [ "$(done_epochs "$out")" -ge "$ep" ] && continue
      teacher=$(teacher_of "$arm" "$fold")
      if [ -n "$teacher" ] && [ "$(done_epochs "$(run_dir wide "$fold")")" -lt "$(epochs_of wide)" ]; then
        say "$(basename "$out"): waits for its teacher $(basename "$(run_dir wide "$fold")") to finish"
        continue
      fi
      while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
      mkdir -p "$out" && rm -f "$out/exit-code"
      say "$(basename "$out"): epoch $(done_epochs "$out") of $ep, up to $MINUTES min on $DEVICE"
      (
        nice -n "$NICE" "$BIN" train --data "$DATA" --dataset camvid --out "$out" --config "configs/study3/$arm.json" \
          --val-groups "$fold" --epochs "$ep" --val-every "$VAL_EVERY" --seed 1 --device "$DEVICE" \
          --precision "${PRECISION:-auto}" --workers "$WORKERS" ${THREADS:+--threads "$THREADS"} \
          --time-limit "$MINUTES" --resume ${teacher:+--distill-from "$teacher"} ${EXTRA:-} 2>&1 | tr '\r' '\n' | grep -v -E '^\s*$' >>"$out/train.log"
        echo "${PIPESTATUS[0]}" >"$out/exit-code"
      ) &
      started+=("$out")
    done
  done
  wait
  for out in "${started[@]}"; do
    rc=$(cat "$out/exit-code" 2>/dev/null || echo "?")
    [ "$rc" = 0 ] || { failed+=("$out"); say "error: $out failed (exit $rc): $(tail -n 2 "$out/train.log")"; }
  done
fi

targets=""  # the table lists every arm of the study, trained in this call or not
for f in configs/study3/*.json; do arm=$(basename "$f" .json); targets+="$arm=$(epochs_of "$arm") "; done
python3 scripts/recipe_table3.py --runs "$RUNS" --targets "$targets" --folds "$FOLDS" --val-every "$VAL_EVERY" \
  --bin "$BIN" --out "$DOC" || failed+=("table")
if [ -n "${OUT:-}" ]; then
  for d in "$RUNS"/*/; do
    [ -f "$d/log.jsonl" ] || continue
    mkdir -p "$OUT/study3/$(basename "$d")"
    for f in log.jsonl last.lsw train.log; do [ -f "$d/$f" ] && cp "$d/$f" "$OUT/study3/$(basename "$d")/"; done
  done
  cp "$DOC" "$OUT/study3/" 2>/dev/null || true
fi
[ ${#failed[@]} -eq 0 ] || { say "failed: ${failed[*]}"; exit 1; }
