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
marks = [e for e in (20, 40, 60, epochs) if e <= epochs]
last3 = [epochs - 4, epochs - 2, epochs]  # the score that decides: the mean of the last three evaluations
def final(val):
    return sum(val[e] for e in last3) / 3 if all(e in val for e in last3) else None
lines = ["# CamVid recipe study (val, train split only)", "",
         f"Each arm: `configs/recipe/ARM.json`, {epochs} epochs, batch 8, 360×480 crops, seed 1, bf16 autocast, val every",
         "2 epochs, `scripts/recipe_study.sh` (2-core AMD EPYC, two arms at a time, one thread each). Val mIoU at the",
         f"same epochs for every arm; **final** = the mean of the evaluations at epochs {', '.join(map(str, last3))}. The rule, fixed",
         "before the arms finished: the arm with the highest final score is kept if it beats the baseline's by more",
         "than 0.005 (one evaluation varies by about ±0.02 from the next); otherwise the baseline recipe stays.",
         "images/s: the median over the arm's epochs, with the machine shared (a ratio between arms, not a speed).",
         "All arms ran one binary, built before the bf16 fault in the dilated depthwise weight gradients was found",
         "(docs/training.md): they compare recipes under the same faulty trainer; the trainval run trains with the fix.", "",
         "| arm | epochs | " + " | ".join(f"val @ {e}" for e in marks) + " | **final** | best (epoch) | images/s |",
         "|---|---|" + "---|" * len(marks) + "---|---|---|"]
for arm, recs, val in rows:
    best = max(val.items(), key=lambda kv: kv[1]) if val else None
    ips = sorted(r["images_per_s"] for r in recs)
    f = final(val)
    cells = [arm, str(len(recs))] + [f"{val[e]:.4f}" if e in val else "–" for e in marks]
    cells += [f"**{f:.4f}**" if f is not None else "–", f"{best[1]:.4f} ({best[0]})" if best else "–",
              f"{ips[len(ips) // 2]:.2f}" if ips else "–"]
    lines.append("| " + " | ".join(cells) + " |")
scores = {arm: final(val) for arm, _, val in rows}
if all(v is not None for v in scores.values()) and "baseline" in scores:
    win = max(scores, key=scores.get)
    if win != "baseline" and scores[win] > scores["baseline"] + 0.005:
        lines += ["", f"**Chosen: {win}** (final {scores[win]:.4f} against the baseline's {scores['baseline']:.4f})."]
    else:
        lines += ["", f"**Chosen: baseline** (no arm beats its final {scores['baseline']:.4f} by more than 0.005)."]
unfinished = [arm for arm, recs, _ in rows if len(recs) < epochs]
if unfinished:
    lines += ["", f"**In progress**: {', '.join(unfinished)} not yet at {epochs} epochs (arms that have not started are"
              " not listed). No arm is chosen before every arm has finished the same schedule."]
os.makedirs("docs", exist_ok=True)
open("docs/recipe-study.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
