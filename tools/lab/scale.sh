#!/usr/bin/env bash
# The scale benchmark of the streamed held-out pass on a GPU (its targets, set on the H200:
# Lite0 with real weights on 50,000 held-out images, <= 4 min cold, peak host memory <= 4 GiB
# and within 0.5 GiB of the same study at 1,000). Run from the repository root on the GPU machine:
#
#     bash tools/lab/scale.sh [DATA_ROOT]      # DATA_ROOT: holds val-1300/, calib-1000/,
#                                              # classes.txt (default shared/data/imagenet)
#
# GPU names the record (default: the first GPU's model as nvidia-smi gives it, lower case,
# e.g. h100 or h200).
# SIZES overrides the held-out sizes (default 1000,50000; each size's row is written as it ends).
# CALIB names another calibration folder (a part of calib-1000 where the whole does not travel);
# the 300 calibration images must not come from val-1300, whose variants are the held-out set.
#
# Makes 50,000 deterministic crop/flip variants of val-1300 (throughput and memory only: not
# evidence about quality), then `tools/lab/bench/scale.py` at 1,000 and 50,000 held-out images
# with empty compile caches for each size (--cold). Writes $OUT/scale-$GPU.json (stage table,
# images/s, peak memory, provenance) and prints the table.
set -euo pipefail
DATA=${1:-shared/data/imagenet}
CALIB=${CALIB:-$DATA/calib-1000}
OUT=${OUT:-/tmp/scale-out}
GPU=${GPU:-$(nvidia-smi --query-gpu=name --format=csv,noheader -i 0 | awk '{print tolower($2)}')}
WORK=${WORK:-/tmp/scale-work}
mkdir -p "$OUT" "$WORK"
python tools/lab/make_variants.py "$DATA/val-1300" "$WORK/variants" --count 50000 --workers 12

PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} python tools/lab/bench/scale.py tf_efficientnet_lite0 \
    --sizes "${SIZES:-1000,50000}" --cold --out "$WORK/scale" --record "$OUT/scale-$GPU.json" -- \
    --weights efficientnet-lite0 --data "$WORK/variants" --calib-data "$CALIB" \
    --class-list "$DATA/classes.txt" --calib 300 --batches 1,32,128 --device cuda
