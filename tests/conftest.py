"""The report header names the build under test (series, backends, devices); GPU tests skip without a GPU.

``PYLLAMA_MOE_GPU_TESTS_ON_CPU=1`` runs them without one, the CPU standing for the MoE cache's device
(``PYLLAMA_MOE_CACHE_CPU=1``: every context is made with ``moe_cache_cpu``): a dry run of a GPU window's tests
(their fixtures, their expectations of the device lookups, the prediction and the hybrid decode). Tests of the host
path's counts (small and large lookups, seeds, prefetch staging) fail there by design: the CPU device's host lookups
read the host experts without the cache.

The shared fixtures and helpers are the ``fixtures`` package beside this file, loaded as plugins. This folder has
no ``__init__.py``: pytest's default import mode (prepend) puts it first on ``sys.path`` when it imports this file,
so ``fixtures`` is importable, and each test file's own folder too (test file names are unique across folders).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# scripts.vendor and scripts.wheel_variant. Last, so an installed pyllama_moe wins (ci/test.sh tests the wheel
# from the tests folder); run from the repository root, the source folder comes first and takes its compiled
# parts from the installed copy
sys.path.append(str(REPO))

pytest_plugins = ["fixtures.models", "fixtures.native"]

GPU_TESTS_ON_CPU = os.environ.get("PYLLAMA_MOE_GPU_TESTS_ON_CPU") == "1"
if GPU_TESTS_ON_CPU:
    os.environ["PYLLAMA_MOE_CACHE_CPU"] = "1"


def _native() -> bool:
    try:
        import pyllama_moe._cffi  # noqa: F401
    except ImportError:
        return False
    return True


def pytest_report_header(config: pytest.Config) -> list[str]:
    if not _native():
        return ["pyllama_moe: native part NOT built"]
    import pyllama_moe
    from pyllama_moe import backend

    lines = [f"pyllama_moe {pyllama_moe.__version__} from {Path(pyllama_moe.__file__).parent}"]
    lines.append("llama.cpp: " + backend.system_info().strip())
    for d in backend.devices():
        lines.append(f"device {d.index}: {d.name} ({d.type}) {d.description}, {d.memory_total >> 20} MiB")
    return lines


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu = False
    if _native():
        from pyllama_moe import backend

        gpu = backend.gpu_available()
    if gpu or GPU_TESTS_ON_CPU:
        return
    skip = pytest.mark.skip(reason="no GPU device: run with ci/gpu.sh on a CUDA machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
