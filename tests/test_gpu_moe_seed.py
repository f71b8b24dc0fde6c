"""On a GPU: the seed of the MoE cache from the end of a prompt (patches 0019, 0020).

The last large ubatch of a batch with outputs, or of the first batch of a prompt, copies the experts it used
most from their staged copies into cache slots. With LLAMA_MOE_CACHE_SEED_CHECK=1 every seeded slot is
compared with its host expert, byte for byte, over prompts of one, two and five batches, with the scheduler
prefetch on and off and ubatches above and below its minimum; the logits and the greedy text are the same
with the seed off (LLAMA_MOE_CACHE_SEED=0), and the first decode steps find the seeded experts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pyllama_moe.llama import Llama

pytestmark = pytest.mark.gpu
N_BATCH = 64
# one batch, two (the first one seeds as the start of the prompt, the last as the one with outputs), five
PROMPTS = (60, 120, 300)


@pytest.fixture(scope="module", params=["qwen3moe", "gpt-oss"])
def moe(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pyllama_moe import synth

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


@pytest.mark.parametrize("prefetch", ["default", "0"])
@pytest.mark.parametrize("min_batch", ["1", "4096"])
def test_seeded_slots_hold_their_experts(monkeypatch: pytest.MonkeyPatch, moe: Path, prefetch: str,
                                         min_batch: str) -> None:
    monkeypatch.setenv("LLAMA_MOE_CACHE_SEED_CHECK", "1")
    monkeypatch.setenv("GGML_SCHED_PREFETCH_MIN_BATCH", min_batch)  # the 64-token ubatches are prefetched or not
    if prefetch != "default":
        monkeypatch.setenv("GGML_SCHED_PREFETCH", prefetch)
    with open_llm(moe) as llm:
        for n in PROMPTS:
            complete(llm, n)
        stats = llm.moe_cache_stats()
    assert stats is not None
    seed = stats["seed"]
    # 60 tokens: one seed; 120 and 300: the first batch and the last one
    assert seed["ubatches"] == 5, stats
    assert seed["experts"] > 0 and seed["bytes"] > 0 and seed["dropped"] == 0, stats
    assert seed["checked"] > 0 and seed["check_failed"] == 0, stats
    # the prefetched seeding ubatches also copied their cached experts from the cache (patch 0017)
    prefetched = prefetch == "default" and min_batch == "1"
    assert (stats["prefetch"]["ubatches"] > 0) == prefetched, stats


@pytest.mark.parametrize("prefetch", ["default", "0"])
def test_seed_keeps_results_and_warms_decode(monkeypatch: pytest.MonkeyPatch, moe: Path, prefetch: str) -> None:
    monkeypatch.setenv("GGML_SCHED_PREFETCH_MIN_BATCH", "1")
    if prefetch != "default":
        monkeypatch.setenv("GGML_SCHED_PREFETCH", prefetch)

    def run(seed: str) -> tuple[list, dict]:
        monkeypatch.setenv("LLAMA_MOE_CACHE_SEED", seed)
        with open_llm(moe) as llm:  # a cold cache
            out = [complete(llm, n) for n in (PROMPTS[-1], PROMPTS[0])]
            stats = llm.moe_cache_stats()
        assert stats is not None
        return out, stats

    seeded, seeded_stats = run("1")
    plain, plain_stats = run("0")
    assert seeded == plain
    assert plain_stats["seed"]["ubatches"] == 0 and seeded_stats["seed"]["ubatches"] == 2 + 1
    # decode finds the experts the end of each prompt used in the cache instead of uploading them
    assert seeded_stats["device"]["hits"] > plain_stats["device"]["hits"], (seeded_stats, plain_stats)
    assert seeded_stats["device"]["bytes_uploaded"] < plain_stats["device"]["bytes_uploaded"]
