"""The CUDA build on a GPU: the tiny MoE model runs all on the GPU and with its experts in host memory,
with and without upstream's MoE cache, and agrees with the CPU."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pyllama_moe.ffi import lib

from native_helpers import greedy, model

pytestmark = pytest.mark.gpu
PROMPT = "The quick brown fox jumps over the lazy dog"
LONG_PROMPT = " ".join([PROMPT] * 6)  # more than 32 tokens: a large batch, its MoE runs on the GPU


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pyllama_moe import synth

    return synth.write_model(tmp_path_factory.mktemp("gpu") / "tiny.gguf", "tiny", skew=1.0, seed=1)


def test_gpu_agrees_with_cpu(tiny: Path) -> None:
    with model(tiny, n_gpu_layers=0) as m:
        cpu_tokens, cpu_logits = greedy(m, PROMPT, 16)
    with model(tiny, n_gpu_layers=-1) as m:
        gpu_tokens, gpu_logits = greedy(m, PROMPT, 16)
    assert np.isfinite(gpu_logits).all()
    # different kernels: close, not identical; the first step sees the same input
    assert gpu_tokens[0] == cpu_tokens[0]
    np.testing.assert_allclose(gpu_logits[0], cpu_logits[0], rtol=0, atol=0.05 * np.abs(cpu_logits[0]).max())


def test_host_experts_and_moe_cache(tiny: Path) -> None:
    with model(tiny, n_gpu_layers=-1, cpu_moe=True, load_mode=lib.LLAMA_LOAD_MODE_NONE) as m:
        plain_tokens, plain_logits = greedy(m, LONG_PROMPT, 24)
        cached_tokens, cached_logits = greedy(m, LONG_PROMPT, 24, moe_cache_size=lib.llama_model_size(m) // 2,
                                              forced=plain_tokens)
    assert np.isfinite(plain_logits).all() and np.isfinite(cached_logits).all()
    # without the cache a one-token step runs the experts on the CPU, with it on the GPU: close
    scale = np.abs(plain_logits).max()
    np.testing.assert_allclose(cached_logits, plain_logits, rtol=0, atol=0.05 * scale)
    # the prompt (a large batch) runs on the GPU both ways; upstream's cache stages the experts in
    # another layout, so the sums round differently (measured on the H200: max 0.0055 of 0.83)
    np.testing.assert_allclose(cached_logits[0], plain_logits[0], rtol=0, atol=0.02 * scale)


def test_copy_bandwidth_to_the_gpu(tmp_path: Path) -> None:
    # what the bench reports beside its figures: every kind measured, finite and positive (speed itself is
    # for the bench to show, not for a test to assert); a file shorter than n_bytes is copied whole
    from pyllama_moe import backend, bench
    from pyllama_moe.errors import LlamaError

    gpu = next(d for d in backend.devices() if d.type == "gpu")
    data = tmp_path / "weights.bin"
    data.write_bytes(bytes(range(256)) * (16 << 12))  # 16 MiB
    bw = backend.h2d_bandwidth(gpu, 64 << 20, reps=2, mapped=data)
    assert set(bw) == {"pinned", "pageable", "mapped"}
    assert all(0 < v < float("inf") for v in bw.values())
    assert set(bench.h2d_bandwidth(64 << 20)) == {"pinned", "pageable"}
    assert set(bench.h2d_bandwidth(64 << 20, mapped=data)) == {"pinned", "pageable", "mapped"}
    with pytest.raises(LlamaError, match="cannot open .*absent.bin"):
        backend.h2d_bandwidth(gpu, 1 << 20, mapped=tmp_path / "absent.bin")
    (tmp_path / "empty.bin").write_bytes(b"")
    with pytest.raises(LlamaError, match="cannot map .*empty.bin: empty"):
        backend.h2d_bandwidth(gpu, 1 << 20, mapped=tmp_path / "empty.bin")
