#!/bin/bash
# `quantstudy.bench.limit` on the H200 (issue 22), through the device tool from the repository
# root (the working tree travels; PYTHONPATH=src), with .carry/ as options_h200.sh describes
# (whl/ for Lite0's real weights and pydantic, data/imagenet/val-1300, COMMIT).
# Arguments: MODELS (comma-separated) and extra `bench.limit` arguments.
# Writes gpu.txt, limit.json (rewritten after every engine) and limit.log to $OUT.
set -o pipefail
models=$1; shift
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site \
  .carry/whl/*.whl || exit 1
export PYTHONPATH=src:/tmp/site PYTHONUNBUFFERED=1 QUANTSTUDY_GIT_COMMIT=$(cat .carry/COMMIT)
{ date; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv
  python3 -c "import torch, triton, timm; print(torch.__version__, torch.version.cuda, triton.__version__, timm.__version__)"
  cat .carry/COMMIT; } > $OUT/gpu.txt 2>&1
cat $OUT/gpu.txt
timeout ${LIMIT_TIMEOUT:-560} python3 -m quantstudy.bench.limit \
  --images .carry/data/imagenet/val-1300 --models "$models" --out $OUT/limit.json "$@" \
  2>&1 | grep -v "━" | tee $OUT/limit.log
echo "limit exit ${PIPESTATUS[0]}"; date
true
