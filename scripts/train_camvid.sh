#!/usr/bin/env bash
# The long CamVid run behind the shipped weights, resumable: call it again to continue.
#   scripts/train_camvid.sh [MINUTES]     (default 170)
# - the run folder lives outside the repository (RUN_DIR, default ../runs/camvid); its
#   last.lsw is the resumable state. To continue on another machine, copy the run folder
#   there. Never commit checkpoints: they stay in the history forever (README: clone size);
# - if the run folder has no checkpoint yet and models/checkpoints/camvid-last.lsw exists
#   (an untracked copy placed there by hand, or left by an older version of this script),
#   it starts from that;
# - trains niced in the foreground until MINUTES have passed (checkpoint written).
# The recipe (DABNet/CGNet/FBSNet on CamVid): Adam 1e-3, wd 2e-4, batch 8, poly 0.9 after
# 1 warm-up epoch, scale 0.75–2.0, crop 360x480, flip, class-weighted CE, 300 epochs.
set -euo pipefail
cd "$(dirname "$0")/.."
MINUTES=${1:-170}
DATA=${CAMVID:-../shared/data/camvid}
RUN_DIR=${RUN_DIR:-../runs/camvid}
BIN=${LIGHTSEG_BIN:-build/bin/lightseg}
mkdir -p "$RUN_DIR"
if [ ! -f "$RUN_DIR/last.lsw" ] && [ -f models/checkpoints/camvid-last.lsw ]; then
  cp models/checkpoints/camvid-last.lsw "$RUN_DIR/last.lsw"
  echo "train_camvid: resuming from models/checkpoints/camvid-last.lsw" >&2
fi
# auto: bf16 autocast on CPUs with native bf16 (~1.3x images/s on AVX512-BF16), else fp32 (bf16
# emulated is ~10x slower); PRECISION=fp32 or bf16 to force one. Two early
# bf16 stretches of the CamVid run ended in a NaN loss (epochs 35 and 52); since the trainer
# skips non-finite steps (epoch 83 on), 98 bf16 epochs skipped one step (epoch 169).
PRECISION=${PRECISION:-auto}
nice -n "${NICE:-10}" "$BIN" train --data "$DATA" --dataset camvid --out "$RUN_DIR" \
  --epochs 300 --batch 8 --lr 1e-3 --crop 360x480 --val-every 2 --time-limit "$MINUTES" --resume \
  --precision "$PRECISION"
echo "train_camvid: the run's state is $RUN_DIR/last.lsw (copy the run folder to move it; do not commit it)" >&2
