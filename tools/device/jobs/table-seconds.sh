#!/usr/bin/env bash
# One zoo row's build seconds three ways, as a job of tools/device/batch.py:
#     bash tools/device/jobs/table-seconds.sh [MODEL]      (default resnet50)
# 1. cold: a bare machine, empty Inductor, Triton and tuning caches, no shipped tuning table
#    (the package's tables moved aside in this copy of the tree);
# 2. table: empty caches again, with the table built from the cold run's store
#    (`quantstudy bench tuning-table`), as a fresh machine of this GPU would find it shipped;
# 3. warm: the cold run's caches (its compiled kernels and tuning store), the table in place.
# Each is the zoo's study of the model (speed only, random weights, batches 1 and 128, the
# fused kernel, 64 calibration and 256 held-out images). Writes $OUT/table-seconds.json (one
# line per run: build_s, tune_s, where the tiles came from; tools/device/build_seconds.py) and
# the table built, $OUT/tables/. The tree's own tables come back in place at the end.
set -uo pipefail
model=${1:-resnet50}
D=.carry/data/imagenet/val-1300
root=$PWD/.cache/table-seconds
tables=src/quantstudy/quant/kernels/tables
rm -rf "$root" && mkdir -p "$root/shipped" "$OUT/tables"
cp -r $tables/. "$root/shipped/" && rm -f $tables/*.json  # cold: no table

study() {  # NAME CACHE: one study with its caches under $root/CACHE
  TORCHINDUCTOR_CACHE_DIR=$root/$2/inductor TRITON_CACHE_DIR=$root/$2/triton TIMEOUT=160 \
    bash tools/device/quantstudy.sh "seconds-$1" run --model "$model" --weights random \
    --no-quality --data $D --calib 64 --heldout 256 --batches 1,128 --fp8-kernel fused \
    --device cuda --out "$root/$1" --force
}

study cold cold
TORCHINDUCTOR_CACHE_DIR=$root/cold/inductor bash tools/device/quantstudy.sh table \
  bench tuning-table --from "$root/cold/triton_tuning.json" --out $tables
cp $tables/*.json "$OUT/tables/" 2>/dev/null || echo "no table built"
study table table
study warm cold
PYTHONPATH=src:${TMPDIR:-/tmp}/site python3 tools/device/build_seconds.py cold="$root/cold" table="$root/table" \
  warm="$root/warm" | tee "$OUT/table-seconds.json"
rm -f $tables/*.json && cp -r "$root/shipped/." $tables/  # the tree's tables as they came
