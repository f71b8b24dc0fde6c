"""Upstream's native tests of the allocator/scheduler and the ops, built from the patched tree
(-DPYLLAMA_MOE_NATIVE_TESTS=ON, as ci/test.sh and ci/gpu.sh build)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from pyllama_moe import backend


def binary(name: str) -> Path:
    from pyllama_moe import bench

    try:
        return bench.tool_path(name)
    except FileNotFoundError:
        if os.environ.get("CI"):
            raise  # CI builds them: missing is a failure there
        pytest.skip(f"{name} not built (pip install -C cmake.define.PYLLAMA_MOE_NATIVE_TESTS=ON .)")


def run(name: str, *args: str) -> str:
    res = subprocess.run([str(binary(name)), *args], capture_output=True, text=True, timeout=600)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    return out


def test_alloc() -> None:
    out = run("test-alloc")
    assert "PASSED" in out and "FAILED" not in out


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["MUL_MAT_ID", "GET_ROWS", "CPY"])
def test_backend_ops_on_the_gpu(op: str) -> None:
    gpu = next(d.name for d in backend.devices() if d.type == "gpu")
    out = run("test-backend-ops", "-o", op, "-b", gpu)
    assert f"{op}(" in out, out[-2000:]  # the op was compared with the CPU, case by case
    assert "FAIL" not in out
