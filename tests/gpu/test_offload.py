"""The CUDA build on a GPU: the tiny MoE model runs all on the GPU and with its experts in host memory,
with and without upstream's MoE cache, and agrees with the CPU."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pyllama_moe.ffi import lib

from fixtures.native import greedy, model

pytestmark = pytest.mark.gpu
PROMPT = "The quick brown fox jumps over the lazy dog"
LONG_PROMPT = " ".join([PROMPT] * 6)  # more than 32 tokens: a large batch, its MoE runs on the GPU


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pyllama_moe.tools import synth

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
    from pyllama_moe import backend
    from pyllama_moe.errors import LlamaError
    from pyllama_moe.tools import bench

    gpu = next(d for d in backend.devices() if d.type == "gpu")
    data = tmp_path / "weights.bin"
    data.write_bytes(bytes(range(256)) * (16 << 12))  # 16 MiB
    bw = bench.h2d_bandwidth_to(gpu, 64 << 20, reps=2, mapped=data)
    assert set(bw) == {"pinned", "pageable", "mapped"}
    assert all(0 < v < float("inf") for v in bw.values())
    assert set(bench.h2d_bandwidth(64 << 20)) == {"pinned", "pageable"}
    assert set(bench.h2d_bandwidth(64 << 20, mapped=data)) == {"pinned", "pageable", "mapped"}
    with pytest.raises(LlamaError, match="cannot open .*absent.bin"):
        bench.h2d_bandwidth_to(gpu, 1 << 20, mapped=tmp_path / "absent.bin")
    (tmp_path / "empty.bin").write_bytes(b"")
    with pytest.raises(LlamaError, match="cannot map .*empty.bin: empty"):
        bench.h2d_bandwidth_to(gpu, 1 << 20, mapped=tmp_path / "empty.bin")


FIT_CHILD = """
import json, sys
from pyllama_moe import backend
from pyllama_moe.llama import Llama
gpu = next(d for d in backend.devices() if d.type == "gpu")
budget = int(sys.argv[2]) << 20
free0 = gpu.memory_free
with Llama(sys.argv[1], fit=True, fit_target_mib=max(0, free0 - budget) >> 20, n_gpu_layers=-1, load_mode="none",
           moe_cache_mib="auto", n_ctx=1024, n_batch=512, n_ubatch=512, verbose=True) as llm:
    used = free0 - next(d for d in backend.devices() if d.type == "gpu").memory_free
    llm.eval(llm.tokenize(b" the" * 400))  # a large ubatch: the prefetch runs
    stats = llm.moe_cache_stats()
    used_after = free0 - next(d for d in backend.devices() if d.type == "gpu").memory_free
print("RESULT", json.dumps({"cache": stats is not None,
                            "used": used, "used_after": used_after, "budget": budget}))
"""


def test_fit_with_cache_keeps_the_prefetch(tmp_path: Path) -> None:
    # #26 item 3: the fit (no-alloc measure, ggml_backend_sched_reserve_size) counts the prefetch staging, so a fit
    # with moe_cache_mib="auto" into a tight budget keeps the prefetch (no "not enough memory for the prefetch
    # staging" drop) and the device memory taken stays within the budget the fit was given
    import json
    import subprocess
    import sys

    from pyllama_moe.tools import synth

    path = synth.write_model(tmp_path / "m.gguf", "tiny", skew=1.0, seed=3, n_layer=8, n_embd=1024, n_head=8,
                             n_head_kv=4, head_dim=128, n_expert=32, n_expert_used=4, n_ff_exp=1024)
    res = subprocess.run([sys.executable, "-c", FIT_CHILD, str(path), "640"], capture_output=True, text=True,
                         timeout=300)
    log = res.stdout + res.stderr
    assert res.returncode == 0, log[-4000:]
    out = json.loads(log.split("RESULT", 1)[1].splitlines()[0])
    assert out["cache"], "the fit put every expert on the GPU: the budget is too large for the test's point"
    assert "host weight prefetch" in log, log[-4000:]
    assert "not enough memory for the prefetch staging" not in log and "failed to allocate" not in log, log[-4000:]
    # what the load took stays within the budget, but for what no fit counts (measured on the H200: 70 MiB over at
    # load, cuBLAS's handle and the driver's own; the compute takes more again, which the fit's margin is for)
    assert out["used"] <= out["budget"] + (128 << 20), out


def test_contexts_on_one_memory_mapped_model(tiny: Path) -> None:
    # #26 item 5: each context's cache maps the memory-mapped experts for its device lookups or, where the device
    # cannot map them, copies them into memory of its own; the model's tensors are never repointed, so contexts
    # created and run from four threads at once on one model give the logits of one context alone, byte for byte
    import threading

    with model(tiny, n_gpu_layers=-1, cpu_moe=True, load_mode=lib.LLAMA_LOAD_MODE_MMAP) as m:
        alone_tokens, alone_logits = greedy(m, LONG_PROMPT, 24, moe_cache_size=8 << 20)
        results: list[tuple[list[int], np.ndarray]] = []
        errors: list[BaseException] = []

        def run() -> None:
            try:
                results.append(greedy(m, LONG_PROMPT, 24, moe_cache_size=8 << 20))
            except BaseException as e:  # noqa: BLE001  (any failure of the thread: the assert below reports it)
                errors.append(e)

        threads = [threading.Thread(target=run) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        assert len(results) == 4
        for tokens, logits in results:
            assert tokens == alone_tokens
            np.testing.assert_array_equal(logits, alone_logits)
