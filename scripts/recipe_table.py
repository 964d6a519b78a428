#!/usr/bin/env python3
"""Writes the table of a CamVid recipe study (val mIoU per arm at equal epochs, the final score,
the choice) from the arms' logs. Called by scripts/recipe_study.sh; standard library only.

  scripts/recipe_table.py --study N --logs DIR_PREFIX --epochs 80 --stopped "ohem-aux" --out docs/X.md
An arm's log is DIR_PREFIX + ARM + "/log.jsonl" (the committed copies in models/checkpoints/, so the
table can be rewritten on a machine that never had the run folders).
"""
import argparse, glob, json, os

# Study 1: every arm with the bf16 dilated-depthwise weight-gradient fault (docs/history/training.md).
INTRO_1 = [
    "2 epochs, `scripts/recipe_study.sh` (2-core AMD EPYC, two arms at a time, one thread each). Val mIoU at the",
    "same epochs for every arm; **final** = the mean of the evaluations at epochs {last3}. The rule, fixed",
    "before the arms finished: the arm with the highest final score is kept if it beats the baseline's by more",
    "than 0.005 (one evaluation varies by about ±0.02 from the next); otherwise the baseline recipe stays.",
    "images/s: the median over the arm's epochs, with the machine shared (a ratio between arms, not a speed;",
    "strong-aug's epochs 27–80 ran alone on two threads, so its figure is not comparable).",
    "All arms ran one trainer, the one from before the bf16 fault in the dilated depthwise weight gradients was",
    "found (docs/history/training.md): until the tenth session the binary built then, from the eleventh the current one with",
    "the fix switched off (`LIGHTSEG_PHASED_DEPTHWISE=0`, the same convolution code, and torch's cross-entropy).",
    "They compare recipes under the same faulty trainer; the trainval run trains with the fix.", ""]
STOPPED_1 = [
    "Stopped before {epochs} epochs, for the CPU budget: {stopped}. Finishing it (49 arm-epochs,",
    "about 2.5 CPU-hours on this machine) would have held back the trainval run by most of a session, and both",
    "of its parts (ohem, aux) had finished below the baseline, so it was the arm least likely to be chosen.",
    "It is listed with the epochs it reached and takes no part in the choice.", ""]
READING_1 = [
    "", "## Reading (eleventh session, when the five arms had finished)", "",
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
# Study 2: the same arms and rule with the trainer that has the fix (the first study's follow-up).
INTRO_2 = [
    "2 epochs, `STUDY=2 scripts/recipe_study.sh` (2-core AMD EPYC, arms in turns, resumable across sessions",
    "from the checkpoints committed in `models/checkpoints/study2-ARM/`). The rerun of the first study",
    "([recipe-study.md](recipe-study.md)) with the trainer that has the fix for the bf16 fault in the dilated",
    "depthwise weight gradients (docs/history/training.md): same arms, seed, schedule and rule. Val mIoU at the same",
    "epochs for every arm; **final** = the mean of the evaluations at epochs {last3}. The rule, fixed before",
    "any arm started: the arm with the highest final score is kept if it beats the baseline's by more than",
    "0.005; otherwise the baseline recipe stays. images/s: the median over the arm's epochs (a ratio between",
    "arms run under the same sharing, not a speed). From aux's epoch 65 and ema's epoch 3 on, the trainers run the",
    "fused BatchNorm→PReLU operator (docs/history/training.md: the same math up to float rounding, 11–30 % faster), so",
    "the images/s of ema, ohem and strong-aug are not comparable with baseline's and aux's.", ""]

READING_2 = [
    "", "## Reading (seventeenth session, when the five arms had finished)", "",
    "- aux is kept: final 0.7077 against the baseline's 0.6916 (+0.016, over the 0.005 the rule asks), and it",
    "  leads at 60 and 80 epochs. The trainval run of the shipped weights takes it: `configs/camvid-trainval-aux.json`",
    "  (`aux_weight` 0.4; 300 epochs on train + val from `models/camvid-train.lsw`, fixed before it starts).",
    "- ema (0.6985) and strong-aug (0.6950) also beat the baseline, by less; both lead early (0.640 and 0.649 at",
    "  epoch 20 against 0.626) and flatten towards the end. ohem (0.6821) ends below it.",
    "- With the fix the ranking changed from the first study, where no arm beat the baseline: aux went",
    "  from 0.6985 to 0.7077 while the baseline went from 0.7007 to 0.6916.",
    "- Combinations (aux with ema or strong-aug) are not tested here."]

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--study", type=int, default=1)
    ap.add_argument("--logs", required=True, help="prefix of the arms' folders, e.g. models/checkpoints/study-")
    ap.add_argument("--epochs", type=int, default=80)
    ap.add_argument("--stopped", default="")
    ap.add_argument("--arms", default="", help="every arm of the study (space-separated): one with no log yet blocks the choice")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    epochs, stopped = a.epochs, set(a.stopped.split())
    rows = []
    for log in sorted(glob.glob(glob.escape(a.logs) + "*/log.jsonl")):
        arm = os.path.basename(os.path.dirname(log))[len(os.path.basename(a.logs)):]
        recs = [json.loads(l) for l in open(log) if l.strip()]
        val = {r["epoch"]: r["val_miou"] for r in recs if r.get("val_miou") is not None}
        rows.append((arm, recs, val))
    rows.sort(key=lambda r: r[0])
    if not rows:
        raise SystemExit(f"recipe_table: no arm logs under {a.logs}*/log.jsonl; {a.out} left as it is")
    marks = [e for e in (20, 40, 60, epochs) if e <= epochs]
    last3 = [epochs - 4, epochs - 2, epochs]  # the score that decides: the mean of the last three evaluations

    def final(val):
        return sum(val[e] for e in last3) / 3 if all(e in val for e in last3) else None

    title = "# CamVid recipe study (val, train split only)" if a.study == 1 else \
        f"# CamVid recipe study {a.study} (val, train split only, the trainer with the fix)"
    fmt = dict(last3=", ".join(map(str, last3)), epochs=epochs, stopped=", ".join(sorted(stopped)))
    lines = [title, "",
             f"Each arm: `configs/recipe/ARM.json`, {epochs} epochs, batch 8, 360×480 crops, seed 1, bf16 autocast, val every"]
    lines += [l.format(**fmt) for l in (INTRO_1 if a.study == 1 else INTRO_2)]
    if stopped:
        lines += [l.format(**fmt) for l in STOPPED_1] if a.study == 1 else \
            [f"Stopped before {epochs} epochs, for the CPU budget: {fmt['stopped']}: listed with the epochs they reached,"
             " no part in the choice.", ""]
    lines += ["| arm | epochs | " + " | ".join(f"val @ {e}" for e in marks) + " | **final** | best (epoch) | images/s |",
              "|---|---|" + "---|" * len(marks) + "---|---|---|"]
    for arm, recs, val in rows:
        best = max(val.items(), key=lambda kv: kv[1]) if val else None
        ips = sorted(r["images_per_s"] for r in recs)
        f = final(val)
        cells = [arm + (" (stopped)" if arm in stopped else ""), str(len(recs))] + \
            [f"{val[e]:.4f}" if e in val else "–" for e in marks]
        cells += [f"**{f:.4f}**" if f is not None else "–", f"{best[1]:.4f} ({best[0]})" if best else "–",
                  f"{ips[len(ips) // 2]:.2f}" if ips else "–"]
        lines.append("| " + " | ".join(cells) + " |")
    scores = {arm: final(val) for arm, _, val in rows if arm not in stopped}
    not_started = [arm for arm in a.arms.split() if arm not in {r[0] for r in rows} and arm not in stopped]
    if not not_started and all(v is not None for v in scores.values()) and "baseline" in scores:
        win = max(scores, key=scores.get)
        if win != "baseline" and scores[win] > scores["baseline"] + 0.005:
            lines += ["", f"**Chosen: {win}** (final {scores[win]:.4f} against the baseline's {scores['baseline']:.4f})."]
        else:
            lines += ["", f"**Chosen: baseline** (no arm beats its final {scores['baseline']:.4f} by more than 0.005)."]
    finished = {arm for arm, recs, _ in rows if len(recs) >= epochs}
    if {"baseline", "aux", "ema", "ohem", "strong-aug"} <= finished:
        lines += READING_1 if a.study == 1 else READING_2
    unfinished = [arm for arm, recs, _ in rows if len(recs) < epochs and arm not in stopped]
    if unfinished or not_started:
        what = ([f"{', '.join(unfinished)} not yet at {epochs} epochs"] if unfinished else []) + \
            ([f"{', '.join(not_started)} not started"] if not_started else [])
        lines += ["", f"**In progress**: {'; '.join(what)}" + ("" if a.arms else " (arms that have not started are not listed)") +
                  ". No arm is chosen before every arm that was not stopped has finished the same schedule."]
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    open(a.out, "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
