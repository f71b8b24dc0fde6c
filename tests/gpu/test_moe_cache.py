"""On a GPU: the MoE cache looked up on the device (GGML_OP_MOE_CACHE_LOOKUP, patch 0010) gives the
same logits, byte for byte, and the same greedy tokens as the host lookup (LLAMA_MOE_CACHE_DEVICE=0),
for an architecture without and one with per-expert biases, and its counts reach Python."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pyllama_moe.ffi import lib
from pyllama_moe.llama import Llama
from pyllama_moe.moe import MoeCacheStats

from fixtures.native import context_fields, decode_chunks, greedy, model

pytestmark = pytest.mark.gpu
PROMPT = "The quick brown fox jumps over the lazy dog"
LONG = " ".join([PROMPT] * 8)  # more than 32 tokens: the prompt takes the host path, decode the device


@pytest.fixture(scope="module", params=["qwen3moe", "gpt-oss"])
def moe(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pyllama_moe.tools import synth

    return synth.write_model(tmp_path_factory.mktemp("mc") / f"{request.param}.gguf", "tiny", arch=request.param,
                             skew=1.0, seed=9, n_layer=4)


def run(monkeypatch: pytest.MonkeyPatch, path: Path, device: str, prompt: str, cache_bytes: int = 8 << 20
        ) -> tuple[list[int], np.ndarray]:
    monkeypatch.setenv("LLAMA_MOE_CACHE_DEVICE", device)  # read when the context creates its cache
    with model(path, n_gpu_layers=-1, cpu_moe=True, load_mode=lib.LLAMA_LOAD_MODE_NONE) as m:
        return greedy(m, prompt, 24, moe_cache_size=cache_bytes)


@pytest.mark.parametrize("prompt", [PROMPT, LONG])
def test_device_lookup_is_byte_identical(monkeypatch: pytest.MonkeyPatch, moe: Path, prompt: str) -> None:
    host_tokens, host_logits = run(monkeypatch, moe, "0", prompt)
    dev_tokens, dev_logits = run(monkeypatch, moe, "1", prompt)
    assert np.isfinite(dev_logits).all()
    assert dev_tokens == host_tokens
    assert dev_logits.tobytes() == host_logits.tobytes()


def test_device_lookup_matches_all_on_gpu(monkeypatch: pytest.MonkeyPatch, moe: Path) -> None:
    # decode steps read the experts from their slots: the same weights as all on the GPU (for gpt-oss the
    # all-GPU path fuses MUL_MAT_ID with the bias ADD_ID, the cached one cannot: same float ops, unfused)
    with model(moe, n_gpu_layers=-1) as m:
        gpu_tokens, gpu_logits = greedy(m, PROMPT, 24)
    dev_tokens, dev_logits = run(monkeypatch, moe, "1", PROMPT)
    assert dev_tokens == gpu_tokens
    assert dev_logits.tobytes() == gpu_logits.tobytes()


def test_small_cache_evicts_and_stays_identical(monkeypatch: pytest.MonkeyPatch, moe: Path) -> None:
    # 32 KiB: a few slots of ~3.4 KiB for the 32 experts (4 layers x 8), less the gpt-oss biases' device copies:
    # every decode step evicts, the CLOCK sweep and the uploads run
    host = run(monkeypatch, moe, "0", PROMPT, cache_bytes=32 << 10)
    dev = run(monkeypatch, moe, "1", PROMPT, cache_bytes=32 << 10)
    assert dev[0] == host[0] and dev[1].tobytes() == host[1].tobytes()


@pytest.mark.parametrize("cache_bytes", [32 << 10, 8 << 20])
def test_prediction_stays_identical(monkeypatch: pytest.MonkeyPatch, moe: Path, cache_bytes: int) -> None:
    # patches 0019-0021 (LLAMA_MOE_CACHE_PREDICT=1: at most one copy a layer; 2 by default): after the lookup of
    # layer l, the experts
    # that the next MoE layer's router picks on layer l's input are scored and copied on a stream of their own, and
    # that layer's lookup finds them.
    # Only what the slots hold changes: 128 greedy tokens and their logits are those without the prediction, byte for
    # byte, with a cache that evicts at every step (32 KiB) and one that holds every expert. "2:2" and "2:3": two and
    # three MoE layers ahead, the copies for the layers after the next running on through the lookups between (pinned
    # until theirs)
    monkeypatch.setenv("LLAMA_MOE_CACHE_DEVICE", "1")
    res: dict[str, tuple[list[int], np.ndarray]] = {}
    stats: dict[str, MoeCacheStats] = {}
    for predict in ("0", "1", "2:2", "2:3"):
        monkeypatch.setenv("LLAMA_MOE_CACHE_PREDICT", predict)
        out: list[MoeCacheStats] = []
        with model(moe, n_gpu_layers=-1, cpu_moe=True, load_mode=lib.LLAMA_LOAD_MODE_NONE) as m:
            res[predict] = greedy(m, PROMPT, 128, moe_cache_size=cache_bytes, stats=out)
        stats[predict] = out[0]
    for predict in ("1", "2:2", "2:3"):
        assert res[predict][0] == res["0"][0] and res[predict][1].tobytes() == res["0"][1].tobytes(), predict
    deep = stats["2:3"]
    assert deep.hits_device + deep.misses_device == stats["0"].hits_device + stats["0"].misses_device
    assert deep.n_predicted_used + deep.n_predicted_wasted <= deep.n_predicted
    off, on = stats["0"], stats["1"]
    assert off.n_predicted == off.n_predicted_used == off.n_predicted_wasted == 0
    assert on.hits_device + on.misses_device == off.hits_device + off.misses_device  # the same selections
    assert on.n_predicted_used + on.n_predicted_wasted <= on.n_predicted
    assert on.bytes_predicted == on.n_predicted * (off.bytes_device // max(off.misses_device, 1))
    if cache_bytes < (1 << 20):  # evicting: layers 1..3 are predicted at every step, and the predictions are used
        assert on.n_predicted > 0 and on.n_predicted_used > 0, on


@pytest.mark.parametrize("cache_bytes", [32 << 10, 256 << 10])
def test_prediction_identical_in_ubatches_of_9_to_32(monkeypatch: pytest.MonkeyPatch, moe: Path, cache_bytes: int
                                                      ) -> None:
    # ubatches of 9 to 32 tokens are looked up on the device and predicted too; their matmuls over the cached
    # experts (MMQ, stream-k) see other slot indices with the prediction on: the logits must not change
    from pyllama_moe.ffi import ffi

    monkeypatch.setenv("LLAMA_MOE_CACHE_DEVICE", "1")
    rows: dict[str, np.ndarray] = {}
    stats: dict[str, MoeCacheStats] = {}
    with model(moe, n_gpu_layers=-1, cpu_moe=True, load_mode=lib.LLAMA_LOAD_MODE_NONE) as m:
        text = (LONG * 3).encode()
        buf = ffi.new("llama_token[]", 1024)
        n = lib.llama_tokenize(lib.llama_model_get_vocab(m), text, len(text), buf, 1024, True, False)
        tokens = list(buf[0:n])
        assert n > 200
        for predict in ("0", "2"):
            monkeypatch.setenv("LLAMA_MOE_CACHE_PREDICT", predict)
            rows[predict], st = decode_chunks(m, tokens, [9, 16, 32, 17, 31], cache_bytes)
            assert st is not None
            stats[predict] = st
    assert rows["2"].tobytes() == rows["0"].tobytes()
    off, on = stats["0"], stats["2"]
    assert off.n_predicted == 0
    # gpt-oss's 32 KiB holds too few of its experts for these ubatches: they take the host path there
    if cache_bytes > 32 << 10:  # room for 32 tokens' experts: every ubatch on the device, predicted
        assert off.hits_device + off.misses_device > 0
        assert off.hits_small + off.misses_small + off.hits_large + off.misses_large == 0
        assert on.n_predicted > 0, on


# a child process: ggml-cuda reads GGML_CUDA_PDL once per process
CHILD = """
import hashlib, sys
from pyllama_moe.ffi import lib
from fixtures.native import decode_chunks, greedy, model
with model(sys.argv[1], n_gpu_layers=-1, cpu_moe=True, load_mode=lib.LLAMA_LOAD_MODE_NONE) as m:
    tokens, logits = greedy(m, sys.argv[2], 24, moe_cache_size=int(sys.argv[3]))
print(tokens, hashlib.sha256(logits.tobytes()).hexdigest())
"""


@pytest.mark.parametrize("cache_bytes", [32 << 10, 8 << 20])
def test_programmatic_launch_stays_identical(monkeypatch: pytest.MonkeyPatch, moe: Path, cache_bytes: int) -> None:
    # patch 0017: the lookup and its copies launch with programmatic dependent launch (GGML_CUDA_PDL=0 turns it off
    # for every kernel): each must still see what the kernel before it wrote. A small cache evicts at every step
    host_tokens, host_logits = run(monkeypatch, moe, "0", PROMPT, cache_bytes=cache_bytes)
    want = f"{host_tokens} {hashlib.sha256(host_logits.tobytes()).hexdigest()}"
    for pdl in ("1", "0"):
        env = dict(os.environ, LLAMA_MOE_CACHE_DEVICE="1", GGML_CUDA_PDL=pdl)
        got = subprocess.run([sys.executable, "-c", CHILD, str(moe), PROMPT, str(cache_bytes)], env=env,
                             cwd=Path(__file__).parents[1], capture_output=True, text=True, check=True).stdout
        assert got.strip().splitlines()[-1] == want, f"GGML_CUDA_PDL={pdl}"


def test_stats_reach_python(monkeypatch: pytest.MonkeyPatch, moe: Path) -> None:
    for device in ("1", "0"):
        monkeypatch.setenv("LLAMA_MOE_CACHE_DEVICE", device)
        with Llama(str(moe), n_ctx=256, n_gpu_layers=-1, cpu_moe=True, moe_cache_mib=64, verbose=False) as llm:
            llm("The quick brown fox", max_tokens=16, temperature=0)
            stats = llm.moe_cache_stats()
        assert stats is not None
        looked_up = {p: stats[p]["hits"] + stats[p]["misses"] for p in ("small", "large", "device")}
        if device == "1":
            assert looked_up["device"] > 0 and looked_up["small"] == 0, stats
            assert stats["device"]["bytes_uploaded"] > 0
        else:
            assert looked_up["device"] == 0 and looked_up["small"] > 0, stats


def test_warmup_selecting_every_expert_does_not_abort(monkeypatch: pytest.MonkeyPatch, moe: Path) -> None:
    # llama.cpp's warmup routes each token to every expert: more than a small cache's slots; such a
    # ubatch reads the host experts instead of building the lookup (whose asserts would abort)
    from pyllama_moe.errors import ContextError, check_decode, check_ptr
    from pyllama_moe.ffi import ffi

    monkeypatch.setenv("LLAMA_MOE_CACHE_DEVICE", "1")
    with model(moe, n_gpu_layers=-1, cpu_moe=True, load_mode=lib.LLAMA_LOAD_MODE_NONE) as m:
        cparams = lib.llama_context_default_params()
        cparams.n_ctx = cparams.n_batch = 64
        cparams.moe_cache_size = 32 << 10
        ctx = check_ptr(lib.llama_init_from_model(m, cparams), ContextError, "cannot create the context")
        try:
            toks = ffi.new("llama_token[]", [1, 2])
            lib.llama_set_warmup(ctx, True)
            check_decode(lib.llama_decode(ctx, lib.llama_batch_get_one(toks, 2)))
            lib.llama_set_warmup(ctx, False)
            lib.llama_memory_clear(lib.llama_get_memory(ctx), True)
            check_decode(lib.llama_decode(ctx, lib.llama_batch_get_one(toks, 1)))
        finally:
            lib.llama_free(ctx)


@pytest.mark.parametrize("materialize", ["0", "1"])
def test_memory_mapped_experts(monkeypatch: pytest.MonkeyPatch, moe: Path, materialize: str) -> None:
    # patch 0013: memory-mapped experts are mapped for the device lookups or, where the device refuses the file
    # mapping, copied once into anonymous memory and mapped there; LLAMA_MOE_CACHE_MATERIALIZE=0 keeps host lookups
    # for what cannot be mapped. Any way, the tokens are those of the host lookups
    def generate(device: str) -> tuple[str, dict]:
        monkeypatch.setenv("LLAMA_MOE_CACHE_DEVICE", device)
        with Llama(str(moe), n_ctx=256, n_gpu_layers=-1, cpu_moe=True, load_mode="mmap", moe_cache_mib=8,
                   verbose=False) as llm:
            text = llm(PROMPT, max_tokens=24, temperature=0)["choices"][0]["text"]
            return text, llm.moe_cache_stats()

    monkeypatch.setenv("LLAMA_MOE_CACHE_MATERIALIZE", materialize)
    host_text, host_stats = generate("0")
    dev_text, dev_stats = generate("1")
    assert dev_text == host_text
    assert host_stats["device"]["hits"] + host_stats["device"]["misses"] == 0
    if materialize == "1":  # mapped, or copied (the tiny experts fit) and mapped: decode looked up on the device
        assert dev_stats["device"]["hits"] + dev_stats["device"]["misses"] > 0, dev_stats


def test_prefetch_from_the_cache_is_identical(monkeypatch: pytest.MonkeyPatch, moe: Path) -> None:
    # patch 0015 (LLAMA_MOE_CACHE_PREFETCH=0 turns it off): the prefetch of a large ubatch copies the experts held in
    # the cache device to device and uploads only the others, before the routing is known: the same logits and tokens
    context_fields(monkeypatch, prefetch_min_batch=1)  # the test's prompts are small

    def generate(flag: str) -> tuple[list, dict]:
        monkeypatch.setenv("LLAMA_MOE_CACHE_PREFETCH", flag)
        with Llama(str(moe), n_ctx=512, n_batch=512, n_gpu_layers=-1, cpu_moe=True, load_mode="none", moe_cache_mib=8,
                   verbose=False) as llm:
            first = llm(PROMPT, max_tokens=8, temperature=0)  # the decode fills the cache
            # the rest of the long prompt is one large ubatch after it, then decode again
            second = llm(LONG, max_tokens=8, temperature=0, logprobs=4)
            choice = second["choices"][0]
            return ([first["choices"][0]["text"], choice["text"], choice["logprobs"]["top_logprobs"]],
                    llm.moe_cache_stats())

    base, base_stats = generate("0")
    ours, stats = generate("1")
    assert ours == base
    assert base_stats["copied"]["experts"] == 0  # prefetched whole from host memory
    assert stats["copied"]["experts"] > 0, stats  # the cached ones from the cache
    pf = stats["prefetch"]
    assert pf["ubatches"] > 0 and pf["bytes_cache"] > 0 and base_stats["prefetch"]["regions"] == 0
    assert 0 < pf["calls"] <= pf["regions"] and pf["bytes_cache"] + pf["bytes_host"] > 0
