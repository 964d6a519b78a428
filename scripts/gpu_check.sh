#!/usr/bin/env bash
# The one call on a GPU machine (issue 37): build, the Cuda.* tests, label agreement with the
# CPU, the inference table against the PyTorch peer, a training throughput probe, and a hook for
# more training, all into one folder ($OUT), in at most DEADLINE seconds. Each phase has its own
# time box (`timeout`) and a failed phase never stops the later ones; summary.json says how each
# went and what it measured.
#
#   there (the device tool): OUT=$OUT scripts/gpu_check.sh            carry: [".carry"]
#   here, a dry run on the CPU: DEVICE=cpu scripts/gpu_check.sh        (small sizes, local build)
#
# .carry comes from scripts/pack_carry.sh (the libraries the build needs, GoogleTest, a CamVid
# copy). Environment:
#   OUT          results (default out/gpu-check): summary.json, one log per phase, train runs
#   DEVICE       cuda (default) or cpu (the dry run: build/bin/lightseg of this checkout, tiny sizes)
#   DEADLINE     seconds for everything (default 540)
#   DATA         CamVid in the SegNet layout with train.txt/val.txt (default .carry/camvid; dry run
#                ../shared/data/camvid)
#   BUILD        build folder of scripts/cuda_build.sh (default build-cuda)
#   LIGHTSEG_BIN a built CLI: skips the build
#   TRAIN_SECONDS  the probe of the new training path (default 45; dry run 20)
#   BENCH_CONFIGS  PRECISION:HxW:BATCH ... for the bench table (default: fp16 and bf16 at 360x480 and
#                512x1024, batch 1 and 8); BENCH_ITERS (200)
#   SKIP         phases to leave out, e.g. "bench train_old" (of: tests labels bench train_new
#                train_graph train_old), to give EXTRA_TRAIN their time
#   EXTRA_TRAIN  a command (run with bash -c) given the time that is left, last; it sees OUT,
#                LIGHTSEG_BIN, DATA, DEVICE and SECONDS_LEFT (what it may use)
set -u
cd "$(dirname "$0")/.."
T0=$SECONDS
OUT=${OUT:-out/gpu-check}
DEVICE=${DEVICE:-cuda}
DEADLINE=${DEADLINE:-540}
BUILD=${BUILD:-build-cuda}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
PHASES=$OUT/phases.jsonl
: >"$PHASES"
dry=0
[ "$DEVICE" = cpu ] && dry=1

say() { echo "gpu_check: [$((SECONDS - T0)) s] $*" | tee -a "$OUT/gpu_check.log" >&2; }
left() { echo $((DEADLINE - (SECONDS - T0))); }
# A phase's time box: its cap, but never more than what is left after `reserve` seconds.
box() {  # cap reserve
  local l=$(($(left) - $2))
  [ "$l" -lt "$1" ] && echo "$l" || echo "$1"
}
# One line of phases.jsonl: name, status (ok/failed/skipped/timeout), seconds, note, extra JSON.
record() {  # name status seconds note [json-object]
  "$PY" - "$@" >>"$PHASES" <<'EOF'
import json, sys
name, status, secs, note = sys.argv[1:5]
extra = json.loads(sys.argv[5]) if len(sys.argv) > 5 and sys.argv[5] else {}
print(json.dumps(dict({"phase": name, "status": status, "seconds": int(secs), "note": note}, **extra)))
EOF
}
skipped() { case " ${SKIP:-} " in *" $1 "*) record "$1" skipped 0 "SKIP"; return 0 ;; esac; return 1; }
status_of() {  # exit code → status
  case $1 in 0) echo ok ;; 124 | 137) echo timeout ;; *) echo failed ;; esac
}

say "device $DEVICE, deadline $DEADLINE s, results in $OUT"
{ command -v nvidia-smi >/dev/null && nvidia-smi; } >"$OUT/nvidia-smi.txt" 2>&1 || true
"$PY" -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available())' >"$OUT/python-torch.txt" 2>&1 || true

# ---------------------------------------------------------------- (a) build
t=$SECONDS
if [ -n "${LIGHTSEG_BIN:-}" ]; then
  bin=$LIGHTSEG_BIN
  record build skipped 0 "LIGHTSEG_BIN=$bin"
elif [ "$dry" = 1 ]; then
  bin=build/bin/lightseg
  nice -n 5 cmake --build build -j2 --target lightseg >"$OUT/build.log" 2>&1
  rc=$?
  record build "$(status_of $rc)" $((SECONDS - t)) "dry run: this checkout's build/ (lightseg)"
else
  TESTS=1 timeout "$(box 330 180)" scripts/cuda_build.sh "$BUILD" >"$OUT/build.out" 2>"$OUT/build.log"
  rc=$?
  bin=$BUILD/bin/lightseg
  for f in lightseg-build.log lightseg-build-failed.log lightseg-cmake.log generated/lightseg/features.h; do
    [ -f "$BUILD/$f" ] && cp "$BUILD/$f" "$OUT/$(basename "$f")"
  done
  record build "$(status_of $rc)" $((SECONDS - t)) "$(tail -n 1 "$OUT/build.log" 2>/dev/null | tr -d '"\\')"
fi
[ -d .carry/deps/usr/lib/x86_64-linux-gnu ] &&
  export LD_LIBRARY_PATH="$PWD/.carry/deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [ ! -x "$bin" ]; then
  say "no lightseg binary ($bin): the other phases cannot run"
  record all skipped 0 "no binary"
else
  timeout 60 "$bin" info --device "$DEVICE" --json >"$OUT/info.json" 2>"$OUT/info.err"
  record info "$(status_of $?)" 0 "$(head -c 300 "$OUT/info.err" | tr -d '"\\\n')"
fi

# ---------------------------------------------------------------- Cuda.* tests
t=$SECONDS
tests=$BUILD/bin/lightseg_cuda_tests
[ "$dry" = 1 ] && tests=build/bin/lightseg_tests
if skipped tests; then
  :
elif [ -x "$tests" ]; then
  timeout "$(box 90 300)" "$tests" --gtest_filter='Cuda.*' >"$OUT/cuda_tests.log" 2>&1
  rc=$?
  record cuda_tests "$(status_of $rc)" $((SECONDS - t)) "$(grep -E '^\[  (PASSED|FAILED|SKIPPED)' "$OUT/cuda_tests.log" | tr '\n' ' ' | tr -d '"\\')"
else
  record cuda_tests skipped 0 "no test binary ($tests): no GoogleTest there, or its build failed"
fi

# ---------------------------------------------------------------- (b) labels: device vs CPU
if [ -x "$bin" ] && ! skipped labels; then
  t=$SECONDS
  img=examples/0016E5_07959.png
  seg=$OUT/segment
  mkdir -p "$seg"
  precisions="fp32 fp16 bf16"
  [ "$dry" = 1 ] && precisions=fp32
  timeout "$(box 30 280)" "$bin" segment "$img" --device cpu --precision fp32 --format ids --out "$seg/cpu-fp32" \
    >"$seg/cpu-fp32.log" 2>&1
  agree="{}"
  for p in $precisions; do
    timeout "$(box 20 270)" "$bin" segment "$img" --device "$DEVICE" --precision "$p" --format ids --out "$seg/$DEVICE-$p" \
      >"$seg/$DEVICE-$p.log" 2>&1
    share=$("$PY" scripts/compare_label_pngs.py "$seg/cpu-fp32/0016E5_07959.png" "$seg/$DEVICE-$p/0016E5_07959.png" --json 2>>"$seg/compare.log" |
      "$PY" -c 'import json,sys; print(json.load(sys.stdin)["share"])' 2>/dev/null)
    agree=$("$PY" -c 'import json,sys; d=json.loads(sys.argv[1]); d[sys.argv[2]]=float(sys.argv[3]) if sys.argv[3] else None; print(json.dumps(d))' \
      "$agree" "$p" "${share:-}")
  done
  say "labels equal to the CPU's (fp32): $agree"
  record labels "$([ "$agree" != "{}" ] && echo ok || echo failed)" $((SECONDS - t)) "share of the example's pixels equal to the CPU's fp32 labels" \
    "{\"agreement\": $agree}"
fi

# ---------------------------------------------------------------- (c) inference vs the PyTorch peer
if [ -x "$bin" ] && ! skipped bench; then
  t=$SECONDS
  bench=$OUT/bench.jsonl
  : >"$bench"
  peer=1
  "$PY" -c 'import torch' 2>/dev/null || { peer=0; say "no python torch: no peer"; }
  if [ "$dry" = 1 ]; then
    configs="fp32:360x480:1"
    iters=3
    peer_flags=()
  else
    configs=${BENCH_CONFIGS:-"fp16:360x480:1 fp16:360x480:8 fp16:512x1024:1 fp16:512x1024:8 bf16:360x480:1 bf16:360x480:8 bf16:512x1024:1 bf16:512x1024:8"}
    iters=${BENCH_ITERS:-200}
    peer_flags=(--cuda-graph)
  fi
  for c in $configs; do
    IFS=: read -r p size batch <<<"$c"
    [ "$(left)" -gt 150 ] || { say "bench: stopping for time"; break; }
    timeout 40 "$bin" bench --device "$DEVICE" --precision "$p" --size "$size" --batch "$batch" --iters "$iters" --json \
      2>>"$OUT/bench.err" | tail -n 1 | sed 's/^{/{"who": "lightseg", /' >>"$bench"
    if [ "$peer" = 1 ]; then
      timeout 60 "$PY" bench/pytorch_reference.py --device "$DEVICE" --precision "$p" --size "$size" --batch "$batch" \
        --iters "$iters" --warmup 10 "${peer_flags[@]}" --json 2>>"$OUT/bench.err" | tail -n 1 |
        sed 's/^{/{"who": "pytorch", /' >>"$bench"
    fi
  done
  "$PY" - "$bench" >"$OUT/bench_table.md" 2>>"$OUT/bench.err" <<'EOF'
import json, sys
rows = []
for line in open(sys.argv[1]):
    try:
        rows.append(json.loads(line))
    except ValueError:
        pass
def key(r):
    size = r.get("size", [0, 0])
    return (r.get("precision", "fp32"), f"{size[0]}x{size[1]}", r.get("batch"))
ours = {key(r): r for r in rows if r.get("who") == "lightseg"}
peer = {key(r): r for r in rows if r.get("who") == "pytorch"}
print("| precision, size, batch | lightseg p50 ms | PyTorch p50 ms | lightseg vs PyTorch |")
print("|---|---|---|---|")
for k in ours:
    a, b = ours[k].get("p50_ms"), peer.get(k, {}).get("p50_ms")
    ratio = f"{b / a:.2f}x" if a and b else "-"
    print(f"| {k[0]} {k[1]} x{k[2]} | {a} | {b if b else '-'} | {ratio} |")
EOF
  cat "$OUT/bench_table.md" >&2
  n=$(grep -c '"who": "lightseg"' "$bench")
  record bench "$([ "$n" -gt 0 ] && echo ok || echo failed)" $((SECONDS - t)) "$n lightseg rows; table in bench_table.md"
fi

# ---------------------------------------------------------------- (d) training throughput
# images/s of an epoch's log line (median over epochs after the first) and of the last progress line
train_probe() {  # name seconds extra-flags...
  local name=$1 secs=$2
  shift 2
  local run=$OUT/train-$name
  rm -rf "$run"
  mkdir -p "$run"
  local t=$SECONDS minutes
  minutes=$(awk -v s="$secs" 'BEGIN { printf "%.3f", s / 60 }')
  timeout $((secs + 60)) "$bin" train --data "$DATA" --dataset camvid --out "$run/run" --device "$DEVICE" \
    --val-every 0 --epochs 1000 --time-limit "$minutes" "${TRAIN_FLAGS[@]}" "$@" 2>&1 |
    tr '\r' '\n' | grep -v -E '^\s*$' >"$run/train.log"
  local rc=${PIPESTATUS[0]}
  cp "$run/run/log.jsonl" "$run/" 2>/dev/null
  local stats
  stats=$("$PY" - "$run" <<'EOF'
import json, re, statistics, sys
run = sys.argv[1]
epochs = []
try:
    epochs = [json.loads(l) for l in open(run + "/log.jsonl") if l.strip()]
except OSError:
    pass
last = None
for line in open(run + "/train.log"):
    m = re.search(r"([0-9.]+) img/s\s+data wait ([0-9]+)%", line)
    if m:
        last = (float(m.group(1)), float(m.group(2)) / 100)
later = [e["images_per_s"] for e in epochs[1:]] or [e["images_per_s"] for e in epochs]
print(json.dumps({"epochs": len(epochs),
                  "images_per_s_epoch_median": round(statistics.median(later), 1) if later else None,
                  "data_wait_share_epoch_median": round(statistics.median(e["data_wait_share"] for e in epochs), 3) if epochs else None,
                  "images_per_s_last_progress": last[0] if last else None,
                  "loss_last_epoch": epochs[-1]["loss"] if epochs else None,
                  "skipped_steps": sum(e.get("skipped_steps", 0) for e in epochs)}))
EOF
)
  [ -n "$stats" ] || stats='{}'
  say "train $name: $stats"
  record "train_$name" "$(status_of "$rc")" $((SECONDS - t)) "$(grep -m 4 -E 'data cache|fused|sync_every|cuda graph|error' "$run/train.log" | tr '\n' ' ' | tr -d '"\\')" "$stats"
}
if [ -x "$bin" ]; then
  if [ "$dry" = 1 ]; then
    DATA=${DATA:-../shared/data/camvid}
    TRAIN_FLAGS=(--batch 2 --crop 96x128 --train-split train --threads 2 --workers 2)
    secs=${TRAIN_SECONDS:-20}
  else
    DATA=${DATA:-.carry/camvid}
    TRAIN_FLAGS=(--batch 8 --crop 360x480 --train-split trainval --workers 12)
    secs=${TRAIN_SECONDS:-45}
  fi
  if [ ! -f "$DATA/train.txt" ]; then
    record train skipped 0 "no CamVid copy in $DATA (scripts/pack_carry.sh, carry .carry)"
  else
    [ "$(left)" -gt $((secs + 40)) ] || secs=$(($(left) - 40))
    if skipped train_new; then
      :
    elif [ "$secs" -ge 10 ]; then
      # the GPU path: data cached on the device, batched augmentation, foreach Adam, deferred checks
      train_probe new "$secs" --data-cache device --fused-optimizer on --sync-every 20
    else
      record train_new skipped 0 "no time left"
    fi
    # the same step captured once as a CUDA graph and replayed (--cuda-graph on; its own process,
    # so that a failure here costs only this probe)
    if skipped train_graph; then
      :
    elif [ "$(left)" -gt $((secs + 40)) ] && [ "$secs" -ge 10 ]; then
      train_probe graph "$secs" --data-cache device --fused-optimizer on --sync-every 20 --cuda-graph on
    else
      record train_graph skipped 0 "no time left"
    fi
    # today's path, for comparison: loader threads, torch's Adam, a sync per step
    secs_old=$((secs / 2))
    if skipped train_old; then
      :
    elif [ "$(left)" -gt $((secs_old + 30)) ] && [ "$secs_old" -ge 10 ]; then
      train_probe old "$secs_old" --data-cache off --fused-optimizer off --sync-every 1
    else
      record train_old skipped 0 "no time left"
    fi
  fi
fi

# ---------------------------------------------------------------- (e) more training (EXTRA_TRAIN)
if [ -n "${EXTRA_TRAIN:-}" ]; then
  t=$SECONDS
  l=$(($(left) - 15))
  if [ "$l" -ge 20 ]; then
    say "EXTRA_TRAIN with $l s: $EXTRA_TRAIN"
    OUT=$OUT LIGHTSEG_BIN=$bin DATA=${DATA:-} DEVICE=$DEVICE SECONDS_LEFT=$l timeout "$l" bash -c "$EXTRA_TRAIN" \
      >"$OUT/extra_train.log" 2>&1
    rc=$?
    record extra_train "$(status_of $rc)" $((SECONDS - t)) "$(tail -n 2 "$OUT/extra_train.log" | tr '\n' ' ' | tr -d '"\\')"
  else
    record extra_train skipped 0 "only $l s left"
  fi
fi

# ---------------------------------------------------------------- summary
"$PY" - "$OUT" "$DEVICE" $((SECONDS - T0)) <<'EOF'
import json, os, sys
out, device, secs = sys.argv[1], sys.argv[2], int(sys.argv[3])
phases = []
for line in open(os.path.join(out, "phases.jsonl")):
    try:
        phases.append(json.loads(line))
    except ValueError:
        pass
s = {"device": device, "seconds": secs, "phases": phases}
for name in ("info.json",):
    try:
        s["info"] = {k: v for k, v in json.load(open(os.path.join(out, name))).items() if k in ("params", "macs", "build")}
    except (OSError, ValueError):
        pass
try:
    s["bench"] = [json.loads(l) for l in open(os.path.join(out, "bench.jsonl")) if l.strip().startswith("{")]
except (OSError, ValueError):
    pass
json.dump(s, open(os.path.join(out, "summary.json"), "w"), indent=1)
bad = [p["phase"] for p in phases if p["status"] in ("failed", "timeout")]
print(f"gpu_check: {secs} s; phases not ok: {', '.join(bad) if bad else 'none'}; {out}/summary.json", file=sys.stderr)
EOF
