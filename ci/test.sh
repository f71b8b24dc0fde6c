#!/usr/bin/env bash
# The test job (CI and README): make the vendored tree, build the CPU wheel, install it in a fresh virtual
# environment, run the tests there.
# Arguments go to pytest; CMAKE_ARGS adds CMake options to the build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

echo "== vendor: llama.cpp pin + patches/series"
"$PY" scripts/vendor.py apply
"$PY" scripts/vendor.py check

echo "== the CPU wheel (ci/wheel.sh cpu), with upstream's native test programs beside it"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
PYLLAMA_MOE_WHEEL_OUT="$tmp/dist" PYLLAMA_MOE_NATIVE_TESTS_DIR="$tmp/native" bash ci/wheel.sh cpu
export PYLLAMA_MOE_NATIVE_BIN="$tmp/native/pyllama_moe/bin"

echo "== a fresh virtual environment with the wheel and its test dependencies"
"$PY" -m venv "$tmp/venv"
VPY="$tmp/venv/bin/python"
"$VPY" -m pip install --disable-pip-version-check -q "$(ls "$tmp"/dist/pyllama_moe-*.whl)[test]"

echo "== patch series round trip (export reproduces patches/ byte for byte)"
"$PY" - "$tmp/series" <<'PY'
import sys
from pathlib import Path
from scripts import vendor
out = Path(sys.argv[1])
out.mkdir()
lay = vendor.Layout(vendor.Pin.load(vendor.DEFAULT_PIN), out, vendor.DEFAULT_DEST, vendor.DEFAULT_CACHE, quiet=True)
vendor.export(lay, stamp=False)
PY
diff -r patches "$tmp/series" || { echo "patches/ differs from an export of vendor/llama.cpp"; exit 1; }

echo "== types (mypy, pyproject.toml's [tool.mypy])"
"$VPY" -m mypy

echo "== tests"
# from the tests folder, so that the wheel's package, not the source folder, is imported
cd tests
"$VPY" -m pytest -ra -p no:cacheprovider . "$@"
