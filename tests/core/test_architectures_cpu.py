"""The MoE cache's device lookups over every MoE architecture synth writes, without a GPU (#42):
``moe_cache_cpu`` lets the CPU stand for the device, the lookup op's CPU reference serving the decode steps.
The GPU's matrix (tests/gpu/test_architectures.py) on the CPU: the host path (the model's own experts there), the device
lookups, the switches, caches that evict at every step, hold half or all of the experts, decode ubatches of 1 to 32
tokens in turn, with the prediction of the next MoE layer's experts off and at 2: the same tokens and logits byte for
byte; the prediction made after device lookups only, used more often than a guess; and the hybrid decode (#41)
taking every miss it can beside the prediction, byte for byte too (the same kernels on both sides here)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from pyllama_moe.gguf_info import GGUFInfo

from fixtures.archs import EVICTS, HOLDS, MOE_ARCHS, check_prediction, check_switches, chunks, tiny
from fixtures.native import context_fields


@pytest.fixture(autouse=True)
def cpu_device(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    context_fields(monkeypatch, moe_cache_cpu=True)
    yield


@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_architecture_on_the_cpu_device(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, arch: str) -> None:
    path = tiny(tmp_path, arch)
    check_switches(monkeypatch, path)
    half = GGUFInfo.read(path).expert_bytes // 2
    for cache_bytes in (EVICTS, half, HOLDS):
        want, _ = chunks(monkeypatch, path, cache_bytes, "0", "0")
        assert np.isfinite(want).all()
        for predict in ("0", "2"):
            got, stats = chunks(monkeypatch, path, cache_bytes, "1", predict)
            assert stats is not None
            if cache_bytes != HOLDS:  # a cache that holds every expert is not looked up
                assert stats.hits_device + stats.misses_device > 0, (arch, cache_bytes)  # the device lookups ran
            assert got.tobytes() == want.tobytes(), (arch, cache_bytes, predict)


@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_prediction_on_the_cpu_device(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, arch: str) -> None:
    check_prediction(monkeypatch, tmp_path, arch)


# the experts the CPU's part of the hybrid decode cannot compute: build_moe_ffn's forms it leaves to the upload
HYBRID_UPLOADS = {"llama4": "the router's weights before the experts"}


@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_hybrid_on_the_cpu_device(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, arch: str) -> None:
    # the CPU forced to take every miss it can (up to its most a layer), beside the prediction: on the CPU device both
    # parts run the same kernels, so the logits are the cache alone's byte for byte; the layers whose experts the CPU's
    # graph has no form for keep the upload
    path = tiny(tmp_path, arch)
    half = GGUFInfo.read(path).expert_bytes // 2
    monkeypatch.delenv("LLAMA_MOE_HYBRID", raising=False)
    want, _ = chunks(monkeypatch, path, half, "1", "2")
    monkeypatch.setenv("LLAMA_MOE_HYBRID", "1")
    context_fields(monkeypatch, moe_hybrid_share=1.0)
    got, stats = chunks(monkeypatch, path, half, "1", "2")
    assert stats is not None and stats.host_max > 0, arch
    if arch in HYBRID_UPLOADS:
        assert stats.n_host == 0, (arch, stats)
    else:
        assert stats.n_host > 0 and stats.n_host_calls > 0, (arch, stats)
    assert got.tobytes() == want.tobytes(), arch
