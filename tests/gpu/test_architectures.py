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

from fixtures.native import decode_chunks, greedy, model

pytestmark = pytest.mark.gpu
PROMPT = " ".join(["The quick brown fox jumps over the lazy dog"] * 5)  # more than 32 tokens
MOE_ARCHS = list(synth.MOE_ARCHITECTURES)
EVICTS, HOLDS = 48 << 10, 16 << 20  # a handful of the tiny experts' slots, and all of them

# (LLAMA_MOE_CACHE_DEVICE, LLAMA_MOE_CACHE_PREDICT, other switches) beside the host LRU without a prediction
VARIANTS = [
    ("1", "0", {}),
    ("1", "2", {}),
    ("1", "8", {}),
    ("1", "2", {"LLAMA_MOE_CACHE_SEED": "0"}),
    ("1", "2", {"LLAMA_MOE_CACHE_PREFETCH": "0"}),
    ("0", "2", {}),  # the prediction is made only after a device lookup: nothing changes on the host path
]


def run(monkeypatch: pytest.MonkeyPatch, path: Path, cache_bytes: int, device: str, predict: str,
        env: dict[str, str]) -> tuple[list[int], np.ndarray]:
    for k in ("LLAMA_MOE_CACHE_SEED", "LLAMA_MOE_CACHE_PREFETCH"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("LLAMA_MOE_CACHE_DEVICE", device)
    monkeypatch.setenv("LLAMA_MOE_CACHE_PREDICT", predict)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with model(path, n_gpu_layers=-1, cpu_moe=True, load_mode=lib.LLAMA_LOAD_MODE_NONE) as m:
        return greedy(m, PROMPT, 16, moe_cache_size=cache_bytes)


def check_switches(monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
    for cache_bytes in (EVICTS, HOLDS):
        want_tokens, want_logits = run(monkeypatch, path, cache_bytes, "0", "0", {})
        assert np.isfinite(want_logits).all()
        for device, predict, env in VARIANTS:
            tokens, logits = run(monkeypatch, path, cache_bytes, device, predict, env)
            what = f"{path.stem}: cache {cache_bytes >> 10} KiB, device {device}, predict {predict}, {env}"
            assert tokens == want_tokens, what
            assert logits.tobytes() == want_logits.tobytes(), what


@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_architecture_identical_across_switches(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, arch: str) -> None:
    # skewed routing (a few hot experts) where synth writes it, uniform otherwise
    skew = 1.0 if arch in ("qwen3moe", "gpt-oss") else 0.0
    path = synth.write_model(tmp_path / f"{arch}.gguf", "tiny", arch=arch, skew=skew, seed=9)
    check_switches(monkeypatch, path)


@pytest.mark.parametrize("n_expert", [60, 64, 128, 160, 256, 384])
def test_expert_counts_identical_across_switches(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                 n_expert: int) -> None:
    path = synth.write_model(tmp_path / f"qwen3moe-{n_expert}.gguf", "tiny", arch="qwen3moe", skew=1.0, seed=9,
                             n_expert=n_expert, n_expert_used=8)
    check_switches(monkeypatch, path)


SIZES = [1, 2, 8, 9, 32]  # decode ubatches in turn: within the device lookup's 32 tokens where the cache allows


def tiny(tmp_path: Path, arch: str) -> Path:
    # skewed routing (a few hot experts) where synth writes it, uniform otherwise
    skew = 1.0 if arch in ("qwen3moe", "gpt-oss") else 0.0
    return synth.write_model(tmp_path / f"{arch}.gguf", "tiny", arch=arch, skew=skew, seed=9)


def chunks(monkeypatch: pytest.MonkeyPatch, path: Path, cache_bytes: int, device: str,
           predict: str) -> tuple[np.ndarray, Any]:
    monkeypatch.setenv("LLAMA_MOE_CACHE_DEVICE", device)
    monkeypatch.setenv("LLAMA_MOE_CACHE_PREDICT", predict)
    with model(path, n_gpu_layers=-1, cpu_moe=True, load_mode=lib.LLAMA_LOAD_MODE_NONE) as m:
        from pyllama_moe.ffi import ffi

        vocab = lib.llama_model_get_vocab(m)
        text = (PROMPT * 4).encode()
        buf = ffi.new("llama_token[]", 1024)
        n = lib.llama_tokenize(vocab, text, len(text), buf, 1024, True, False)
        assert n > 100
        return decode_chunks(m, list(buf[0:n]), SIZES, moe_cache_size=cache_bytes)


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
    path = tiny(tmp_path, arch)
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
