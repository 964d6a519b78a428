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


def size_rows(a, card):
    """The card table's first rows: the weights file, its parameters and MACs."""
    return (f"| weights | `{a.weights}` (self-describing: config, classes, palette, normalisation) |\n"
            f"| parameters | {card['params']:,} |\n"
            f"| MACs | {card['macs_360x480']/1e9:.2f} G at 360×480, {card['macs_512x1024']/1e9:.2f} G at 512×1024 |")


def run_facts(a):
    """The run's epoch log and the network's size at both card resolutions; copies the curve."""
    log = [json.loads(l) for l in open(os.path.join(a.run, "log.jsonl")) if l.strip()]
    info = run_json([a.bin, "info", "--weights", a.weights, "--size", "360x480", "--json"])
    info_hd = run_json([a.bin, "info", "--weights", a.weights, "--size", "512x1024", "--json"])
    shutil.copyfile(os.path.join(a.run, "curve.svg"), a.out + "-curve.svg")
    return log, info, info_hd


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
    ap.add_argument("--hardware", default="", help="where the run trained, when not this machine alone")
    ap.add_argument("--config", default="",
                    help="the run's config (trainval runs; default configs/NAME.json for the run folder ../runs/NAME)")
    a = ap.parse_args()

    h = header(a.weights)
    train = h.get("extra", {}).get("train", {})
    opts = train.get("options", {})
    if opts.get("train_split") == "trainval":
        return trainval_card(a, h, train, opts)
    log, info, info_hd = run_facts(a)
    chosen = train.get("epoch", len(log))
    hours = sum(r["seconds"] for r in log) / 3600
    # A sequence-disjoint run (val_groups) is scored on its held-out groups of the pooled splits.
    held_out = opts.get("val_groups") or []
    pooled = []
    for s in (opts.get("train_split", "train") + "," + opts.get("val_split", "val")).split(","):
        for p in (["train", "val"] if s == "trainval" else [s]):
            if p and p not in pooled:
                pooled.append(p)
    split_args = ["--split", ",".join(pooled), "--groups", ",".join(held_out)] + \
        (["--group-by", opts["group_by"]] if opts.get("group_by") else []) if held_out else ["--split", "val"]
    ev_cmd = [a.bin, "eval", "--data", a.data, "--dataset", "camvid"] + split_args + ["--weights", a.weights, "--json"]
    ev = run_json(ev_cmd)

    train_cmd = ("lightseg train --data ../shared/data/camvid --dataset camvid --out ../runs/camvid "
                 f"--epochs {opts.get('epochs')} --batch {opts.get('batch')} --lr {opts.get('lr')} "
                 f"--crop {opts.get('crop', [360, 480])[0]}x{opts.get('crop', [360, 480])[1]} --val-every {opts.get('val_every')} "
                 "--time-limit MINUTES --resume"
                 + (" --precision bf16" if opts.get("amp_cpu") else "") + "   (scripts/train_camvid.sh)")
    card = {
        "name": os.path.basename(a.out),
        "weights": a.weights,
        "dataset": ("CamVid 11 classes, sequence-disjoint (seqval): the train and val splits pooled, the frames of "
                    f"drive(s) {', '.join(held_out)} held out for validation, the others trained on; the held-out frames "
                    if held_out else "CamVid 11 classes (SegNet split): train 367 for training, val 101 ")
                   + ("for reporting only (the last epoch is shipped)" if a.last else "for choosing the checkpoint"),
        "val_groups": held_out,
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
    rows = "\n".join(f"| {k} | {'n/a' if v is None else f'{v:.4f}'} |" for k, v in ev["per_class"].items())
    md = f"""# Model card: {card['name']}

The default network of [docs/NETWORK.md](../docs/NETWORK.md) trained from scratch on CamVid with `lightseg train`.
{status}

| | |
|---|---|
{size_rows(a, card)}
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


def trainval_card(a, h, train, opts):
    """The card of weights trained on train + val: no split of the data folder is unseen, so no
    score is given for them; the card states the protocol exactly, and val only for the train-only
    weights the run started from (their own card)."""
    log, info, info_hd = run_facts(a)
    done, planned = len(log), opts.get("epochs")
    finished = a.last and done == planned
    init = opts.get("init_weights", "")
    init_card = {}
    if init and os.path.exists(os.path.splitext(init)[0] + ".json"):
        init_card = json.load(open(os.path.splitext(init)[0] + ".json"))
    init_epochs = init_card.get("epochs_trained", 0)
    crop = opts.get("crop", [360, 480])
    recipe = {k: opts.get(k) for k in ["optimizer", "lr", "weight_decay", "batch", "crop", "scale_min", "scale_max",
                                         "flip", "jitter", "loss", "poly_power", "warmup_epochs", "epochs", "seed",
                                         "aux_weight", "ema_decay"]}
    protocol = {
        "training_data": "CamVid train + val (367 + 101 = 468 images, 480x360, 11 classes, SegNet split)",
        "stage_1": (f"{init_epochs} epochs on train only, from scratch (random initialisation, no ImageNet): "
                    f"{init} ({os.path.splitext(os.path.basename(init))[0]}.md)") if init else "none: from scratch",
        "stage_2": (f"{planned} epochs on train + val from the stage-1 weights, learning-rate schedule restarted "
                    f"(poly {opts.get('poly_power')} with {opts.get('warmup_epochs')} warm-up epoch), crops "
                    f"{crop[0]}x{crop[1]}, scale {opts.get('scale_min')}-{opts.get('scale_max')}, "
                    f"flip {'on' if opts.get('flip') else 'off'}, loss {opts.get('loss')}, seed {opts.get('seed')}"
                    + (f", auxiliary heads on the semantic branches (loss weight {opts.get('aux_weight')}, training only: "
                       "the shipped network has none of their weights or cost)" if opts.get("aux_weight") else "")),
        "epochs_in_all": init_epochs + (planned or 0),
        "selection": "the last epoch, fixed before the run started; no checkpoint chosen by any score",
        "evaluation": "full 360x480 images (the data's own size), single scale, no test-time augmentation "
                      "(no flip, no multi-scale): lightseg eval --split test on a data folder that has it",
    }
    name = os.path.basename(os.path.normpath(a.run))
    config = a.config or f"configs/{name}.json"
    if not os.path.exists(config):
        sys.exit(f"error: the run's config {config} does not exist (name it with --config)")
    env = "" if name == "camvid-trainval" else f"CONFIG={config} "
    train_cmd = (f"{env}scripts/train_camvid_trainval.sh MINUTES   (lightseg train --data ../shared/data/camvid "
                 f"--dataset camvid --config {config} --out ../runs/{name} --precision auto "
                 "--time-limit MINUTES --resume)")
    hours = sum(r["seconds"] for r in log) / 3600
    card = {
        "name": os.path.basename(a.out),
        "weights": a.weights,
        "dataset": protocol["training_data"],
        "protocol": protocol,
        "train_command": train_cmd,
        "recipe": recipe,
        "epochs_trained": done,
        "epochs_planned": planned,
        "finished": finished,
        "wall_time_hours": round(hours, 2),
        "hardware": a.hardware or f"{cpu_name()}, {os.cpu_count()} cores (CPU only)",
        "val_miou": None,
        "val_note": "not reported: val is training data here",
        "init_weights_val_miou": init_card.get("val_miou"),
        "init_weights_val_per_class_iou": init_card.get("val_per_class_iou"),
        "params": info["params"],
        "macs_360x480": info["macs"],
        "macs_512x1024": info_hd["macs"],
        "curve": os.path.basename(a.out) + "-curve.svg",
        "note": a.note,
        "selection": "last epoch",
    }
    with open(a.out + ".json", "w") as f:
        json.dump(card, f, indent=2)
    if finished:
        status = (f"**Status: finished** ({done} of {planned} trainval epochs, {protocol['epochs_in_all']} in all); "
                  "these are the weights of the last epoch, chosen by no score.")
    else:
        status = (f"**Status: training is still in progress** ({done} of {planned} trainval epochs); "
                  "these weights are the latest checkpoint, not the shipped result.")
    init_val = ""
    if init_card.get("val_per_class_iou"):
        rows = "\n".join(f"| {k} | {v:.4f} |" for k, v in init_card["val_per_class_iou"].items())
        init_val = (f"\nVal is in the training data of these weights, so no val score is given for them. The stage-1 "
                    f"weights (train only) score **{init_card['val_miou']:.4f}** val mIoU:\n\n| class | val IoU "
                    f"(stage 1, `{init}`) |\n|---|---|\n{rows}\n")
    steps = "\n".join(f"- {k.replace('_', ' ')}: {v}" for k, v in protocol.items())
    md = f"""# Model card: {card['name']}

The default network of [docs/NETWORK.md](../docs/NETWORK.md) trained from scratch on CamVid train + val with
`lightseg train`, under the protocol of the published < 1 M-parameter networks (DABNet, FBSNet, ...).
{status}

| | |
|---|---|
{size_rows(a, card)}
| data | {card['dataset']} |
| epochs | {done} of {planned} on train + val, after {init_epochs} on train only ({protocol['epochs_in_all']} in all) |
| wall time | {card['wall_time_hours']} h (train + val stage) on {card['hardware']} |
| val mIoU | not reported: val is training data here |

Protocol:

{steps}

Training command (resumable; the run folder stays outside the repository):

    {train_cmd}

Recipe: {json.dumps(recipe)}.
{(chr(10) + a.note + chr(10)) if a.note else ''}{init_val}
![training curve]({card['curve']})
"""
    with open(a.out + ".md", "w") as f:
        f.write(md)
    print(f"wrote {a.out}.md, {a.out}.json, {a.out}-curve.svg ({done} of {planned} trainval epochs, "
          f"{'finished' if finished else 'in progress'})")


if __name__ == "__main__":
    main()
