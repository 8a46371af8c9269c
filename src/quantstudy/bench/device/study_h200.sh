#!/bin/bash
# One whole `quantstudy run` of EfficientNet-Lite0 on the H200, through the device tool from the
# repository root (the working tree travels; PYTHONPATH=src), with .carry/ as options_h200.sh
# describes (whl/, data/imagenet/{val-1300, calib-500, classes.txt}, COMMIT).
# Arguments: extra `quantstudy run` arguments (e.g. --recipe generic_pointwise_sequential).
# Writes gpu.txt, study.log and the study's study.json, report.md and plots to $OUT/study (the
# device tool returns at most 8 files: the study's .cache and .lock stay behind).
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site \
  .carry/whl/*.whl || exit 1
export PYTHONPATH=src:/tmp/site PYTHONUNBUFFERED=1 QUANTSTUDY_GIT_COMMIT=$(cat .carry/COMMIT)
D=.carry/data/imagenet
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv
  python3 -c "import torch, triton, timm; print(torch.__version__, torch.version.cuda, triton.__version__, timm.__version__)"
  cat .carry/COMMIT; } > $OUT/gpu.txt 2>&1
timeout ${STUDY_TIMEOUT:-540} python3 -c "import sys; from quantstudy.cli import main; sys.exit(main())" \
  run tf_efficientnet_lite0 --weights efficientnet-lite0 --data $D/val-1300 \
  --calib-data $D/calib-500 --class-list $D/classes.txt --calib 500 --heldout 1300 \
  --device cuda --out /tmp/study "$@" 2>&1 | grep -v "━" | tee $OUT/study.log
echo "study exit ${PIPESTATUS[0]}"
mkdir -p $OUT/study && cp /tmp/study/study.json /tmp/study/report.md /tmp/study/*.png $OUT/study/
true
