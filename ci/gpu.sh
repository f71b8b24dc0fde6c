#!/usr/bin/env bash
# On a CUDA machine: build with CUDA (sm_90 unless CMAKE_ARGS says otherwise) into a build folder
# outside the source tree (kept, so a second run rebuilds only what changed), install, then
#   ci/gpu.sh [pytest args]        run the GPU-marked tests (e.g. ci/gpu.sh -k ffi)
#   ci/gpu.sh build                only build and install
#   ci/gpu.sh wheel [pytest args]  build the CUDA wheel (ci/wheel.sh cuda, sm_90 unless PYLLAMA_MOE_CUDA_ARCHS says
#                                  otherwise), install it in a fresh venv with only its dependencies and run the GPU
#                                  tests there with the CUDA toolkit hidden (venv: /tmp/wheel/venv)
#   ci/gpu.sh sanitize             compute-sanitizer over a short decode through the MoE cache's device lookup (and
#                                  the hybrid decode's hand-off)
#   ci/gpu.sh sanitize-hybrid      only the hybrid decode's part of it, the CPU given every miss and none
#   ci/gpu.sh pristine             build upstream's llama-bench and llama-batched-bench from the pinned tree without
#                                  our patches into $PYLLAMA_MOE_PRISTINE_BUILD (/tmp/pristine), for bench --pristine
#   ci/gpu.sh models               make the 30b-a3b synthetic model and its dense counterpart in /tmp if absent
#   ci/gpu.sh bench [bench args]   make the 30b-a3b synthetic model (and a dense one) in /tmp if absent, run the
#                                  bench matrix, write bench.md and bench.json to $PYLLAMA_MOE_BENCH_OUT
#   ci/gpu.sh bench-predict [args] the bench with the prediction off (LLAMA_MOE_CACHE_PREDICT=0), at its default (2)
#                                  and at 8: caches of 10 / 25 / 50 / 80% of the experts, the misses predicted
#   ci/gpu.sh bench-hybrid [args]  the hybrid decode (#41): caches of 10 / 25 / 50 / 80% of the experts alone, with
#                                  moe_hybrid on and auto, beside cpu_moe and all on the GPU, through the Python API
#   ci/gpu.sh bench-draft [args]   the Python API's generation without a draft and with drafts of 4, 8 and 16 tokens
#                                  (prompt lookup, and the drafts all accepted and all rejected): all on the GPU and
#                                  caches of 25 / 50 / 80%
#   ci/gpu.sh loadtest [args]      the OpenAI server at --n_parallel 16 and 1 (1024 tokens of context per request),
#                                  caches of 50 / 80% and all on the GPU, under 1, 4 and 16 concurrent streaming
#                                  clients (python -m pyllama_moe loadtest); JSON in $PYLLAMA_MOE_BENCH_OUT
#   ci/gpu.sh warm-start [args]    the MoE cache's warm start (ci/warm_start.py): the first 32 and 128 tokens' hit rates
#                                  cold, warm and restored from the state file, caches of 25 / 50%
# The synthetic model's routing regime is $PYLLAMA_MOE_BENCH_ROUTING: realistic (the default), dispersed, uniform or
# collapsed;
# it is /tmp/30b-a3b-<regime>.gguf unless $PYLLAMA_MOE_BENCH_MODEL names another file.
# PYLLAMA_MOE_NO_BUILD=1 skips the build: the other modes then use what $PYTHON has installed (e.g. that venv).
# Needs no network: the build uses the installed scikit-build-core and cffi.
# One function per mode, dispatched at the end; wheel and pristine make their own builds.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
BUILD_DIR=${PYLLAMA_MOE_BUILD_DIR:-/tmp/build}
export CMAKE_ARGS="${CMAKE_ARGS:--DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90}"
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
routing=${PYLLAMA_MOE_BENCH_ROUTING:-realistic}
model=${PYLLAMA_MOE_BENCH_MODEL:-/tmp/30b-a3b-$routing.gguf}
dense=${PYLLAMA_MOE_BENCH_DENSE:-/tmp/dense.gguf}

build() {  # the patched tree, then the package and upstream's native test programs into $BUILD_DIR
    if [ -n "${PYLLAMA_MOE_NO_BUILD:-}" ]; then
        return 0
    fi
    "$PY" scripts/vendor.py apply
    local start
    start=$(date +%s)
    "$PY" -m pip install --disable-pip-version-check --no-build-isolation --no-deps -q \
        -C build-dir="$BUILD_DIR" -C cmake.define.PYLLAMA_MOE_NATIVE_TESTS=ON .
    echo "gpu.sh: build + install took $(( $(date +%s) - start )) s (build folder $BUILD_DIR)"
}

has_cuda_runtime() {  # has_cuda_runtime DIR: DIR holds a libcudart or a libcublas
    local f
    for f in "$1"/libcudart* "$1"/libcublas*; do
        [ -e "$f" ] && return 0
    done
    return 1
}

wheel() {
    # the CUDA wheel (ci/wheel.sh cuda) in a fresh venv holding only it and its dependencies, the GPU tests
    # run there with the CUDA toolkit hidden: the libraries must come from the driver and the nvidia-* packages
    local work=${PYLLAMA_MOE_WHEEL_WORK:-/tmp/wheel}
    local venv_py="$work/venv/bin/python"
    if [ -z "${PYLLAMA_MOE_NO_BUILD:-}" ]; then  # else: the tests again in the venv made before
        rm -rf "$work/dist" "$work/venv"
        PYLLAMA_MOE_WHEEL_OUT="$work/dist" PYLLAMA_MOE_NATIVE_TESTS_DIR="$work/native" PYLLAMA_MOE_BUILD_DIR="$BUILD_DIR-wheel" \
            PYLLAMA_MOE_CUDA_ARCHS=${PYLLAMA_MOE_CUDA_ARCHS:-90} bash ci/wheel.sh cuda --no-build-isolation
        local whl
        whl=$(ls "$work"/dist/pyllama_moe-*.whl)
        # no PyPI here: the dependencies are wheels of the installed copies, or carried in .whl
        "$PY" -m scripts.wheels_from_site --out "$work/deps" --have .whl --requires-of "$whl" pytest pyyaml requests tqdm >/dev/null
        local pip=("$venv_py" -m pip)
        if ! "$PY" -m venv "$work/venv"; then  # a Python without ensurepip: the outer pip installs into the venv
            "$PY" -m venv --clear --without-pip "$work/venv"
            pip=("$PY" -m pip --python "$venv_py")
        fi
        "${pip[@]}" install --disable-pip-version-check -q --no-index --find-links "$work/deps" --find-links .whl \
            "$whl" pytest gguf
        "${pip[@]}" list --disable-pip-version-check
    fi
    local site
    site=$("$venv_py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    ln -sfn "$site/nvidia" "$work/native/nvidia"  # the test programs' libggml-cuda finds them as the wheel's does
    # the toolkit (nvcc, its libcudart and cuBLAS) out of reach: a tmpfs over its folder in a mount namespace
    # of this command only; no LD_LIBRARY_PATH entry with a CUDA runtime, no toolkit on PATH
    local toolkit ld
    toolkit=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
    ld=$(tr ':' '\n' <<<"${LD_LIBRARY_PATH:-}" | while read -r d; do
        [ -n "$d" ] && ! has_cuda_runtime "$d" && printf '%s:' "$d"; done || true)
    export PYLLAMA_MOE_NATIVE_BIN="$work/native/pyllama_moe/bin" LD_LIBRARY_PATH="${ld%:}" PATH="$work/venv/bin:/usr/bin:/bin"
    local ns="unshare -m" hide="mount -t tmpfs none $toolkit && echo \"gpu.sh: $toolkit hidden\" && "
    unshare -m true 2>/dev/null || { ns="" hide=""; echo "gpu.sh: cannot hide $toolkit (no mount namespace)"; }
    cd tests
    $ns bash -c "$hide\"\$0\" ../ci/cuda_libs.py \"$site\" && \"\$0\" -m pytest -ra -p no:cacheprovider -m gpu . \"\$@\"" \
        "$venv_py" "$@"
}

pristine() {
    # upstream's own llama-bench and llama-batched-bench: the pinned tree without our patches (the vendored
    # repository's upstream tag), built as upstream documents a CUDA build (Release, GGML_NATIVE), for bench --pristine
    local out=${PYLLAMA_MOE_PRISTINE_BUILD:-/tmp/pristine}
    "$PY" scripts/vendor.py apply
    rm -rf "$out/src" && mkdir -p "$out/src"
    git -C vendor/llama.cpp archive upstream | tar -x -C "$out/src"
    local start
    start=$(date +%s)
    # shellcheck disable=SC2086  # the extra arguments are words
    cmake -S ci/pristine -B "$out/build" -G Ninja -DLLAMA_DIR="$out/src" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
        ${PYLLAMA_MOE_PRISTINE_CMAKE_ARGS:--DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90} >/dev/null
    cmake --build "$out/build" --target llama-bench llama-batched-bench -j "$CMAKE_BUILD_PARALLEL_LEVEL"
    echo "gpu.sh: pristine tools built in $(( $(date +%s) - start )) s: bench --pristine $out/build"
}

models() {  # after the build: the writer takes its tokenizer from the vendored tree
    [ -f "$model" ] || "$PY" -m pyllama_moe synth "$model" --preset 30b-a3b --routing "$routing" -q
    # the bench's dense model beside 30b-a3b (its DENSE_PRESETS): Qwen3-8B's shape
    [ -f "$dense" ] || "$PY" -m pyllama_moe synth "$dense" --preset 8b -q
}

sanitize() {
    # the device lookup, the prefetch and the seed under compute-sanitizer (sanitize_decode.py prefetches its small
    # prompts): the prefetch uploading every expert, then the prefetch through the cache (the default) with the
    # prediction's copies on their own stream
    local opt arch tool
    for opt in 0 1; do
        for arch in qwen3moe gpt-oss; do
            LLAMA_MOE_CACHE_PREFETCH=$opt LLAMA_MOE_CACHE_PREDICT=$opt \
                compute-sanitizer --tool memcheck --error-exitcode 3 "$PY" ci/sanitize_decode.py $arch
        done
    done
    # the prediction's scoring, lookups and copies: shared memory races and barriers; three layers ahead, whose
    # copies run on through the lookups between
    for tool in racecheck synccheck; do
        LLAMA_MOE_CACHE_PREDICT=2 compute-sanitizer --tool $tool --error-exitcode 3 "$PY" ci/sanitize_decode.py qwen3moe
    done
    for tool in memcheck racecheck synccheck; do
        LLAMA_MOE_CACHE_PREDICT=2:3 compute-sanitizer --tool $tool --error-exitcode 3 "$PY" ci/sanitize_decode.py qwen3moe 4 2
    done
    sanitize_hybrid
    # the op's sequences on the device (test-moe-cache-lookup: lookups, prefetches, predictions in one graph)
    local bin
    bin=$(cd /tmp && "$PY" -c 'import os, pyllama_moe; print(os.path.join(os.path.dirname(pyllama_moe.__file__), "bin"))')
    for tool in memcheck racecheck synccheck; do
        compute-sanitizer --tool $tool --error-exitcode 3 "$bin/test-moe-cache-lookup"
    done
}

sanitize_hybrid() {
    # the hybrid decode: the lookup writing the CPU's share and raising the hand-off's flags, the add waiting on them;
    # and with nothing for the CPU
    local share tool
    for share in 1.0 0; do
        for tool in memcheck racecheck synccheck; do
            echo "gpu.sh: the hybrid at the share $share under $tool"
            LLAMA_MOE_HYBRID=1 compute-sanitizer --tool $tool --error-exitcode 3 "$PY" \
                ci/sanitize_decode.py qwen3moe 2 1 $share
        done
    done
}

bench() {  # the bench writes the models itself where they are absent
    local start out=${PYLLAMA_MOE_BENCH_OUT:-/tmp}
    start=$(date +%s)
    "$PY" -m pyllama_moe bench "$model" --dense "$dense" --preset 30b-a3b --routing "$routing" --json "$out/bench.json" \
        "$@" | tee "$out/bench.md"
    echo "gpu.sh: bench took $(( $(date +%s) - start )) s; table in $out/bench.md"
}

bench_predict() {  # the bench with the prediction of the next MoE layer's experts at its default (2), off and at 8
    bench --setups cache-10,cache-25,cache-50,cache-80 --switch LLAMA_MOE_CACHE_PREDICT=0 \
        --switch LLAMA_MOE_CACHE_PREDICT=8 --pp 512 --ub 512 --tg 128 --no-native "$@"
}

bench_hybrid() {  # the CPU computing a share of the MoE cache's misses (#41), beside the cache alone and its two bounds
    local setups=gpu,cpu_moe-none f
    for f in 10 25 50 80; do setups="$setups,cache-$f,cache-$f-hybrid,cache-$f-auto"; done
    bench --setups "$setups" --pp 512 --ub 512 --tg 128 --no-native "$@"
}

bench_draft() {  # speculative decoding through the MoE cache (#45); no dense model: the bench itself, not bench()
    local out=${PYLLAMA_MOE_BENCH_OUT:-/tmp}
    "$PY" -m pyllama_moe bench "$model" --preset 30b-a3b --routing "$routing" --json "$out/draft.json" \
        --setups gpu,cache-80,cache-50,cache-25 --pp 512 --ub 512 --tg 64 --no-native --draft 4,8,16 --draft-bounds \
        "$@" | tee "$out/draft.md"
}

loadtest() {  # concurrent requests in one batch (#43): the server with parallel slots against one at a time
    local out=${PYLLAMA_MOE_BENCH_OUT:-/tmp} port=8123 npar name pid i
    [ -f "$model" ] || "$PY" -m pyllama_moe synth "$model" --preset 30b-a3b --routing "$routing" -q
    local c50 c80
    c50=$("$PY" -c "from pyllama_moe.gguf_info import GGUFInfo; print(int(GGUFInfo.read('$model').expert_bytes*0.5)>>20)")
    c80=$("$PY" -c "from pyllama_moe.gguf_info import GGUFInfo; print(int(GGUFInfo.read('$model').expert_bytes*0.8)>>20)")
    for npar in 16 1; do
        for name in cache-50 cache-80 gpu; do
            # flash attention as the bench and llama-batched-bench run (the server's default is llama-cpp-python's, off)
            local args=(--n_gpu_layers -1 --flash_attn true)
            [ "$name" = cache-50 ] && args+=(--cpu_moe true --load_mode none --moe_cache_mib "$c50")
            [ "$name" = cache-80 ] && args+=(--cpu_moe true --load_mode none --moe_cache_mib "$c80")
            # one request at a time as before (not interrupted by the next one), or 16 slots of the same context each
            [ "$npar" = 1 ] && args+=(--interrupt_requests false)
            "$PY" -m pyllama_moe.server --model "$model" --n_ctx $((1024 * npar)) --n_batch 512 --n_parallel "$npar" \
                --port "$port" --verbose false "${args[@]}" > "$out/server-$name-$npar.log" 2>&1 &
            pid=$!
            for i in $(seq 1 180); do
                "$PY" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=2)" \
                    >/dev/null 2>&1 && break
                sleep 1
            done
            echo "gpu.sh: loadtest $name --n_parallel $npar"
            "$PY" -m pyllama_moe loadtest "http://127.0.0.1:$port" --clients 1,4,16 --json "$out/load-$name-$npar.json" "$@" ||
                tail -20 "$out/server-$name-$npar.log"
            # the MoE cache's hit rate over the run (a load test's figure names it)
            "$PY" -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$port/metrics').read().decode())" \
                > "$out/metrics-$name-$npar.txt" 2>&1 || true
            kill "$pid"; wait "$pid" 2>/dev/null || true
        done
    done
}

warm_start() {  # the warm start from a state file against a cold and a warm cache (#46)
    local out=${PYLLAMA_MOE_BENCH_OUT:-/tmp}
    [ -f "$model" ] || "$PY" -m pyllama_moe synth "$model" --preset 30b-a3b --routing "$routing" -q
    "$PY" ci/warm_start.py "$model" --json "$out/warm-start.json" "$@"
}

tests() {  # the GPU-marked tests, with the arguments for pytest
    local start
    start=$(date +%s)
    "$PY" -m pytest -ra -p no:cacheprovider -m gpu tests "$@"
    echo "gpu.sh: GPU tests took $(( $(date +%s) - start )) s"
}

case "${1:-}" in
    wheel)    shift; wheel "$@" ;;
    pristine) pristine ;;
    build)    build ;;
    models)   build; models ;;
    sanitize) build; sanitize ;;
    sanitize-hybrid) build; sanitize_hybrid ;;
    bench)    shift; build; bench "$@" ;;
    bench-predict) shift; build; bench_predict "$@" ;;
    bench-hybrid) shift; build; bench_hybrid "$@" ;;
    bench-draft) shift; build; bench_draft "$@" ;;
    loadtest) shift; build; loadtest "$@" ;;
    warm-start) shift; build; warm_start "$@" ;;
    *)        build; tests "$@" ;;
esac
