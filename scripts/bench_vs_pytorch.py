#!/usr/bin/python3
"""`lightseg bench` (fp32 and bf16) against PyTorch eager on the same network, same machine.

Shared virtual machines drift by tens of percent from minute to minute, so one run of each
proves little. This script alternates the contenders for several rounds (fp32, bf16,
PyTorch, fp32, bf16, PyTorch, ...) and reports each one's median of the per-round medians,
their ratios, and the achieved fraction of the peak that `lightseg bench` measured.

  /usr/bin/python3 scripts/bench_vs_pytorch.py [--rounds 6] [--sizes 360x480,512x1024]
      [--threads 2] [--bin build/bin/lightseg] [--weights models/camvid.lsw] [--json]

PyTorch comes from Debian's python3-torch (bench/pytorch_reference.py); without it the
PyTorch column is left out. bf16 is left out where `lightseg bench --precision bf16` fails
(CPUs without AVX512-BF16/AMX, builds without oneDNN).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def last_json(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return None, (r.stderr.strip().splitlines() or ["exit %d" % r.returncode])[-1]
    return json.loads(r.stdout.strip().splitlines()[-1]), None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--sizes", default="360x480,512x1024")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=40)
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin", "lightseg"))
    ap.add_argument("--weights", default=os.path.join(ROOT, "models", "camvid.lsw"))
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    a = ap.parse_args()
    if not os.path.exists(a.bin):
        sys.exit(f"error: no lightseg binary at {a.bin} (build it: scripts/setup.sh)")
    contenders = {
        "fp32": [a.bin, "bench", "--threads", str(a.threads), "--iters", str(a.iters), "--weights", a.weights,
                 "--json"],
        "bf16": [a.bin, "bench", "--threads", str(a.threads), "--iters", str(a.iters), "--weights", a.weights,
                 "--precision", "bf16", "--json"],
        "pytorch": ["/usr/bin/python3", os.path.join(ROOT, "bench", "pytorch_reference.py"), "--threads",
                    str(a.threads), "--iters", str(a.iters), "--weights", a.weights, "--json"],
    }
    results = {}
    for size in a.sizes.split(","):
        runs = {k: [] for k in contenders}
        dropped = {}
        for r in range(a.rounds):
            for name, cmd in contenders.items():
                if name in dropped:
                    continue
                j, err = last_json(cmd + ["--size", size])
                if j is None:
                    dropped[name] = err
                    print(f"{size} {name}: left out ({err})", file=sys.stderr)
                    continue
                runs[name].append(j)
                print(f"{size} round {r + 1}/{a.rounds} {name}: p50 {j['p50_ms']:.2f} ms", file=sys.stderr)
        res = {}
        for name, js in runs.items():
            if not js:
                continue
            p50 = statistics.median(x["p50_ms"] for x in js)
            res[name] = {"p50_ms": round(p50, 2), "rounds": [x["p50_ms"] for x in js]}
            if "peak_fraction" in js[0]:
                res[name]["peak_fraction"] = round(statistics.median(x["peak_fraction"] for x in js), 3)
                res[name]["peak_gmac_s"] = round(statistics.median(x["peak_gmac_s"] for x in js), 1)
                res[name]["achieved_gmac_s"] = round(statistics.median(x["achieved_gmac_s"] for x in js), 1)
                res[name]["device"] = js[0].get("device", "")
        if "pytorch" in res:
            for name in ("fp32", "bf16"):
                if name in res:
                    res[name]["vs_pytorch"] = round(res["pytorch"]["p50_ms"] / res[name]["p50_ms"], 2)
        results[size] = res
    print(f"\n{a.rounds} alternating rounds, {a.threads} threads, batch 1; median of the per-round medians")
    print(f"{'size':>9} {'contender':>9} {'p50 ms':>8} {'FPS':>6} {'vs PyTorch':>10} {'of peak':>16}")
    for size, res in results.items():
        for name, r in res.items():
            peak = (f"{r['achieved_gmac_s']:.0f}/{r['peak_gmac_s']:.0f} = {100 * r['peak_fraction']:.0f}%"
                    if "peak_fraction" in r else "")
            vs = f"{r['vs_pytorch']:.2f}x" if "vs_pytorch" in r else ""
            print(f"{size:>9} {name:>9} {r['p50_ms']:8.2f} {1000 / r['p50_ms']:6.1f} {vs:>10} {peak:>16}")
    if a.json:
        print(json.dumps({"threads": a.threads, "rounds": a.rounds, "results": results}))


if __name__ == "__main__":
    main()
