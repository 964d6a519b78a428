#!/usr/bin/python3
"""The peer benchmark in one command: lightseg against PyTorch, ONNX Runtime and OpenCV DNN.

The same network and weights (models/camvid.lsw; the ONNX peers run `lightseg export` of it),
the same machine and thread count, batch 1. Contenders: lightseg's default (`auto`) and each
backend (onednn, fused, eager; bf16 where the CPU has AVX512-BF16/AMX; int8 where it has
AVX512-VNNI and the weights an int8 calibration: `lightseg calibrate`), PyTorch eager
(bench/pytorch_reference.py), ONNX Runtime's CPU execution provider (bench/peers/ort_bench.mjs)
and OpenCV DNN (bench/peers/opencv_bench.py). Rounds alternate the contenders (shared machines
drift by tens of percent from minute to minute); the table gives each one's median of its
per-round medians, and the ratio of each to lightseg's default. At 360x480 each contender also
segments the bundled example: the share of pixels whose label equals lightseg's default.

  /usr/bin/python3 scripts/bench_peers.py [--sizes 360x480,512x1024] [--threads 2] [--rounds 5]
      [--iters 30] [--isa AVX2] [--markdown FILE] [--json]

--isa AVX2 caps the instructions: oneDNN (lightseg, PyTorch) through ONEDNN_MAX_CPU_ISA, PyTorch's
own kernels through ATEN_CPU_CAPABILITY, OpenCV through OPENCV_CPU_DISABLE. ONNX Runtime has no
such switch: it runs at the CPU's full ISA (against lightseg capped, a handicap for lightseg).
Missing peers are left out with a note: apt-get install python3-torch python3-opencv;
npm install --prefix bench/peers --ignore-scripts onnxruntime-node (its install script fetches
a CUDA provider and fails offline; the CPU library is in the package).
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "0016E5_07959.png")
CAPS = {
    "AVX2": {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2",
             "OPENCV_CPU_DISABLE": "AVX512_COMMON,AVX512_SKX,AVX512_KNL,AVX512_KNM,AVX512_CNL,AVX512_CLX,AVX512_ICL"},
    "AVX512": {},
}


def run(cmd, env):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        return None, (r.stderr.strip().splitlines() or ["exit %d" % r.returncode])[-1]
    return json.loads(r.stdout.strip().splitlines()[-1]), None


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main():
    # The peers and the label check run on Debian's Python (its torch and cv2); run as another
    # Python (a pyenv or venv `python3` first on PATH), the script goes on under Debian's.
    if os.path.realpath(sys.executable) != os.path.realpath("/usr/bin/python3") and os.path.exists("/usr/bin/python3"):
        os.execv("/usr/bin/python3", ["/usr/bin/python3", os.path.abspath(__file__)] + sys.argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="360x480,512x1024")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--isa", choices=sorted(CAPS), help="cap the instruction set (default: the CPU's own)")
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin", "lightseg"))
    ap.add_argument("--weights", default=os.path.join(ROOT, "models", "camvid.lsw"))
    ap.add_argument("--markdown", help="also write the table (markdown) to this file")
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    a = ap.parse_args()
    if not os.path.exists(a.bin):
        sys.exit(f"error: no lightseg binary at {a.bin} (build it: scripts/setup.sh)")
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), **CAPS.get(a.isa or "", {}))
    tmp = tempfile.mkdtemp(prefix="lightseg_peers_")
    notes = []
    info, _ = run([a.bin, "info", "--json"], env)
    plans = (info or {}).get("onednn_plans", "")

    def lightseg(backend, precision="fp32"):
        return [a.bin, "bench", "--threads", str(a.threads), "--iters", str(a.iters), "--weights", a.weights,
                "--backend", backend, "--precision", precision, "--json"]

    have_torch = subprocess.run(["/usr/bin/python3", "-c", "import torch"], capture_output=True).returncode == 0
    have_cv = subprocess.run(["/usr/bin/python3", "-c", "import cv2"], capture_output=True).returncode == 0
    have_ort = os.path.isdir(os.path.join(ROOT, "bench", "peers", "node_modules", "onnxruntime-node"))
    if not have_torch:
        notes.append("PyTorch left out: apt-get install python3-torch")
    if not have_cv:
        notes.append("OpenCV DNN left out (and the label agreement): apt-get install python3-opencv")
    if not have_ort:
        notes.append("ONNX Runtime left out: npm install --prefix bench/peers --ignore-scripts onnxruntime-node")

    results = {}
    for size in a.sizes.split(","):
        onnx = os.path.join(tmp, f"model_{size}.onnx")
        exported = subprocess.run([a.bin, "export", "--weights", a.weights, "--size", size, "--onnx", onnx],
                                  capture_output=True, text=True, env=env).returncode == 0
        c = {"lightseg (auto)": (lightseg("auto"), None)}
        for b in ("onednn", "fused", "eager"):
            c[f"lightseg {b}"] = (lightseg(b), None)
        c["lightseg bf16"] = (lightseg("auto", "bf16"), None)
        c["lightseg int8"] = (lightseg("auto", "int8"), None)  # needs AVX512-VNNI and calibrated weights
        if have_torch:
            c["PyTorch eager"] = (["/usr/bin/python3", os.path.join(ROOT, "bench", "pytorch_reference.py"), "--threads",
                                   str(a.threads), "--iters", str(a.iters), "--weights", a.weights, "--json"], "--size")
        if have_ort and exported:
            c["ONNX Runtime"] = (["node", os.path.join(ROOT, "bench", "peers", "ort_bench.mjs"), onnx, size,
                                  str(a.iters), str(a.threads)], "positional")
        if have_cv and exported:
            c["OpenCV DNN"] = (["/usr/bin/python3", os.path.join(ROOT, "bench", "peers", "opencv_bench.py"), onnx, size,
                                str(a.iters), str(a.threads)], "positional")
        runs = {k: [] for k in c}
        dropped = {}
        for r in range(a.rounds):
            for name, (cmd, how) in c.items():
                if name in dropped:
                    continue
                full = cmd + (["--size", size] if how in (None, "--size") else [])
                j, err = run(full, env)
                if j is None:
                    dropped[name] = err
                    print(f"{size} {name}: left out ({err})", file=sys.stderr)
                    continue
                runs[name].append(j)
                print(f"{size} round {r + 1}/{a.rounds} {name}: p50 {j['p50_ms']:.2f} ms", file=sys.stderr)
        res = {}
        for name, js in runs.items():
            if js:
                res[name] = {"p50_ms": round(statistics.median(x["p50_ms"] for x in js), 2),
                             "rounds": [round(x["p50_ms"], 2) for x in js],
                             "backend": js[0].get("backend", "")}
        for name, why in dropped.items():
            notes.append(f"{size} {name}: {why}")
        base = res.get("lightseg (auto)", {}).get("p50_ms")
        for r in res.values():
            r["speedup_of_lightseg"] = round(r["p50_ms"] / base, 2) if base else None
        if size == "360x480" and have_cv:
            agreement(a, env, tmp, onnx if exported else None, c, res, have_torch, have_ort)
        results[size] = res
    title = (f"{cpu_name()}, {a.threads} threads, batch 1, fp32 unless named; ISA "
             f"{a.isa or 'native'} (lightseg onednn: {plans or 'n/a'}); {a.rounds} alternated rounds of "
             f"{a.iters} calls, median of the per-round medians")
    lines = [title, "", "| size | contender | median ms | FPS | time / lightseg (auto) | labels = lightseg's |",
             "|---|---|---|---|---|---|"]
    for size, res in results.items():
        for name, r in res.items():
            agree = f"{100 * r['agreement']:.2f} %" if "agreement" in r else ""
            ratio = f"{r['speedup_of_lightseg']:.2f}×" if r.get("speedup_of_lightseg") else ""
            label = name + (f" ({r['backend']})" if name == "lightseg (auto)" and r["backend"] else "")
            lines.append(f"| {size} | {label} | {r['p50_ms']:.2f} | {1000 / r['p50_ms']:.1f} | {ratio} | {agree} |")
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    text = "\n".join(lines)
    print("\n" + text)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(text + "\n")
    if a.json:
        print(json.dumps({"threads": a.threads, "rounds": a.rounds, "isa": a.isa or "native", "results": results,
                          "notes": notes}))


def agreement(a, env, tmp, onnx, c, res, have_torch, have_ort):
    """Each contender's labels on the bundled example against lightseg's default (360x480)."""
    import cv2
    import numpy as np
    bgr = cv2.imread(EXAMPLE, cv2.IMREAD_COLOR)
    x = np.ascontiguousarray(bgr[:, :, ::-1].transpose(2, 0, 1)[None].astype(np.float32))
    inp = os.path.join(tmp, "example.f32")
    x.tofile(inp)
    labels = {}
    for name in [n for n in c if n.startswith("lightseg")]:
        backend = "auto" if "auto" in name or "bf16" in name or "int8" in name else name.split()[1]
        out = os.path.join(tmp, "ids_" + name.replace(" ", "_").replace("(", "").replace(")", ""))
        cmd = [a.bin, "segment", EXAMPLE, "--weights", a.weights, "--format", "ids", "--out", out, "--backend", backend]
        for p in ("bf16", "int8"):
            if p in name:
                cmd += ["--precision", p]
        if subprocess.run(cmd, capture_output=True, env=env).returncode == 0:
            labels[name] = cv2.imread(os.path.join(out, "0016E5_07959.png"), cv2.IMREAD_UNCHANGED)
    peers = {"PyTorch eager": have_torch and ["/usr/bin/python3", os.path.join(ROOT, "bench", "pytorch_reference.py"),
                                              "--iters", "1", "--weights", a.weights, "--size", "360x480", "--labels"],
             "ONNX Runtime": have_ort and onnx and ["node", os.path.join(ROOT, "bench", "peers", "ort_bench.mjs"), onnx,
                                                    "360x480", "1", str(a.threads)],
             "OpenCV DNN": onnx and ["/usr/bin/python3", os.path.join(ROOT, "bench", "peers", "opencv_bench.py"), onnx,
                                     "360x480", "1", str(a.threads)]}
    for name, cmd in peers.items():
        if not cmd:
            continue
        out = os.path.join(tmp, name.replace(" ", "_") + ".u8")
        if subprocess.run(cmd + [inp, out], capture_output=True, env=env).returncode == 0:
            labels[name] = np.fromfile(out, dtype=np.uint8).reshape(360, 480)
    ref = labels.get("lightseg (auto)")
    if ref is None:
        return
    for name, lab in labels.items():
        if name in res:
            res[name]["agreement"] = float((lab == ref).mean())


if __name__ == "__main__":
    main()
