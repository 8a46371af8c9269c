#!/usr/bin/env bash
# One row of tools/bench/peers-rows.yaml (the N-th, from 1) as a job of tools/device/batch.py:
#     bash tools/device/jobs/peers-row.sh N
# The row joins the newest peers record there is, an earlier job's of this batch
# ($BATCH_JOBS/peers-*/peers-h200.json) or one carried from an earlier call
# (.carry/peers-h200.json), and the whole is written to $OUT/peers-h200.json: rows run one after
# another (each job `after` the one before) make one record, as `--append` does a call at a time
# (tools/device/README.md). The row travels as a rows file of its own, so a row that fails is
# not tried again by the next job, as `--max-rows 1` over the whole file would.
set -euo pipefail
n=$1
D=.carry/data/imagenet
# shellcheck disable=SC2012  # newest by time; the names are ours, without spaces
newest=$(ls -t "$BATCH_JOBS"/peers-*/peers-h200.json .carry/peers-h200.json 2>/dev/null |
    head -1 || true)
[ -z "$newest" ] || cp "$newest" "$OUT/peers-h200.json"
python3 - "$n" "$OUT/row.yaml" <<'PY'
import sys

import yaml

rows = yaml.safe_load(open("tools/bench/peers-rows.yaml"))["rows"]
yaml.safe_dump({"rows": [rows[int(sys.argv[1]) - 1]]}, open(sys.argv[2], "w"))
PY
TIMEOUT=$((JOB_BUDGET_S - 30)) bash tools/device/quantstudy.sh peers bench peers \
    --rows "$OUT/row.yaml" --data $D/val-1300 --calib-data $D/calib-1000 \
    --class-list $D/classes.txt --calib 100 --heldout 512 --batches 1,128 --device cuda \
    --append --out "$OUT/peers-h200.json"
