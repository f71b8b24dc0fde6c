"""The MoE cache's device lookups over every MoE architecture synth writes, without a GPU (#42):
``LLAMA_MOE_CACHE_CPU=1`` lets the CPU stand for the device, the lookup op's CPU reference serving the decode steps.
The GPU's matrix (tests/gpu/test_architectures.py) on the CPU: the host path (the model's own experts there), the device
lookups, the switches, caches that evict at every step, hold half or all of the experts, decode ubatches of 1 to 32
tokens in turn, with the prediction of the next MoE layer's experts off and at 2: the same tokens and logits byte for
byte; and the prediction made after device lookups only, used more often than a guess."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from pyllama_moe.gguf_info import GGUFInfo

from fixtures.archs import EVICTS, HOLDS, MOE_ARCHS, check_prediction, check_switches, chunks, tiny


@pytest.fixture(autouse=True)
def cpu_device(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("LLAMA_MOE_CACHE_CPU", "1")
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
