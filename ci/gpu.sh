#!/usr/bin/env bash
# On a CUDA machine: build with CUDA (sm_90 unless CMAKE_ARGS says otherwise) into a build folder
# outside the source tree (kept, so a second run rebuilds only what changed), install, run the
# GPU-marked tests. Needs no network: the build uses the installed scikit-build-core and cffi.
#   ci/gpu.sh [pytest args]     e.g. ci/gpu.sh -k ffi
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
BUILD_DIR=${PYLLAMA_MOE_BUILD_DIR:-/tmp/build}
export CMAKE_ARGS="${CMAKE_ARGS:--DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90} -DPYLLAMA_MOE_TOOLS=ON"
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}

"$PY" scripts/vendor.py apply
start=$(date +%s)
"$PY" -m pip install --disable-pip-version-check --no-build-isolation --no-deps -q \
    -C build-dir="$BUILD_DIR" .
echo "gpu.sh: build + install took $(( $(date +%s) - start )) s (build folder $BUILD_DIR)"

start=$(date +%s)
"$PY" -m pytest -ra -p no:cacheprovider -m gpu tests "$@"
echo "gpu.sh: GPU tests took $(( $(date +%s) - start )) s"
