#!/bin/sh
# Build run_package against the libtorch inside the installed torch wheel: one compiler command.
# usage: PYTHON=python3 ./build.sh [OUTPUT]   (CUDA libraries are linked when torch has them)
set -eu
PYTHON=${PYTHON:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${1:-$HERE/run_package}
eval "$("$PYTHON" - <<'PY'
import os, torch
from torch.utils.cpp_extension import include_paths, library_paths
lib = library_paths()[0]
libs = "-ltorch -ltorch_cpu -lc10"
if torch.cuda.is_available() or os.path.exists(os.path.join(lib, "libtorch_cuda.so")):
    libs += " -ltorch_cuda -lc10_cuda"
print(f'INCLUDES="{" ".join("-I" + p for p in include_paths())}"')
print(f'LIB="{lib}"')
print(f'LIBS="{libs}"')
print(f'ABI="{int(torch.compiled_with_cxx11_abi())}"')
PY
)"
# shellcheck disable=SC2086
${CXX:-g++} -std=c++20 -O1 -D_GLIBCXX_USE_CXX11_ABI="$ABI" $INCLUDES "$HERE/main.cpp" \
  -o "$OUT" -L"$LIB" -Wl,--no-as-needed $LIBS -Wl,-rpath,"$LIB"
echo "$OUT"
