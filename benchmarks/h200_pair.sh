#!/usr/bin/env bash
# Two benchmarks/h200.sh processes side by side on an nvidia-h200-x2 (one per GPU), their
# outputs packed into one file: the device returns at most 8 files per call, and a kernel dump
# alone wrote more (call 16 lost two JSON records that way).
# Usage (repository root, on the GPU machine):
#   GPU0="stage ..." GPU1="stage ..." [BENCH0=...] [BENCH1=...] [LIMIT=540] bash benchmarks/h200_pair.sh
# BENCH0/BENCH1 become each process's BENCH_ARGS; LIMIT (s) bounds both. Writes $OUT/pair.tgz
# (g0/ and g1/: each process's $OUT) and $OUT/g0.txt, $OUT/g1.txt (their console output).
set -uo pipefail
OUT=${OUT:-/tmp/out}
LIMIT=${LIMIT:-540}
mkdir -p "$OUT/g0" "$OUT/g1"
OUT=$OUT/g0 SITE=/tmp/s0 CUDA_VISIBLE_DEVICES=0 BENCH_ARGS="${BENCH0:-}" \
  timeout "$LIMIT" bash benchmarks/h200.sh ${GPU0:-} > "$OUT/g0.txt" 2>&1 &
p0=$!
sleep 8  # the two pip installs and first imports do not collide
OUT=$OUT/g1 SITE=/tmp/s1 CUDA_VISIBLE_DEVICES=1 BENCH_ARGS="${BENCH1:-}" \
  timeout "$((LIMIT - 8))" bash benchmarks/h200.sh ${GPU1:-} > "$OUT/g1.txt" 2>&1
wait $p0
tar -C "$OUT" -czf "$OUT/pair.tgz" g0 g1 && rm -rf "$OUT/g0" "$OUT/g1"
for g in g0 g1; do
  echo "------ $g"
  grep -v "^E1\|^  [a-z_]* [0-9.]* ms" "$OUT/$g.txt" | tail -c 4000
done
