"""On a GPU: every MoE architecture synth writes, through the MoE cache's lookup paths and switches (#42). The host
LRU, the device lookup, the prediction off and at 2 and 8 copies, the seed and the large ubatch's prefetch through the
cache off, a cache that evicts at every step and one that holds every expert: the same greedy tokens and logits, byte
for byte, after a prompt longer than the device lookup's 32 tokens (the host path, the seed) and over decode steps of
one token. The experts per layer vary over 60, 64, 128, 160, 256 and 384 (not all multiples of 32)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pyllama_moe.ffi import lib
from pyllama_moe.tools import synth

from fixtures.native import greedy, model

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
