# Sourced by the device scripts of this folder (run from the repository root, where the working
# tree arrives): installs the carried wheels, points Python at src/ and writes $OUT/gpu.txt
# (GPU, driver, versions, commit), so every result names the machine and code that made it.
# The carried folder, .carry/ (see README.md): .carry/whl/*.whl, .carry/COMMIT, .carry/data/imagenet/...
# The wheels go under $TMPDIR (default /tmp): jobs run side by side by batch.py each have their
# own, since `pip install --upgrade --target` replaces the packages another job is importing.
site=${TMPDIR:-/tmp}/site
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" \
  .carry/whl/*.whl || exit 1
export PYTHONPATH=src:$site PYTHONUNBUFFERED=1
[ -f .carry/COMMIT ] && export QUANTSTUDY_GIT_COMMIT=$(cat .carry/COMMIT)
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv
  python3 -c "import torch, triton, timm; print(torch.__version__, torch.version.cuda, triton.__version__, timm.__version__)"
  echo "commit ${QUANTSTUDY_GIT_COMMIT:-unknown}"; } > $OUT/gpu.txt 2>&1
cat $OUT/gpu.txt
