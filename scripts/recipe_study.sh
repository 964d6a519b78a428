#!/usr/bin/env bash
# The CamVid recipe study on val (train split only): every arm of configs/recipe/ trained
# from scratch with the same seed, batch and schedule (EPOCHS, default 80), niced and
# resumable. Arms advance in turns of TURN minutes (default 30) so that all of them move
# forward within one session; the run folders live outside the repository.
#   scripts/recipe_study.sh MINUTES          # train for MINUTES in all, then write the table
#   scripts/recipe_study.sh 0                # only write docs/recipe-study.md from the logs
# ARMS="aux ema" limits a run to those arms and THREADS=N sets each trainer's threads, so
# that two runs over disjoint arms can share a machine (each arm's protocol is unchanged).
# Arms in STOPPED (below) were stopped for the CPU budget before they finished: they train no
# further, are listed with the epochs they reached, and take no part in the choice.
set -euo pipefail
cd "$(dirname "$0")/.."
MINUTES=${1:-170}
EPOCHS=${EPOCHS:-80}
TURN=${TURN:-30}
DATA=${CAMVID:-../shared/data/camvid}
ROOT=${STUDY_DIR:-../runs/study}
BIN=${LIGHTSEG_BIN:-build/bin/lightseg}
# Stopped in the eleventh session at 31 epochs, for the CPU budget: finishing it (49 arm-epochs,
# about 2.5 CPU-hours) would have held back the trainval run by most of a session, and both of
# its parts (ohem, aux) had finished below the baseline.
STOPPED="ohem-aux"
mkdir -p "$ROOT"
end=$((SECONDS + MINUTES * 60))
arms=(configs/recipe/*.json)
if [ -n "${ARMS:-}" ]; then arms=(); for a in $ARMS; do arms+=("configs/recipe/$a.json"); done; fi
while [ "$MINUTES" -gt 0 ] && [ $SECONDS -lt $end ]; do
  progressed=0
  for cfg in "${arms[@]}"; do
    arm=$(basename "$cfg" .json)
    case " $STOPPED " in *" $arm "*) continue ;; esac
    out="$ROOT/$arm"
    done_epochs=$( [ -f "$out/log.jsonl" ] && wc -l <"$out/log.jsonl" || echo 0)
    [ "$done_epochs" -ge "$EPOCHS" ] && continue
    left=$(( (end - SECONDS) / 60 ))
    [ "$left" -lt 2 ] && break
    turn=$(( left < TURN ? left : TURN ))
    echo "recipe_study: $arm (epoch $done_epochs of $EPOCHS), $turn min" >&2
    nice -n "${NICE:-10}" "$BIN" train --data "$DATA" --dataset camvid --out "$out" --config "$cfg" \
      --epochs "$EPOCHS" --batch 8 --crop 360x480 --val-every 2 --seed 1 --precision "${PRECISION:-auto}" \
      --time-limit "$turn" --resume ${THREADS:+--threads "$THREADS"}
    progressed=1
  done
  [ "$progressed" -eq 1 ] || break
done
python3 - "$ROOT" "$EPOCHS" "$STOPPED" <<'EOF'
import json, os, sys
root, epochs, stopped = sys.argv[1], int(sys.argv[2]), set(sys.argv[3].split())
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
         "images/s: the median over the arm's epochs, with the machine shared (a ratio between arms, not a speed;",
         "strong-aug's epochs 27–80 ran alone on two threads, so its figure is not comparable).",
         "All arms ran one trainer, the one from before the bf16 fault in the dilated depthwise weight gradients was",
         "found (docs/training.md): until the tenth session the binary built then, from the eleventh the current one with",
         "the fix switched off (`LIGHTSEG_PHASED_DEPTHWISE=0`, the same convolution code, and torch's cross-entropy).",
         "They compare recipes under the same faulty trainer; the trainval run trains with the fix.", ""]
if stopped:
    lines += [f"Stopped before {epochs} epochs, for the CPU budget: {', '.join(sorted(stopped))}. Finishing it (49 arm-epochs,",
              "about 2.5 CPU-hours on this machine) would have held back the trainval run by most of a session, and both",
              "of its parts (ohem, aux) had finished below the baseline, so it was the arm least likely to be chosen.",
              "It is listed with the epochs it reached and takes no part in the choice.", ""]
lines += [
         "| arm | epochs | " + " | ".join(f"val @ {e}" for e in marks) + " | **final** | best (epoch) | images/s |",
         "|---|---|" + "---|" * len(marks) + "---|---|---|"]
for arm, recs, val in rows:
    best = max(val.items(), key=lambda kv: kv[1]) if val else None
    ips = sorted(r["images_per_s"] for r in recs)
    f = final(val)
    cells = [arm + (" (stopped)" if arm in stopped else ""), str(len(recs))] + [f"{val[e]:.4f}" if e in val else "–" for e in marks]
    cells += [f"**{f:.4f}**" if f is not None else "–", f"{best[1]:.4f} ({best[0]})" if best else "–",
              f"{ips[len(ips) // 2]:.2f}" if ips else "–"]
    lines.append("| " + " | ".join(cells) + " |")
scores = {arm: final(val) for arm, _, val in rows if arm not in stopped}
if all(v is not None for v in scores.values()) and "baseline" in scores:
    win = max(scores, key=scores.get)
    if win != "baseline" and scores[win] > scores["baseline"] + 0.005:
        lines += ["", f"**Chosen: {win}** (final {scores[win]:.4f} against the baseline's {scores['baseline']:.4f})."]
    else:
        lines += ["", f"**Chosen: baseline** (no arm beats its final {scores['baseline']:.4f} by more than 0.005)."]
finished = {arm for arm, recs, _ in rows if len(recs) >= epochs}
if {"baseline", "aux", "ema", "ohem", "strong-aug"} <= finished:
    lines += ["", "## Reading (eleventh session, when the five arms had finished)", "",
              "- No option beat the default recipe at 80 epochs: the trainval run keeps it (`configs/camvid-trainval.json`).",
              "  The finals lie within 0.013 of each other (strong-aug apart, within 0.003), under the ±0.02 that one",
              "  evaluation varies by from the next, so the study says none of these options is worth its cost here,",
              "  not that any of them hurts.",
              "- ema leads early (0.640 at epoch 20 against 0.614) and is the smoothest curve, but ends level: with the",
              "  poly schedule decaying to 0, the raw weights settle by themselves.",
              "- aux has the best single evaluation (0.7098 at epoch 64) but not the best end, and costs about a third",
              "  more time per step.",
              "- strong-aug (scale 0.5–2.0, colour jitter 0.3) is second at epoch 20 (0.629, after ema) and trails by 0.013 at the end. Whether",
              "  it pays over a longer schedule is not tested here.",
              "- Every arm trained with the bf16 fault (the dilated depthwise weights moved at random): differences",
              "  between recipes may be masked by it. A rerun of the arms with the fix is the follow-up if the",
              "  trainval weights fall short of the goal."]
unfinished = [arm for arm, recs, _ in rows if len(recs) < epochs and arm not in stopped]
if unfinished:
    lines += ["", f"**In progress**: {', '.join(unfinished)} not yet at {epochs} epochs (arms that have not started are"
              " not listed). No arm is chosen before every arm that was not stopped has finished the same schedule."]
os.makedirs("docs", exist_ok=True)
open("docs/recipe-study.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
