"""Hybrid decode (#41) end to end without a GPU: ``moe_cache_cpu`` lets the CPU backend stand for the MoE
cache's device (its ops' CPU references look up the cache and hand the CPU its share), so every step of the hybrid's
graph runs here: the lookup leaving misses to the CPU, the selections' weights zeroed on the device side, the CPU's
graph over the host experts, the add. Through the C API, as ``Llama`` refuses a MoE cache without a GPU.

On the CPU both sides use the same kernels, so the hybrid's logits may equal the cache alone's; the GPU's test
(tests/gpu/test_moe_hybrid.py) checks closeness where they round differently."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from pyllama_moe.ffi import ffi, lib

N_TOKENS = 48
CACHE_MIB = 1  # about half of the model's 2 MiB of experts


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pyllama_moe.tools import synth

    return synth.write_model(tmp_path_factory.mktemp("hybrid-cpu") / "qwen3moe.gguf", "tiny", arch="qwen3moe",
                             skew=1.0, seed=9, n_expert=76, n_expert_used=4, n_ff_exp=128)


@pytest.fixture(autouse=True)
def switches(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for k in ("LLAMA_MOE_HYBRID", "LLAMA_MOE_CACHE_DEVICE"):
        monkeypatch.delenv(k, raising=False)
    lib.llama_backend_init()
    yield


def decode(path: Path, cache_mib: int, hybrid: int, share: float = -1.0) -> tuple[np.ndarray, dict[str, int]]:
    """The logits of N_TOKENS tokens decoded one a step, the CPU standing for the device (``moe_cache_cpu``) and
    taking ``share`` of the misses with the hybrid on (negative: what the rates say), and the cache's counts."""
    mp = lib.llama_model_default_params()
    mp.n_gpu_layers = 0
    mp.use_extra_bufts = False  # the experts in plain host buffers, as the cache reads them
    m = lib.llama_model_load_from_file(str(path).encode(), mp)
    assert m != ffi.NULL
    try:
        cp = lib.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_threads = 256, 64, 2
        cp.moe_cache_size = cache_mib << 20
        cp.moe_hybrid = hybrid
        cp.moe_hybrid_share = share
        cp.moe_cache_cpu = True
        ctx = lib.llama_init_from_model(m, cp)
        assert ctx != ffi.NULL
        try:
            n_vocab = lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(m))
            out = []
            for t in [1, *range(300, 300 + N_TOKENS - 1)]:
                tok = ffi.new("llama_token[1]", [t])
                assert lib.llama_decode(ctx, lib.llama_batch_get_one(tok, 1)) == 0
                out.append(np.frombuffer(ffi.buffer(lib.llama_get_logits_ith(ctx, -1), 4 * n_vocab), np.float32).copy())
            st = ffi.new("struct llama_moe_cache_stats *")
            counts: dict[str, int] = {}
            if lib.llama_moe_cache_get_stats(ctx, st):
                counts = {k: getattr(st, k) for k in ("hits_device", "misses_device", "n_host", "n_host_calls",
                                                      "host_busy_us", "host_max")}
            return np.stack(out), counts
        finally:
            lib.llama_free(ctx)
    finally:
        lib.llama_model_free(m)


def test_the_cache_on_the_cpu_device_is_the_model_without_it(model: Path) -> None:
    without, _ = decode(model, 0, lib.LLAMA_MOE_HYBRID_OFF)
    cached, counts = decode(model, CACHE_MIB, lib.LLAMA_MOE_HYBRID_OFF)
    assert cached.tobytes() == without.tobytes()
    assert counts["hits_device"] > 0 and counts["misses_device"] > 0, counts  # decode looked up on the "device"
    assert (counts["n_host"], counts["n_host_calls"], counts["host_max"]) == (0, 0, 0), counts


@pytest.mark.parametrize("share", [1.0, 0.5])
def test_the_cpu_takes_its_share_and_the_results_stay(model: Path, share: float) -> None:
    ref, _ = decode(model, CACHE_MIB, lib.LLAMA_MOE_HYBRID_OFF)
    got, counts = decode(model, CACHE_MIB, lib.LLAMA_MOE_HYBRID_ON, share)
    assert counts["host_max"] == 4 and counts["n_host"] > 0 and counts["n_host_calls"] > 0, counts
    assert counts["n_host"] <= N_TOKENS * 2 * counts["host_max"], counts  # 2 MoE layers, one token a ubatch
    if share == 0.5:
        assert counts["hits_device"] + counts["misses_device"] > 0, counts  # the cache still serves the rest
    # the same kernels on both sides: within rounding (the order of the experts' sum), in practice equal. The selections
    # left to the CPU read a held slot on the device side: were their weights not zeroed there, they would count twice
    # (top-1 agreement about 0.5, errors of several times the logits' spread)
    err = np.abs(got - ref).max(axis=1) / ref.std(axis=1)
    assert float((got.argmax(axis=1) == ref.argmax(axis=1)).mean()) == 1.0
    assert float(err.max()) < 1e-3, float(err.max())


@pytest.mark.parametrize("value, asked, on", [("auto", "off", True), ("2", "off", True), ("1", "off", True),
                                              ("0", "on", False), ("garbage", "off", False), ("3", "off", False),
                                              ("garbage", "on", True)])
def test_the_switch_overrides_the_context(model: Path, monkeypatch: pytest.MonkeyPatch, value: str, asked: str,
                                          on: bool) -> None:
    # LLAMA_MOE_HYBRID=0, 1, 2 or auto overrides the context's moe_hybrid; another value is named in an error and
    # ignored, the context's kept. The hybrid made (on or auto) measures its rates: host_max is the CPU's most a layer
    monkeypatch.setenv("LLAMA_MOE_HYBRID", value)
    hybrid = lib.LLAMA_MOE_HYBRID_ON if asked == "on" else lib.LLAMA_MOE_HYBRID_OFF
    _, counts = decode(model, CACHE_MIB, hybrid)
    assert (counts["host_max"] > 0) == on, counts
