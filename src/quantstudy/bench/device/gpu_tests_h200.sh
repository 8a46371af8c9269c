#!/bin/bash
# GPU tests and the depthwise benchmark on the H200, through the device tool from the repository
# root, with .carry/ as options_h200.sh describes (whl/ for pydantic, COMMIT).
# Arguments: test paths for pytest. Writes gpu-tests.log (and, when DW_MODEL is set,
# depthwise.json / depthwise.log from `quantstudy bench depthwise $DW_MODEL`) to $OUT.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site \
  .carry/whl/*.whl || exit 1
export PYTHONPATH=src:/tmp/site PYTHONUNBUFFERED=1 QUANTSTUDY_GIT_COMMIT=$(cat .carry/COMMIT)
{ date; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton, timm; print(torch.__version__, torch.version.cuda, triton.__version__, timm.__version__)"
  cat .carry/COMMIT; } 2>&1 | tee $OUT/gpu-tests.log
timeout ${TESTS_TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider "$@" 2>&1 \
  | tail -40 | tee -a $OUT/gpu-tests.log
echo "pytest exit ${PIPESTATUS[0]}" | tee -a $OUT/gpu-tests.log
if [ -n "$DW_MODEL" ]; then
  timeout ${DW_TIMEOUT:-120} python3 -m quantstudy.cli bench depthwise "$DW_MODEL" \
    --out $OUT/depthwise.json 2>&1 | grep -v "━" | tee $OUT/depthwise.log
fi
date
true
