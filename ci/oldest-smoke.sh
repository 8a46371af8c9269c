#!/usr/bin/env bash
# The oldest supported combination end to end (`make test-oldest` runs it after the fast tier):
# a small CPU study with per-row activation scales, and a default-recipe study exported and
# checked on onnxruntime (`export --check`). Random-weight timm test_efficientnet on real
# ImageNet images: minutes on 2 cores, no download.
#   usage: ci/oldest-smoke.sh PYTHON DATA_FOLDER
set -euo pipefail
PY=${1:?python of the venv}
DATA=${2:?ImageNet-style folder}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
run() { "$PY" -m quantstudy.cli "$@"; }
study() {  # a finished study exits 0 (ship), 3 (not ship) or 4 (inconclusive: random weights)
    local out=$1 rc=0
    shift
    run run test_efficientnet --weights random --device cpu --calib 8 --heldout 16 --no-speed \
        --data "$DATA" --out "$out" "$@" || rc=$?
    if [[ $rc != 0 && $rc != 3 && $rc != 4 ]] || [[ ! -f $out/study.json ]]; then
        echo "oldest smoke: the study in $out did not finish (exit $rc)" >&2
        exit 1
    fi
}
study "$OUT/rows" --recipe ci/recipes/generic_pointwise_rows.yaml
grep -q '"activation_granularity": "per_row"' "$OUT/rows/study.json"
study "$OUT/default"
run export "$OUT/default" --check
echo "oldest smoke: per-row study, default study and export --check passed"
