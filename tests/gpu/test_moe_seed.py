"""On a GPU: the seed of the MoE cache from the end of a prompt (patch 0016).

The last large ubatch of each batch copies the experts it used most from their staged copies into cache
slots, by its own routing. Over prompts of one, two and five batches, with the scheduler prefetch on and off and
ubatches above and below its minimum, the decode steps after each prompt find the seeded experts and give the
logits and the greedy text of the seed off (LLAMA_MOE_CACHE_SEED=0) to the last digit: a seeded slot that held
anything but its expert would change them. Batches of two sequences and a position jump seed each from their own
routing, and a decode step after them reads the seeded slots with the logits of the seed off."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pyllama_moe.batch import Batch
from pyllama_moe.errors import ContextError, check_decode, check_ptr
from pyllama_moe.ffi import ffi, lib
from pyllama_moe.llama import Llama
from pyllama_moe.moe import MoeCacheStats

from fixtures.native import context_fields, context_params, model

pytestmark = pytest.mark.gpu
N_BATCH = 64
# prompts of one batch, two and five: every batch seeds
PROMPTS = (60, 120, 300)


@pytest.fixture(scope="module", params=["qwen3moe", "gpt-oss"])
def moe(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pyllama_moe.tools import synth

    return synth.write_model(tmp_path_factory.mktemp("seed") / f"{request.param}.gguf", "tiny", arch=request.param,
                             skew=1.0, seed=11, n_layer=4)


def open_llm(path: Path) -> Llama:
    return Llama(str(path), n_ctx=512, n_batch=N_BATCH, n_ubatch=N_BATCH, n_gpu_layers=-1, cpu_moe=True,
                 load_mode="none", moe_cache_mib=8, verbose=False)


def complete(llm: Llama, n_prompt: int, max_tokens: int = 8) -> tuple[str, list]:
    """A prompt of ``n_prompt`` random tokens evaluated from the start, then greedy tokens with their top logprobs."""
    llm.reset()
    rng = np.random.default_rng(n_prompt)
    tokens = [llm.token_bos(), *rng.integers(1000, min(llm.n_vocab(), 50_000), n_prompt - 1).tolist()]
    choice = llm.create_completion(tokens, max_tokens=max_tokens, temperature=0.0, logprobs=4)["choices"][0]
    return choice["text"], choice["logprobs"]["top_logprobs"]


def seeded_and_plain(monkeypatch: pytest.MonkeyPatch, moe: Path, prompts: tuple[int, ...]) -> tuple[tuple, tuple]:
    """Each of ``prompts`` completed from the start in one context, a cold cache, with the seed on and off: their
    texts and top logprobs, and the cache's counts."""
    def run(seed: str) -> tuple[list, dict]:
        monkeypatch.setenv("LLAMA_MOE_CACHE_SEED", seed)
        with open_llm(moe) as llm:
            out = [complete(llm, n) for n in prompts]
            stats = llm.moe_cache_stats()
        assert stats is not None
        return out, stats

    return run("1"), run("0")


@pytest.mark.parametrize("prefetch", ["default", "0"])
@pytest.mark.parametrize("min_batch", [1, 4096])
def test_seeded_slots_hold_their_experts(monkeypatch: pytest.MonkeyPatch, moe: Path, prefetch: str,
                                         min_batch: int) -> None:
    context_fields(monkeypatch, prefetch_min_batch=min_batch)  # the 64-token ubatches are prefetched or not
    if prefetch != "default":
        monkeypatch.setenv("GGML_SCHED_PREFETCH", prefetch)
    (seeded, stats), (plain, plain_stats) = seeded_and_plain(monkeypatch, moe, PROMPTS)
    seed = stats["seed"]
    # every batch seeds: 1 + 2 + 5
    assert seed["ubatches"] == 8, stats
    assert seed["experts"] > 0 and seed["bytes"] > 0 and seed["dropped"] == 0, stats
    assert plain_stats["seed"]["ubatches"] == 0
    # the decode steps read seeded slots, and their logits are those of the experts uploaded from host memory
    assert stats["device"]["hits"] > plain_stats["device"]["hits"], (stats, plain_stats)
    assert seeded == plain
    # the prefetched seeding ubatches also copied their cached experts from the cache (patch 0015)
    prefetched = prefetch == "default" and min_batch == 1
    assert (stats["prefetch"]["ubatches"] > 0) == prefetched, stats


@pytest.mark.parametrize("prefetch", ["default", "0"])
def test_seed_keeps_results_and_warms_decode(monkeypatch: pytest.MonkeyPatch, moe: Path, prefetch: str) -> None:
    context_fields(monkeypatch, prefetch_min_batch=1)
    if prefetch != "default":
        monkeypatch.setenv("GGML_SCHED_PREFETCH", prefetch)
    (seeded, seeded_stats), (plain, plain_stats) = seeded_and_plain(monkeypatch, moe, (PROMPTS[-1], PROMPTS[0]))
    assert seeded == plain
    assert plain_stats["seed"]["ubatches"] == 0
    assert seeded_stats["seed"]["ubatches"] == 5 + 1, seeded_stats
    # decode finds the experts the end of each prompt used in the cache instead of uploading them
    assert seeded_stats["device"]["hits"] > plain_stats["device"]["hits"], (seeded_stats, plain_stats)
    assert seeded_stats["device"]["bytes_uploaded"] < plain_stats["device"]["bytes_uploaded"]


def seed_stats(ctx: object) -> dict[str, int]:
    st = MoeCacheStats.read(ctx)
    assert st is not None
    return {k: getattr(st, k) for k in ("n_seed_ubatch", "n_seed_dropped", "hits_device", "misses_device")}


def switch_sequences(path: Path) -> tuple[dict[str, int], np.ndarray]:
    """Batches without outputs on two sequences, then a position jump with outputs and four decode steps after it:
    the seed's and the device lookups' counts, and the last logits of the jump's batch and of each step."""
    rng = np.random.default_rng(5)
    with model(path, n_gpu_layers=99, cpu_moe=True, load_mode=0) as m:
        cparams = context_params()
        cparams.n_ctx = 1024
        cparams.n_batch = cparams.n_ubatch = N_BATCH
        cparams.n_seq_max = 2
        cparams.moe_cache_size = 8 << 20
        ctx = check_ptr(lib.llama_init_from_model(m, cparams), ContextError, "cannot create the context")
        batch = Batch(N_BATCH, n_seq_max=2)
        try:
            n_vocab = lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(m))
            rows = []

            def decode(seq: int, pos0: int, n: int = N_BATCH, output: bool = False) -> None:
                batch.set_seq(seq)
                batch.set_tokens(rng.integers(1000, min(n_vocab, 50_000), n), pos0, False, last_logits=output)
                check_decode(lib.llama_decode(ctx, batch.value))
                if output:
                    row = np.frombuffer(ffi.buffer(lib.llama_get_logits_ith(ctx, -1), n_vocab * 4), np.float32)
                    rows.append(row.copy())

            decode(0, 0)              # the start of a prompt
            decode(0, N_BATCH)
            decode(1, 0)              # another sequence (a context switch)
            decode(0, 2 * N_BATCH)    # back to sequence 0
            decode(0, 3 * N_BATCH)
            assert lib.llama_memory_seq_rm(lib.llama_get_memory(ctx), 0, 3 * N_BATCH, -1)
            decode(0, 3 * N_BATCH, output=True)  # a position jump, with outputs
            for k in range(4):  # decode steps: device lookups, which read the slots the jump's batch seeded
                decode(0, 4 * N_BATCH + k, n=1, output=True)
            counts = seed_stats(ctx)
        finally:
            batch.close()
            lib.llama_free(ctx)
    return counts, np.stack(rows)


def test_every_batch_of_two_sequences_seeds(monkeypatch: pytest.MonkeyPatch, moe: Path) -> None:
    """Batches of two sequences and a position jump, with and without outputs: each seeds from its own routing, and
    the decode steps after them find seeded experts with the logits of the seed off, byte for byte."""
    context_fields(monkeypatch, prefetch_min_batch=1)
    monkeypatch.setenv("LLAMA_MOE_CACHE_SEED", "1")
    st, logits = switch_sequences(moe)
    assert st["n_seed_ubatch"] == 6 and st["n_seed_dropped"] == 0, st
    monkeypatch.setenv("LLAMA_MOE_CACHE_SEED", "0")
    plain, plain_logits = switch_sequences(moe)
    assert plain["n_seed_ubatch"] == 0, plain
    assert st["hits_device"] > plain["hits_device"], (st, plain)
    assert logits.tobytes() == plain_logits.tobytes()
