#!/bin/bash
# The GPU tests on a GPU machine, from the repository root:
#   bash tools/device/gpu_tests.sh [PYTEST ARGS...]   (default: tests/gpu)
# with the carried wheels (env.sh); the last 40 lines of pytest's output go to $OUT/gpu-tests.log.
set -o pipefail
source tools/device/env.sh
[ $# -gt 0 ] || set -- tests/gpu
timeout ${TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider "$@" 2>&1 \
  | tail -40 | tee $OUT/gpu-tests.log
status=${PIPESTATUS[0]}
echo "pytest exit $status" | tee -a $OUT/gpu-tests.log
exit $status
