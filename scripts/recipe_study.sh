#!/usr/bin/env bash
# The CamVid recipe study on val (train split only): every arm of configs/recipe/ trained
# from scratch with the same seed, batch and schedule (EPOCHS, default 80), niced and
# resumable. Arms advance in turns of TURN minutes (default 30) so that all of them move
# forward within one session; the run folders live outside the repository.
#   scripts/recipe_study.sh MINUTES          # train for MINUTES in all, then write the table
#   scripts/recipe_study.sh 0                # only write docs/recipe-study.md from the logs
# ARMS="aux ema" limits a run to those arms and THREADS=N sets each trainer's threads, so
# that two runs over disjoint arms can share a machine (each arm's protocol is unchanged).
set -euo pipefail
cd "$(dirname "$0")/.."
MINUTES=${1:-170}
EPOCHS=${EPOCHS:-80}
TURN=${TURN:-30}
DATA=${CAMVID:-../shared/data/camvid}
ROOT=${STUDY_DIR:-../runs/study}
BIN=${LIGHTSEG_BIN:-build/bin/lightseg}
mkdir -p "$ROOT"
end=$((SECONDS + MINUTES * 60))
arms=(configs/recipe/*.json)
if [ -n "${ARMS:-}" ]; then arms=(); for a in $ARMS; do arms+=("configs/recipe/$a.json"); done; fi
while [ "$MINUTES" -gt 0 ] && [ $SECONDS -lt $end ]; do
  progressed=0
  for cfg in "${arms[@]}"; do
    arm=$(basename "$cfg" .json)
    out="$ROOT/$arm"
    done_epochs=$( [ -f "$out/log.jsonl" ] && wc -l <"$out/log.jsonl" || echo 0)
    [ "$done_epochs" -ge "$EPOCHS" ] && continue
    left=$(( (end - SECONDS) / 60 ))
    [ "$left" -lt 2 ] && break
    turn=$(( left < TURN ? left : TURN ))
    echo "recipe_study: $arm (epoch $done_epochs of $EPOCHS), $turn min" >&2
    nice -n "${NICE:-10}" "$BIN" train --data "$DATA" --dataset camvid --out "$out" --config "$cfg" \
      --epochs "$EPOCHS" --batch 8 --crop 360x480 --val-every 2 --seed 1 --precision "${PRECISION:-bf16}" \
      --time-limit "$turn" --resume ${THREADS:+--threads "$THREADS"}
    progressed=1
  done
  [ "$progressed" -eq 1 ] || break
done
python3 - "$ROOT" "$EPOCHS" <<'EOF'
import json, os, sys
root, epochs = sys.argv[1], int(sys.argv[2])
rows = []
for arm in sorted(os.listdir(root)):
    log = os.path.join(root, arm, "log.jsonl")
    if not os.path.exists(log):
        continue
    recs = [json.loads(l) for l in open(log) if l.strip()]
    val = {r["epoch"]: r["val_miou"] for r in recs if r.get("val_miou") is not None}
    rows.append((arm, recs, val))
common = min((max(v) for _, _, v in rows if v), default=None)  # the last epoch every arm has scored
lines = ["# CamVid recipe study (val, train split only)", "",
         f"Each arm: `configs/recipe/ARM.json`, {epochs} epochs planned, batch 8, 360×480 crops, seed 1, bf16 autocast,",
         "`scripts/recipe_study.sh`. Val mIoU at the same epoch for every arm (the last one all have scored),",
         "the best so far, and the median training images/s (2-core AMD EPYC, other work on the machine).", "",
         f"| arm | epochs | val mIoU @ {common} | best val mIoU (epoch) | images/s |", "|---|---|---|---|---|"]
for arm, recs, val in rows:
    at = val.get(common)
    best = max(val.items(), key=lambda kv: kv[1]) if val else None
    ips = sorted(r["images_per_s"] for r in recs)
    lines.append(f"| {arm} | {len(recs)} | {at:.4f} |" if at is not None else f"| {arm} | {len(recs)} | – |")
    lines[-1] += (f" {best[1]:.4f} ({best[0]}) |" if best else " – |") + (f" {ips[len(ips) // 2]:.2f} |" if ips else " – |")
unfinished = [arm for arm, recs, _ in rows if len(recs) < epochs]
if unfinished:
    lines += ["", f"**In progress**: {', '.join(unfinished)} not yet at {epochs} epochs (arms that have not started are"
              " not listed). No arm is chosen before every arm has finished the same schedule."]
os.makedirs("docs", exist_ok=True)
open("docs/recipe-study.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
