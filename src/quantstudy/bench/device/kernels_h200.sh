#!/bin/bash
# `quantstudy bench kernels` of EfficientNet-Lite0 (real weights) on the H200, through the device
# tool from the repository root, with .carry/ as options_h200.sh describes.
# Arguments: extra `bench kernels` arguments (e.g. --recipe FILE). Writes kernels.json and
# kernels.log to $OUT (no kernel sources: the device tool returns at most 8 files).
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site \
  .carry/whl/*.whl || exit 1
export PYTHONPATH=src:/tmp/site PYTHONUNBUFFERED=1 QUANTSTUDY_GIT_COMMIT=$(cat .carry/COMMIT)
D=.carry/data/imagenet
mkdir -p /tmp/kernels
timeout ${KERNELS_TIMEOUT:-200} python3 -c "import sys; from quantstudy.cli import main; sys.exit(main())" \
  bench kernels tf_efficientnet_lite0 --weights efficientnet-lite0 --data $D/val-1300 \
  --calib-data $D/calib-500 --class-list $D/classes.txt --calib 128 --heldout 128 \
  --device cuda --sources 0 --out /tmp/kernels/kernels.json "$@" 2>&1 | grep -v "━" \
  | tee $OUT/kernels.log
echo "kernels exit ${PIPESTATUS[0]}" | tee -a $OUT/kernels.log
cp /tmp/kernels/kernels.json $OUT/ 2>/dev/null
true
