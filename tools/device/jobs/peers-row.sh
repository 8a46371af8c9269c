#!/usr/bin/env bash
# One row of tools/lab/bench/peers-rows.yaml (the N-th, from 1) as a job of tools/device/batch.py:
#     bash tools/device/jobs/peers-row.sh N [BENCH-PEERS-OPTION ...]
# (the options after N go to `bench peers`, e.g. --ours fused,fastest,scaled_mm)
# The row is written as a record of its own, $OUT/peers-row.json: rows run side by side on the
# GPUs of one host, or one after another on one GPU, and the `peers-merge` job makes the table
# of them (`quantstudy bench peers-merge`, which refuses rows measured unlike each other). The
# row travels as a rows file of its own, so a row that fails costs only its own job.
set -euo pipefail
n=$1
shift
D=.carry/data/imagenet
python3 - "$n" "$OUT/row.yaml" <<'PY'
import sys

import yaml

rows = yaml.safe_load(open("tools/lab/bench/peers-rows.yaml"))["rows"]
yaml.safe_dump({"rows": [rows[int(sys.argv[1]) - 1]]}, open(sys.argv[2], "w"))
PY
TIMEOUT=$((JOB_BUDGET_S - 30)) bash tools/device/quantstudy.sh peers bench peers \
    --rows "$OUT/row.yaml" --data $D/val-1300 --calib-data $D/calib-1000 \
    --class-list $D/classes.txt --calib 100 --heldout 512 --batches 1,128 --device cuda \
    --out "$OUT/peers-row.json" "$@"
