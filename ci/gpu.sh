#!/usr/bin/env bash
# On a CUDA machine: build with CUDA (sm_90 unless CMAKE_ARGS says otherwise) into a build folder
# outside the source tree (kept, so a second run rebuilds only what changed), install, then
#   ci/gpu.sh [pytest args]        run the GPU-marked tests (e.g. ci/gpu.sh -k ffi)
#   ci/gpu.sh build                only build and install
#   ci/gpu.sh sanitize             compute-sanitizer over a short decode through the MoE cache's device lookup
#   ci/gpu.sh models               make the 30b-a3b synthetic model and its dense counterpart in /tmp if absent
#   ci/gpu.sh bench [bench args]   make the 30b-a3b synthetic model (and a dense one) in /tmp if absent, run the
#                                  bench matrix, write bench.md and bench.json to $PYLLAMA_MOE_BENCH_OUT
# Needs no network: the build uses the installed scikit-build-core and cffi.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
BUILD_DIR=${PYLLAMA_MOE_BUILD_DIR:-/tmp/build}
export CMAKE_ARGS="${CMAKE_ARGS:--DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90}"
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}

"$PY" scripts/vendor.py apply
start=$(date +%s)
"$PY" -m pip install --disable-pip-version-check --no-build-isolation --no-deps -q \
    -C build-dir="$BUILD_DIR" -C cmake.define.PYLLAMA_MOE_NATIVE_TESTS=ON .
echo "gpu.sh: build + install took $(( $(date +%s) - start )) s (build folder $BUILD_DIR)"

[ "${1:-}" = build ] && exit 0
make_models() {  # after the build: the writer takes its tokenizer from the vendored tree
    model=${PYLLAMA_MOE_BENCH_MODEL:-/tmp/30b-a3b.gguf}
    dense=${PYLLAMA_MOE_BENCH_DENSE:-/tmp/dense.gguf}
    [ -f "$model" ] || "$PY" -m pyllama_moe synth "$model" --preset 30b-a3b -q
    # the bench's dense model (bench.DENSE_SHAPE)
    [ -f "$dense" ] || "$PY" -c 'import sys; from pyllama_moe import bench; bench.write_model(sys.argv[1], "30b-a3b", dense=True)' "$dense"
}
if [ "${1:-}" = models ]; then
    make_models
    exit 0
fi
if [ "${1:-}" = sanitize ]; then
    # the device lookup, the prefetch and the seed under compute-sanitizer: plain CLOCK with the prefetch uploading
    # every expert, then the admission policy with the prefetch through the cache (the defaults); seeds checked
    export GGML_SCHED_PREFETCH_MIN_BATCH=1
    for opt in 0 1; do
        for arch in qwen3moe gpt-oss; do
            LLAMA_MOE_CACHE_ADMIT=$opt LLAMA_MOE_CACHE_PREFETCH=$opt LLAMA_MOE_CACHE_SEED_CHECK=1 \
                compute-sanitizer --tool memcheck --error-exitcode 3 "$PY" ci/sanitize_decode.py $arch
        done
    done
    exit 0
fi
start=$(date +%s)
if [ "${1:-}" = bench ]; then
    shift
    out=${PYLLAMA_MOE_BENCH_OUT:-/tmp}
    model=${PYLLAMA_MOE_BENCH_MODEL:-/tmp/30b-a3b.gguf}
    dense=${PYLLAMA_MOE_BENCH_DENSE:-/tmp/dense.gguf}
    "$PY" -m pyllama_moe bench "$model" --dense "$dense" --preset 30b-a3b --json "$out/bench.json" "$@" | tee "$out/bench.md"
    echo "gpu.sh: bench took $(( $(date +%s) - start )) s; table in $out/bench.md"
else
    "$PY" -m pytest -ra -p no:cacheprovider -m gpu tests "$@"
    echo "gpu.sh: GPU tests took $(( $(date +%s) - start )) s"
fi
