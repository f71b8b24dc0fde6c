#!/usr/bin/env bash
# The test job (CI and README): make the vendored tree, build and install the package, run the tests.
# Arguments go to pytest. CPU-only unless CMAKE_ARGS says otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

echo "== vendor: llama.cpp pin + patches/series"
"$PY" scripts/vendor.py apply
"$PY" scripts/vendor.py check

echo "== build and install (pyllama-moe + patched llama.cpp)"
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
start=$(date +%s)
"$PY" -m pip install --disable-pip-version-check -q -C cmake.define.PYLLAMA_MOE_NATIVE_TESTS=ON ".[test]"
echo "build + install: $(( $(date +%s) - start )) s"

echo "== patch series round trip (export reproduces patches/ byte for byte)"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PY" - "$tmp" <<'PY'
import sys
from pathlib import Path
from scripts import vendor
out = Path(sys.argv[1])
lay = vendor.Layout(vendor.Pin.load(vendor.DEFAULT_PIN), out, vendor.DEFAULT_DEST, vendor.DEFAULT_CACHE, quiet=True)
vendor.export(lay, stamp=False)
PY
diff -r patches "$tmp" || { echo "patches/ differs from an export of vendor/llama.cpp"; exit 1; }

echo "== tests"
# run from the tests folder so that the installed package, not the source folder, is imported
"$PY" -m pytest -ra -p no:cacheprovider tests "$@"
