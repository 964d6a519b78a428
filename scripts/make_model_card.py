#!/usr/bin/env python3
"""Writes the model card for shipped weights (markdown + JSON), from the weights file itself,
the run's log and a fresh `lightseg eval` / `lightseg info`, so every figure on the card is
reproduced by the command it states.

  scripts/make_model_card.py --weights models/camvid.lsw --run ../runs/camvid \
      --data ../shared/data/camvid --out models/camvid
Standard library only.
"""
import argparse, json, os, platform, shutil, struct, subprocess, sys


def header(path):
    with open(path, "rb") as f:
        magic = f.read(8)
        if magic != b"LSEGWTS1":
            sys.exit(f"error: {path} is not a lightseg weights file")
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n))


def run_json(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()
    return json.loads(out[-1])


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weights", required=True)
    ap.add_argument("--run", required=True, help="run folder (log.jsonl, curve.svg)")
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True, help="output prefix, e.g. models/camvid")
    ap.add_argument("--bin", default="build/bin/lightseg")
    ap.add_argument("--note", default="", help="a paragraph added to the card (e.g. how the run changed)")
    ap.add_argument("--last", action="store_true",
                    help="the weights are the finished run's last epoch (not a checkpoint chosen on val)")
    a = ap.parse_args()

    h = header(a.weights)
    train = h.get("extra", {}).get("train", {})
    opts = train.get("options", {})
    log = [json.loads(l) for l in open(os.path.join(a.run, "log.jsonl")) if l.strip()]
    chosen = train.get("epoch", len(log))
    hours = sum(r["seconds"] for r in log) / 3600
    ev_cmd = [a.bin, "eval", "--data", a.data, "--dataset", "camvid", "--split", "val", "--weights", a.weights, "--json"]
    ev = run_json(ev_cmd)
    info = run_json([a.bin, "info", "--weights", a.weights, "--size", "360x480", "--json"])
    info_hd = run_json([a.bin, "info", "--weights", a.weights, "--size", "512x1024", "--json"])
    shutil.copyfile(os.path.join(a.run, "curve.svg"), a.out + "-curve.svg")

    train_cmd = ("lightseg train --data ../shared/data/camvid --dataset camvid --out ../runs/camvid "
                 f"--epochs {opts.get('epochs')} --batch {opts.get('batch')} --lr {opts.get('lr')} "
                 f"--crop {opts.get('crop', [360, 480])[0]}x{opts.get('crop', [360, 480])[1]} --val-every {opts.get('val_every')} "
                 "--time-limit MINUTES --resume"
                 + (" --precision bf16" if opts.get("amp_cpu") else "") + "   (scripts/train_camvid.sh)")
    card = {
        "name": os.path.basename(a.out),
        "weights": a.weights,
        "dataset": "CamVid 11 classes (SegNet split): train 367 for training, val 101 "
                   + ("for reporting only (the last epoch is shipped)" if a.last else "for choosing the checkpoint"),
        "train_command": train_cmd,
        "recipe": {k: opts.get(k) for k in ["optimizer", "lr", "weight_decay", "batch", "crop", "scale_min", "scale_max",
                                             "flip", "loss", "poly_power", "warmup_epochs", "epochs", "seed"]},
        "epochs_trained": len(log),
        "epochs_planned": opts.get("epochs"),
        "checkpoint_epoch": chosen,
        "wall_time_hours": round(hours, 2),
        "hardware": f"{cpu_name()}, {os.cpu_count()} cores (CPU only)",
        "eval_command": " ".join(["lightseg"] + ev_cmd[1:]),
        "val_miou": ev["miou"],
        "val_pixel_acc": ev["pixel_acc"],
        "val_per_class_iou": ev["per_class"],
        "params": info["params"],
        "macs_360x480": info["macs"],
        "macs_512x1024": info_hd["macs"],
        "curve": os.path.basename(a.out) + "-curve.svg",
        "precision": "bf16 autocast" if opts.get("amp_cpu") else "float32",
        "note": a.note,
        "selection": "last epoch" if a.last else "best val mIoU so far",
    }
    with open(a.out + ".json", "w") as f:
        json.dump(card, f, indent=2)
    if a.last:
        status = (f"**Status: finished** ({card['epochs_trained']} of {card['epochs_planned']} epochs); these are the "
                  f"weights of the last epoch, {chosen}, chosen by no score.")
    else:
        status = (f"**Status: training is still in progress** ({card['epochs_trained']} of {card['epochs_planned']} "
                  "planned epochs);\nthese weights are the best val checkpoint so far and are replaced whenever a "
                  "later checkpoint scores higher on val.")
    rows = "\n".join(f"| {k} | {v:.4f} |" for k, v in ev["per_class"].items())
    md = f"""# Model card: {card['name']}

The default network of [docs/NETWORK.md](../docs/NETWORK.md) trained from scratch on CamVid with `lightseg train`.
{status}

| | |
|---|---|
| weights | `{a.weights}` (self-describing: config, classes, palette, normalisation) |
| parameters | {card['params']:,} |
| MACs | {card['macs_360x480']/1e9:.2f} G at 360×480, {card['macs_512x1024']/1e9:.2f} G at 512×1024 |
| data | {card['dataset']} |
| epochs | {card['epochs_trained']} trained (checkpoint from epoch {chosen}), {card['epochs_planned']} planned |
| wall time | {card['wall_time_hours']} h on {card['hardware']} |
| **val mIoU** | **{ev['miou']:.4f}** (pixel accuracy {ev['pixel_acc']:.4f}) |

Training command (resumable; the run folder stays outside the repository):

    {train_cmd}

Recipe: {json.dumps(card['recipe'])}; these weights were trained in {card['precision']}.
{(chr(10) + a.note + chr(10)) if a.note else ''}
Reproduce the figures:

    {card['eval_command']}

| class | val IoU |
|---|---|
{rows}

![training curve]({card['curve']})
"""
    with open(a.out + ".md", "w") as f:
        f.write(md)
    print(f"wrote {a.out}.md, {a.out}.json, {a.out}-curve.svg (val mIoU {ev['miou']:.4f})")


if __name__ == "__main__":
    main()
