"""On a GPU: every MoE architecture synth writes, through the MoE cache's lookup paths and switches (#42). The host
LRU, the device lookup, the prediction off and at 2 and 8 copies, the seed and the large ubatch's prefetch through the
cache off, a cache that evicts at every step and one that holds every expert: the same greedy tokens and logits, byte
for byte, after a prompt longer than the device lookup's 32 tokens (the host path, the seed) and over decode steps of
one token, and over decode ubatches of 1, 2, 8, 9 and 32 tokens in turn. The experts per layer vary over 60, 64,
128, 160, 256 and 384 (not all multiples of 32). On every architecture the prediction of the next MoE layer's experts
is made after device lookups only (none in a ubatch the host LRU serves), and what it copies is used far more often
than a guess would be (it ranks the experts as the layer's router does)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pyllama_moe.gguf_info import GGUFInfo
from pyllama_moe.tools import synth

from fixtures.archs import EVICTS, HOLDS, MOE_ARCHS, check_prediction, check_switches, chunks, tiny

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_architecture_identical_across_switches(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, arch: str) -> None:
    check_switches(monkeypatch, tiny(tmp_path, arch))


@pytest.mark.parametrize("n_expert", [60, 64, 128, 160, 256, 384])
def test_expert_counts_identical_across_switches(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                 n_expert: int) -> None:
    path = synth.write_model(tmp_path / f"qwen3moe-{n_expert}.gguf", "tiny", arch="qwen3moe", skew=1.0, seed=9,
                             n_expert=n_expert, n_expert_used=8)
    check_switches(monkeypatch, path)


@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_architecture_ubatches_of_1_to_32_identical(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                    arch: str) -> None:
    path = tiny(tmp_path, arch)
    half = GGUFInfo.read(path).expert_bytes // 2
    for cache_bytes in (EVICTS, half, HOLDS):
        want, _ = chunks(monkeypatch, path, cache_bytes, "0", "0")
        assert np.isfinite(want).all()
        for device, predict in (("1", "0"), ("1", "2"), ("1", "8"), ("1", "2:3")):
            got, stats = chunks(monkeypatch, path, cache_bytes, device, predict)
            assert stats is not None
            what = f"{arch}: cache {cache_bytes >> 10} KiB, device {device}, predict {predict}"
            assert got.tobytes() == want.tobytes(), what


@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_prediction_after_device_lookups_only_and_better_than_a_guess(monkeypatch: pytest.MonkeyPatch,
                                                                     tmp_path: Path, arch: str) -> None:
    check_prediction(monkeypatch, tmp_path, arch)
