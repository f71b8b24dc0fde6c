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
from typing import Any

import numpy as np
import pytest

from pyllama_moe.ffi import lib
from pyllama_moe.gguf_info import GGUFInfo
from pyllama_moe.tools import synth

from fixtures.archs import EVICTS, HOLDS, MOE_ARCHS, check_switches, chunks, tiny
from fixtures.native import decode_chunks, model

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
        for device, predict in (("1", "0"), ("1", "2"), ("1", "8")):
            got, stats = chunks(monkeypatch, path, cache_bytes, device, predict)
            assert stats is not None
            what = f"{arch}: cache {cache_bytes >> 10} KiB, device {device}, predict {predict}"
            assert got.tobytes() == want.tobytes(), what


def one_by_one(monkeypatch: pytest.MonkeyPatch, path: Path, cache_bytes: int, sizes: list[int]) -> Any:
    monkeypatch.setenv("LLAMA_MOE_CACHE_DEVICE", "1")
    monkeypatch.setenv("LLAMA_MOE_CACHE_PREDICT", "2")
    with model(path, n_gpu_layers=-1, cpu_moe=True, load_mode=lib.LLAMA_LOAD_MODE_NONE) as m:
        tokens = [int(t) for t in np.random.default_rng(1).integers(100, 1000, 192)]
        _, stats = decode_chunks(m, tokens, sizes, moe_cache_size=cache_bytes)
    assert stats is not None
    return stats


@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_prediction_after_device_lookups_only_and_better_than_a_guess(monkeypatch: pytest.MonkeyPatch,
                                                                     tmp_path: Path, arch: str) -> None:
    path = tiny(tmp_path, arch, n_layer=4)  # two MoE layers at least (llama4's are every other one)
    info = GGUFInfo.read(path)
    # half the experts: a token's lookup pins its experts, and the next layer's predicted ones find free slots
    cache_bytes = info.expert_bytes // 2
    # ubatches of 64 tokens: the host LRU serves them all, so nothing is predicted
    large = one_by_one(monkeypatch, path, cache_bytes, [64])
    assert large.hits_device + large.misses_device == 0 and large.n_predicted == 0, arch
    # one token a step: device lookups, and predictions for the next MoE layer
    st = one_by_one(monkeypatch, path, cache_bytes, [1])
    assert st.hits_device + st.misses_device > 0, arch
    assert st.n_predicted > 0, arch
    # a guess among the experts would be used about n_expert_used / n_expert of the time; the router's ranking on the
    # layer before's input is used more (a gating unlike build_moe_ffn's ranks them otherwise)
    n_expert, n_used = int(info.expert_count or 0), int(info.meta[f"{info.arch}.expert_used_count"])
    used = st.n_predicted_used / st.n_predicted
    print(f"{arch}: {st.n_predicted} predicted, {used:.1%} used (a guess: {n_used / n_expert:.1%})")
    assert used > n_used / n_expert, (arch, used, n_used, n_expert)
