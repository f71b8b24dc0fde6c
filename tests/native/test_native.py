"""Upstream's native tests of the allocator/scheduler and the ops, built from the patched tree
(-DPYLLAMA_MOE_NATIVE_TESTS=ON, as ci/test.sh and ci/gpu.sh build)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from pyllama_moe import backend


def binary(name: str) -> Path:
    from pyllama_moe.tools import bench

    # a wheel ships none of them: ci/wheel.sh builds them into a folder of their own
    folder = os.environ.get("PYLLAMA_MOE_NATIVE_BIN")
    if folder:
        return Path(folder) / name
    try:
        return bench.tool_path(name)
    except FileNotFoundError:
        if os.environ.get("CI"):
            raise  # CI builds them: missing is a failure there
        pytest.skip(f"{name} not built (pip install -C cmake.define.PYLLAMA_MOE_NATIVE_TESTS=ON .)")


def run(name: str, *args: str) -> str:
    # as upstream's CI: a scheduler that reallocates a graph whose size did not change aborts
    env = {**os.environ, "GGML_SCHED_DEBUG_REALLOC": "1"}
    res = subprocess.run([str(binary(name)), *args], capture_output=True, text=True, timeout=600, env=env)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    return out


def test_alloc() -> None:
    out = run("test-alloc")
    assert "PASSED" in out and "FAILED" not in out


def test_moe_cache_lookup_reference() -> None:
    # the CPU reference of GGML_OP_MOE_CACHE_LOOKUP against a model of the cache and its invariants
    out = run("test-moe-cache-lookup")
    assert out.strip().endswith("OK"), out[-2000:]


def test_copy_regions_semantics() -> None:
    # ggml_backend_tensor_copy_regions_async on CPU buffers against a byte-by-byte reference (patch 0012)
    out = run("test-copy-regions")
    # stdout ends with OK; on a GPU machine the CUDA backend's device lines on stderr come after it
    assert "OK" in out.splitlines() and "checks failed" not in out, out[-2000:]


def test_moe_cache_copy_of_mapped_experts() -> None:
    # llama_moe_cache_copy_host: the data is copied into one anonymous buffer the cache owns, aligned, the model's
    # tensors stay where they are; and the fit rule (a margin of max(2 GiB, 1/16))
    out = run("test-moe-cache-copy")
    assert out.strip().endswith("OK"), out[-2000:]


def test_moe_hybrid_cpu_part() -> None:
    # the CPU's part of hybrid MoE decode (patch 0025): the weighted sum of the selections left to the CPU, computed
    # from q4_0 host experts, against the experts computed in float from their dequantized weights
    out = run("test-moe-hybrid")
    assert "OK" in out.splitlines(), out[-2000:]


def test_moe_cache_lru() -> None:
    # the MoE cache's host LRU: random plans, the seed's admits (slots refused, fewer slots than misses) and its
    # rollback's drops keep the slot list and the slot maps consistent; admit never gives one slot twice
    out = run("test-moe-cache-lru")
    assert out.strip().endswith("OK"), out[-2000:]


@pytest.mark.gpu
def test_copy_regions_on_the_gpu() -> None:
    # patch 0012 on the GPU: random region sets from device and pinned host memory into device memory, byte for byte,
    # on a fresh instance (the prefetch copy queue) and on one that computed
    # a graph (the copy kernel); CUDA >= 12.8 batches every set
    out = run("test-copy-regions")
    lines = [ln for ln in out.splitlines() if ln.startswith("copy regions on ")]
    assert len(lines) >= 2 and all(ln.endswith("30 of 30 sets batched") for ln in lines), out[-2000:]
    # stdout ends with OK, the CUDA backend's device lines on stderr come after it
    assert "OK" in out.splitlines(), out[-2000:]


def test_moe_cache_lookup_cpu_backend() -> None:
    # test-backend-ops builds the op's cases (side effects included) and runs them on the CPU
    out = run("test-backend-ops", "-o", "MOE_CACHE_LOOKUP", "-b", "CPU")
    assert "FAIL" not in out and "OK" in out, out[-2000:]


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["MUL_MAT_ID", "GET_ROWS", "CPY", "MOE_CACHE_LOOKUP"])
def test_backend_ops_on_the_gpu(op: str) -> None:
    gpu = next(d.name for d in backend.devices() if d.type == "gpu")
    out = run("test-backend-ops", "-o", op, "-b", gpu)
    assert f"{op}(" in out, out[-2000:]  # the op was compared with the CPU, case by case
    assert "FAIL" not in out
