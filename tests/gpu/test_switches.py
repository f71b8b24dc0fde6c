"""On a GPU: our scheduler patches change no result. Every kill switch on or off gives the same
logits, byte for byte, and the same greedy tokens, for host experts and for dense partial offload."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from pyllama_moe.errors import ContextError
from pyllama_moe.ffi import lib
from pyllama_moe.llama import Llama

from fixtures.native import context_fields, greedy, model

pytestmark = pytest.mark.gpu
SWITCHES = ("GGML_SCHED_ASYNC_INPUTS", "GGML_SCHED_PREFETCH")
PROMPT = " ".join(["The quick brown fox jumps over the lazy dog."] * 30)  # ~300 tokens: a large batch


@pytest.fixture(scope="module")
def moe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pyllama_moe.tools import synth

    return synth.write_model(tmp_path_factory.mktemp("sw") / "moe.gguf", "tiny", skew=1.0, seed=5, n_layer=4)


@pytest.fixture(scope="module")
def dense(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pyllama_moe.tools import synth

    return synth.write_model(tmp_path_factory.mktemp("sw") / "dense.gguf", "tiny", arch="qwen3", seed=6, n_layer=4)


def runs(monkeypatch: pytest.MonkeyPatch, m: object) -> dict[tuple[str, ...], tuple[list[int], np.ndarray]]:
    """Greedy tokens and logits for every combination of the switches (each context reads them at creation)."""
    context_fields(monkeypatch, prefetch_min_batch=1)  # prefetch even the small test batches
    out = {}
    for off in itertools.chain.from_iterable(itertools.combinations(SWITCHES, k) for k in range(len(SWITCHES) + 1)):
        for sw in SWITCHES:
            monkeypatch.delenv(sw, raising=False)
        for sw in off:
            monkeypatch.setenv(sw, "0")
        out[off] = greedy(m, PROMPT, 12, n_ctx=512)
    return out


def assert_identical(results: dict[tuple[str, ...], tuple[list[int], np.ndarray]]) -> None:
    (_, (tokens, logits)), *rest = results.items()
    assert np.isfinite(logits).all()
    for off, (t, lg) in rest:
        assert t == tokens, f"greedy tokens differ with {off} off"
        assert lg.tobytes() == logits.tobytes(), f"logits differ with {off} off"


@pytest.mark.parametrize("load_mode", ["mmap", "none"])
def test_host_experts_identical_with_switches(monkeypatch: pytest.MonkeyPatch, moe: Path, load_mode: str) -> None:
    mode = lib.LLAMA_LOAD_MODE_MMAP if load_mode == "mmap" else lib.LLAMA_LOAD_MODE_NONE
    with model(moe, n_gpu_layers=-1, cpu_moe=True, load_mode=mode) as m:
        assert_identical(runs(monkeypatch, m))


def test_dense_partial_offload_identical_with_switches(monkeypatch: pytest.MonkeyPatch, dense: Path) -> None:
    with model(dense, n_gpu_layers=2) as m:  # half the layers in host memory
        assert_identical(runs(monkeypatch, m))


def test_moe_cache_too_small_is_an_error(tmp_path: Path) -> None:
    from pyllama_moe.tools import synth

    # two experts of ~0.9 MiB each are used per token: 1 MiB cannot hold them
    path = synth.write_model(tmp_path / "wide.gguf", "tiny", n_embd=512, n_ff_exp=1024, n_ff=1024, seed=7)
    with pytest.raises(ContextError, match="too small"):
        Llama(str(path), n_ctx=64, n_gpu_layers=-1, cpu_moe=True, load_mode="none", moe_cache_mib=1, verbose=False)
    # the model is not damaged: a cache that fits works
    with Llama(str(path), n_ctx=64, n_gpu_layers=-1, cpu_moe=True, load_mode="none", moe_cache_mib=64,
               verbose=False) as llm:
        assert llm("a", max_tokens=2, temperature=0)["usage"]["completion_tokens"] >= 1
