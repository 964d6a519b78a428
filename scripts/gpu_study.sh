#!/usr/bin/env bash
# Recipe study 3 (issue 36) inside one call of a GPU machine, sized to the time it has:
#   1. probe: every arm of configs/study3 starts at once for PROBE seconds (throw-away run
#      folders); the sum of their images/s is the card's throughput with all arms on it;
#   2. study: the epochs per arm (EPOCHS, the `long` arm twice that) are the most that the
#      measured throughput fits into what is left before DEADLINE, the same for every arm (equal
#      budget), at least MIN_EPOCHS and at most 300, a multiple of 10 (val every tenth);
#      scripts/recipe_study3.sh runs them all at once;
#   3. fine-tuning (issue 41): the aux arm's weights fine-tuned to a two-class data set
#      (.carry/camvid-cars, scripts/make_class_subset.py: car vs the rest, 0006R0 held out)
#      against training it from scratch, the same epochs, both at once;
#   4. results packed into at most 4 files of $OUT (the device tool returns 8 files, 16 MiB each).
#
#   scripts/gpu_study.sh                      # on the GPU machine, after scripts/cuda_build.sh
#   DEVICE=cpu EXTRA="--crop 64x64 --max-iters 2" DEADLINE=240 PROBE=20 scripts/gpu_study.sh   # dry run here
#
# Environment: BIN (build-cuda/bin/lightseg), DATA (.carry/camvid), CARS (.carry/camvid-cars),
# RUNS (/tmp/study3), DEVICE (cuda), DEADLINE (seconds from now for everything, 300), PROBE (35),
# MIN_EPOCHS (20), FT_SECONDS (45), OUT (out/gpu-study), EXTRA (train flags for dry runs only).
set -uo pipefail
cd "$(dirname "$0")/.."
t0=$SECONDS
BIN=${BIN:-build-cuda/bin/lightseg}
DATA=${DATA:-.carry/camvid}
CARS=${CARS:-.carry/camvid-cars}
RUNS=${RUNS:-/tmp/study3}
DEVICE=${DEVICE:-cuda}
DEADLINE=${DEADLINE:-300}
PROBE=${PROBE:-35}
MIN_EPOCHS=${MIN_EPOCHS:-20}
FT_SECONDS=${FT_SECONDS:-45}
OUT=${OUT:-out/gpu-study}
ARMS=${ARMS:-$(for f in configs/study3/*.json; do basename "$f" .json; done | tr '\n' ' ')}
mkdir -p "$OUT" "$RUNS"
say() { echo "gpu_study: [$((SECONDS - t0)) s] $*" | tee -a "$OUT/gpu_study.log" >&2; }
left() { echo $((DEADLINE - (SECONDS - t0))); }
[ -x "$BIN" ] || { say "error: no binary $BIN"; exit 2; }
[ -f "$DATA/train.txt" ] || { say "error: no CamVid copy in $DATA"; exit 2; }
n_arms=$(wc -w <<<"$ARMS")
cores=$(nproc)
workers=$(( cores / n_arms > 1 ? cores / n_arms : 1 ))

# 1. probe -------------------------------------------------------------------------------
probe=$RUNS/probe
rm -rf "$probe" && mkdir -p "$probe"
say "probe: $n_arms arms at once for $PROBE s on $DEVICE ($workers loader threads each)"
for arm in $ARMS; do
  timeout -k 5 $((PROBE + 60)) "$BIN" train --data "$DATA" --dataset camvid --config "configs/study3/$arm.json" \
    --out "$probe/$arm" --device "$DEVICE" --precision auto --workers "$workers" --threads 1 --epochs 1000 \
    --val-every 0 --time-limit "$(awk -v s="$PROBE" 'BEGIN { printf "%.3f", s / 60 }')" ${EXTRA:-} \
    >"$probe/$arm.log" 2>&1 &
done
wait
agg=0
for arm in $ARMS; do
  ips=$(tr '\r' '\n' <"$probe/$arm.log" | grep -o '[0-9.]* img/s' | tail -n 1 | cut -d' ' -f1)
  say "probe: $arm ${ips:-?} images/s"
  agg=$(awk -v a="$agg" -v b="${ips:-0}" 'BEGIN { print a + b }')
done
say "probe: $agg images/s with all arms at once"

# 2. study -------------------------------------------------------------------------------
units=0  # arm-schedules in units of EPOCHS (long: 2)
for arm in $ARMS; do case "$arm" in long) units=$((units + 2)) ;; *) units=$((units + 1)) ;; esac; done
train_images=$(grep -v -c '/0006R0_' "$DATA/train.txt" "$DATA/val.txt" | awk -F: '{ s += $2 } END { print s }')
study_s=$(( $(left) - FT_SECONDS - 25 ))
# 0.8: validation, checkpoints, start-up and the slower tail when arms finish at different times
epochs=$(awk -v r="$agg" -v s="$study_s" -v n="$train_images" -v u="$units" 'BEGIN { e = int(0.8 * r * s / (n * u) / 10) * 10; print (e > 300 ? 300 : e) }')
[ "$epochs" -ge "$MIN_EPOCHS" ] || epochs=$MIN_EPOCHS
say "study: $epochs epochs per arm (long: $((2 * epochs))) of $train_images images, $study_s s left for it"
echo "{\"probe_images_per_s\": $agg, \"epochs\": $epochs, \"study_seconds\": $study_s, \"arms\": \"$ARMS\"}" >"$OUT/study_plan.json"
DEVICE=$DEVICE BIN=$BIN DATA=$DATA RUNS=$RUNS EPOCHS=$epochs VAL_EVERY=$((epochs / 10 > 0 ? epochs / 10 : 1)) \
  THREADS=1 WORKERS=$workers DOC="$OUT/recipe-study-3.md" ARMS="$ARMS" EXTRA="${EXTRA:-}" OUT= \
  timeout -k 10 $((study_s + 30)) scripts/recipe_study3.sh "$(awk -v s="$study_s" 'BEGIN { printf "%.3f", s / 60 }')" \
  2>&1 | tee -a "$OUT/gpu_study.log" >&2
say "study: exit ${PIPESTATUS[0]}"

# 3. fine-tuning against scratch (two classes, the same epochs, both at once) ---------------
if [ -f "$CARS/train.txt" ] && [ -f "$RUNS/aux/last.lsw" ] && [ "$(left)" -gt 30 ]; then
  ft_s=$(( $(left) - 20 ))
  ft_epochs=${FT_EPOCHS:-$(awk -v r="$agg" -v s="$ft_s" -v n="$train_images" -v k="$n_arms" 'BEGIN { e = int(0.6 * r * s / (n * 2)); print (e > 100 ? 100 : (e < 3 ? 3 : e)) }')}
  say "fine-tuning: $ft_epochs epochs on $CARS, from the aux arm and from scratch, $ft_s s"
  for kind in finetune scratch; do
    init=()
    [ "$kind" = finetune ] && init=(--init-weights "$RUNS/aux/last.lsw")
    rm -rf "$RUNS/cars-$kind"
    timeout -k 5 "$ft_s" "$BIN" train --data "$CARS" --dataset list --out "$RUNS/cars-$kind" --device "$DEVICE" \
      --precision auto --workers "$workers" --threads 1 --epochs "$ft_epochs" --val-every "$(( ft_epochs / 5 > 0 ? ft_epochs / 5 : 1 ))" \
      --aux-weight 0.4 --seed 1 "${init[@]}" --time-limit "$(awk -v s="$ft_s" 'BEGIN { printf "%.3f", (s - 10) / 60 }')" \
      ${EXTRA:-} >"$RUNS/cars-$kind.log" 2>&1 &
  done
  wait
  for kind in finetune scratch; do
    say "fine-tuning: $kind: $(tr '\r' '\n' <"$RUNS/cars-$kind.log" | grep -E 'initialised|val mIoU' | tail -n 2 | tr '\n' ' ')"
  done
else
  say "fine-tuning: skipped (no $CARS, no aux weights or no time)"
fi

# 4. pack ----------------------------------------------------------------------------------
(cd "$RUNS" && tar czf - --exclude='*.lsw' --exclude='probe/*/*.lsw' . ) >"$OUT/study3-logs.tgz"
weights=()
for d in "$RUNS"/*/; do
  n=$(basename "$d")
  [ "$n" = probe ] && continue
  [ -f "$d/last.lsw" ] && python3 scripts/strip_checkpoint.py "$d/last.lsw" "$RUNS/$n.weights.lsw" >/dev/null 2>&1 &&
    weights+=("$n.weights.lsw")
done
half=$(( (${#weights[@]} + 1) / 2 ))
[ ${#weights[@]} -gt 0 ] && (cd "$RUNS" && tar cf - "${weights[@]:0:$half}") >"$OUT/study3-weights-1.tar"
[ ${#weights[@]} -gt "$half" ] && (cd "$RUNS" && tar cf - "${weights[@]:$half}") >"$OUT/study3-weights-2.tar"
say "packed: $(cd "$OUT" && ls -la | awk 'NR > 1 { printf "%s %s; ", $9, $5 }')"
