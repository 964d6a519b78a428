#!/usr/bin/env bash
# A CamVid recipe study on val (train split only): every arm of configs/recipe/ trained
# from scratch with the same seed, batch and schedule (EPOCHS, default 80), niced and
# resumable. Arms advance in turns of TURN minutes (default 30) so that all of them move
# forward within one session; the run folders live outside the repository.
#   scripts/recipe_study.sh MINUTES          # train for MINUTES in all, then write the table
#   scripts/recipe_study.sh 0                # only write the table from the arms' logs in models/checkpoints/
# STUDY=1 (default): the first study (docs/history/recipe-study.md), finished; every arm trained with
#   the bf16 dilated-depthwise gradient fault (docs/history/training.md).
# STUDY=2: its rerun with the trainer that has the fix (docs/history/recipe-study-2.md).
# ARMS="aux ema" limits a run to those arms and THREADS=N sets each trainer's threads, so
# that two runs over disjoint arms can share a machine (each arm's protocol is unchanged).
# The record: after each turn an arm's log.jsonl is copied to models/checkpoints/study[N]-ARM/
# (small; commit it) and the table is written from those copies. The resumable state, last.lsw,
# stays in the run folder (STUDY_DIR): to continue on another machine, copy the run folders
# there; never commit checkpoints (they stay in the history forever). An arm with no run folder
# starts from a last.lsw placed by hand in its models/checkpoints/ folder (untracked), if any.
# Arms in STOPPED (below) were stopped for the CPU budget before they finished: they train no
# further, are listed with the epochs they reached, and take no part in the choice.
set -euo pipefail
cd "$(dirname "$0")/.."
MINUTES=${1:-170}
EPOCHS=${EPOCHS:-80}
TURN=${TURN:-30}
STUDY=${STUDY:-1}
DATA=${CAMVID:-../shared/data/camvid}
BIN=${LIGHTSEG_BIN:-build/bin/lightseg}
case "$STUDY" in
  1) ROOT=${STUDY_DIR:-../runs/study}; KEEP=models/checkpoints/study-; DOC=docs/history/recipe-study.md
     # Stopped in the eleventh session at 31 epochs, for the CPU budget: finishing it (49 arm-epochs,
     # about 2.5 CPU-hours) would have held back the trainval run by most of a session, and both of
     # its parts (ohem, aux) had finished below the baseline.
     STOPPED="ohem-aux"; DEFAULT_ARMS="" ;;
  2) ROOT=${STUDY_DIR:-../runs/study2}; KEEP=models/checkpoints/study2-; DOC=docs/history/recipe-study-2.md
     # the first study's finished arms; ohem-aux, stopped there, is not rerun
     STOPPED=""; DEFAULT_ARMS="baseline aux ema ohem strong-aug" ;;
  *) echo "recipe_study: STUDY must be 1 or 2, not '$STUDY'" >&2; exit 2 ;;
esac
if [ "$STUDY" = 1 ] && [ "${LIGHTSEG_PHASED_DEPTHWISE:-}" != 0 ] && [ "$MINUTES" -gt 0 ]; then
  echo "recipe_study: study 1 is finished, and its arms ran without the fix (LIGHTSEG_PHASED_DEPTHWISE=0);" \
       "train the rerun with STUDY=2" >&2
  exit 2
fi
mkdir -p "$ROOT"
end=$((SECONDS + MINUTES * 60))
arms=(configs/recipe/*.json)
ARMS=${ARMS:-$DEFAULT_ARMS}
if [ -n "$ARMS" ]; then arms=(); for a in $ARMS; do arms+=("configs/recipe/$a.json"); done; fi
while [ "$MINUTES" -gt 0 ] && [ $SECONDS -lt $end ]; do
  progressed=0
  for cfg in "${arms[@]}"; do
    [ -f "$cfg" ] || { echo "recipe_study: no arm $cfg" >&2; exit 2; }
    arm=$(basename "$cfg" .json)
    case " $STOPPED " in *" $arm "*) continue ;; esac
    out="$ROOT/$arm" keep="$KEEP$arm"
    # finished on another machine: only its log is kept (its last state is not)
    if [ ! -f "$out/log.jsonl" ] && [ -f "$keep/log.jsonl" ] && [ "$(wc -l <"$keep/log.jsonl")" -ge "$EPOCHS" ]; then
      continue
    fi
    if [ ! -f "$out/last.lsw" ] && [ -f "$keep/last.lsw" ]; then  # a new machine: a state placed by hand
      mkdir -p "$out" && cp "$keep/last.lsw" "$out/"
      [ -f "$keep/log.jsonl" ] && cp "$keep/log.jsonl" "$out/"
      echo "recipe_study: $arm resumes from $keep/last.lsw" >&2
    fi
    done_epochs=$( [ -f "$out/log.jsonl" ] && wc -l <"$out/log.jsonl" || echo 0)
    [ "$done_epochs" -ge "$EPOCHS" ] && continue
    left=$(( (end - SECONDS) / 60 ))
    [ "$left" -lt 2 ] && break
    turn=$(( left < TURN ? left : TURN ))
    echo "recipe_study: $arm (epoch $done_epochs of $EPOCHS), $turn min" >&2
    nice -n "${NICE:-10}" "$BIN" train --data "$DATA" --dataset camvid --out "$out" --config "$cfg" \
      --epochs "$EPOCHS" --batch 8 --crop 360x480 --val-every 2 --seed 1 --precision "${PRECISION:-auto}" \
      --time-limit "$turn" --resume ${THREADS:+--threads "$THREADS"}
    mkdir -p "$keep"
    [ -f "$out/log.jsonl" ] && cp "$out/log.jsonl" "$keep/log.jsonl"
    progressed=1
  done
  [ "$progressed" -eq 1 ] || break
done
python3 scripts/recipe_table.py --study "$STUDY" --logs "$KEEP" --epochs "$EPOCHS" --stopped "$STOPPED" \
  --arms "$DEFAULT_ARMS" --out "$DOC"
