#!/usr/bin/env bash
# The CamVid trainval run behind the shipped default weights, resumable: call it again to continue.
#   scripts/train_camvid_trainval.sh [MINUTES]     (default 170)
# - the schedule is configs/camvid-trainval.json's (CONFIG): train + val (468 images), from the
#   300-epoch train-only weights, the chosen recipe, its epochs; fixed before the first epoch,
#   and the last epoch is what ships (no score chooses a checkpoint: val is in the training set);
# - the run folder lives outside the repository (RUN_DIR, default ../runs/NAME for the config
#   configs/NAME.json); its last.lsw is the resumable state. To continue on another machine,
#   copy the run folder there. Never commit checkpoints: they stay in the history forever;
# - if the run folder has no checkpoint yet and models/checkpoints/NAME-last.lsw exists (an
#   untracked copy placed there by hand, or left by an older version of this script), it is
#   the start;
# - trains niced until MINUTES have passed (checkpoint written).
set -euo pipefail
cd "$(dirname "$0")/.."
MINUTES=${1:-170}
CONFIG=${CONFIG:-configs/camvid-trainval.json}
DATA=${CAMVID:-../shared/data/camvid}
NAME=$(basename "$CONFIG" .json)
RUN_DIR=${RUN_DIR:-../runs/$NAME}
BIN=${LIGHTSEG_BIN:-build/bin/lightseg}
CKPT=models/checkpoints/$NAME-last.lsw
mkdir -p "$RUN_DIR"
if [ ! -f "$RUN_DIR/last.lsw" ] && [ -f "$CKPT" ]; then
  cp "$CKPT" "$RUN_DIR/last.lsw"
  echo "train_camvid_trainval: resuming from $CKPT" >&2
fi
resume=()
[ -f "$RUN_DIR/last.lsw" ] && resume=(--resume)
nice -n "${NICE:-10}" "$BIN" train --data "$DATA" --dataset camvid --config "$CONFIG" --out "$RUN_DIR" \
  --precision "${PRECISION:-auto}" --time-limit "$MINUTES" ${THREADS:+--threads "$THREADS"} "${resume[@]}"
echo "train_camvid_trainval: the run's state is $RUN_DIR/last.lsw (copy the run folder to move it; do not commit it)" >&2
