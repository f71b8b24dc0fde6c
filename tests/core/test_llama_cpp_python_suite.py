"""llama-cpp-python 0.3.36's own model-free tests, run against pyllama_moe through an import alias (#31).

Its sdist is fetched from PyPI with pip (checked against a pinned sha256) into the user's cache once. Only its
``tests/`` are used: ``test_llama_speculative.py``, ``test_llama_grammar.py`` and ``test_llama_chat_format.py`` run
unchanged in a child pytest whose ``conftest.py`` makes ``import llama_cpp`` (and ``llama_cpp.<module>``) import
pyllama_moe. Where PyPI cannot be reached the test skips, saying so (in CI it fails: CI installs from PyPI, so it
can)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest

VERSION = "0.3.36"
SDIST = f"llama_cpp_python-{VERSION}.tar.gz"
SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
MODEL_FREE = ("test_llama_speculative.py", "test_llama_grammar.py", "test_llama_chat_format.py")
ALIAS = '''
import importlib, sys
import pyllama_moe
sys.modules["llama_cpp"] = pyllama_moe
for name in ("llama_types", "llama_chat_format", "llama_grammar", "llama_speculative", "llama_cache",
             "llama_tokenizer", "llama_cpp"):
    sys.modules["llama_cpp." + name] = importlib.import_module("pyllama_moe." + name)
'''


def _suite() -> Path:
    """The tests folder of llama-cpp-python's sdist, fetched with pip (as scripts/vendor.py fetches ours), checked
    against its sha256 and unpacked into the cache folder once."""
    from pyllama_moe.tools.demo import cache_dir

    out = cache_dir() / f"llama-cpp-python-{VERSION}-tests"
    if all((out / name).is_file() for name in MODEL_FREE):
        return out
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--no-build-isolation",
               "--disable-pip-version-check", "-q", "-d", tmp, f"llama-cpp-python=={VERSION}"]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        got = Path(tmp) / SDIST
        if not got.exists():  # metadata without isolation fails where the build backend is missing
            cmd.remove("--no-build-isolation")
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if not got.exists():
            raise RuntimeError(f"pip download failed: {res.stderr.strip()[-500:]}")
        if hashlib.sha256(got.read_bytes()).hexdigest() != SHA256:
            raise RuntimeError(f"{SDIST}: its sha256 is not the one this test pins")
        out.mkdir(parents=True, exist_ok=True)
        with tarfile.open(got) as tar:
            for m in tar.getmembers():
                if m.isfile() and Path(m.name).parent.name == "tests" and m.name.endswith(".py"):
                    f = tar.extractfile(m)
                    assert f is not None
                    (out / Path(m.name).name).write_bytes(f.read())
    return out


def test_model_free_tests_pass_through_the_alias(tmp_path: Path) -> None:
    pytest.importorskip("jinja2")
    try:
        suite = _suite()
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as e:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"llama-cpp-python {VERSION}'s sdist cannot be had from PyPI here: {e}")
    for name in MODEL_FREE:
        (tmp_path / name).write_bytes((suite / name).read_bytes())
    (tmp_path / "conftest.py").write_text(ALIAS)
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA", str(tmp_path)],
                         capture_output=True, text=True, cwd=tmp_path, timeout=600)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    passed = [ln for ln in out.splitlines() if ln.startswith("PASSED ")]
    # every test of the three files ran and passed: 1 + 3 + 2
    assert len(passed) == 6, out[-4000:]
