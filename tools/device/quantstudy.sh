#!/bin/bash
# One `quantstudy` command on a GPU machine, from the repository root:
#   bash tools/device/quantstudy.sh NAME ARGS...
# runs `quantstudy ARGS...` under `timeout ${TIMEOUT:-540}` with the carried wheels (env.sh),
# keeps its console without progress bars in $OUT/NAME.log, and copies the paths named in
# $COLLECT (space-separated) to $OUT: a study's own folder also holds its stage cache and lock,
# which need not come back. Exit status: the command's.
set -o pipefail
name=$1; shift
source tools/device/env.sh
timeout ${TIMEOUT:-540} python3 -c "import sys; from quantstudy.cli import main; sys.exit(main())" \
  "$@" 2>&1 | grep -v "━" | tee $OUT/$name.log
status=${PIPESTATUS[0]}
echo "$name exit $status" | tee -a $OUT/$name.log
for f in $COLLECT; do cp -r "$f" $OUT/ 2>/dev/null || echo "not written: $f"; done
exit $status
