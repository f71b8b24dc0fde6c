"""On a GPU (#45): speculative decoding with the MoE cache. A draft's verification is one ubatch of the sampled token
and the proposal; up to 32 tokens it looks the cache up on the device like a decode step (GGML_OP_MOE_CACHE_LOOKUP,
patch 0009: ``max_batch``, as long as the slots hold a layer's experts), a larger one takes the host path (the host
LRU, its state copied back from the device and up again). With a cache that evicts at every verification, the greedy
tokens are those without a draft up to the first near tie (a ubatch's logits may differ from a decode step's in their
last bits, as tests/core/test_speculative.py says)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pyllama_moe import Llama, MoeCacheStats
from pyllama_moe.llama_types import LogitsProcessorList
from pyllama_moe.tools.bench.draft import DraftLog, Replay

pytestmark = pytest.mark.gpu
PROMPT = "The quick brown fox jumps over the lazy dog"
N_GEN = 48
N_LAYER, N_EXPERT = 4, 8  # the tiny preset's 8 experts (2 used), in 4 layers
CACHE_MIB = 5  # experts of 432 KiB (n_ff_exp 4096): about 10 slots for the 32, at least a layer's 8
NEAR_TIE = 3e-3  # logits closer than this may swap between a ubatch and a decode step


@pytest.fixture(scope="module")
def moe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pyllama_moe.tools import synth

    # seed 5: no near tie in the first 40 greedy tokens after PROMPT (on the CPU)
    return synth.write_model(tmp_path_factory.mktemp("draft") / "qwen3moe.gguf", "tiny", arch="qwen3moe", skew=1.0,
                             seed=5, n_layer=N_LAYER, n_ff_exp=4096)


Generated = tuple[list[int], list[int], MoeCacheStats, MoeCacheStats, int]


def generate(moe: Path, draft: Any = None, processor: Any = None) -> Generated:
    """N_GEN greedy tokens after PROMPT, with the experts in host memory and the MoE cache: the prompt, the tokens,
    the cache's counts over the generation (from the decode of the prompt's last token on) and since the context was
    made, and the size of the vocabulary."""
    with Llama(str(moe), n_ctx=512, n_gpu_layers=-1, cpu_moe=True, load_mode="none", moe_cache_mib=CACHE_MIB,
               verbose=False, draft_model=draft) as llm:
        prompt = llm.tokenize(PROMPT.encode())
        llm.eval(prompt)  # generate evaluates the last token again: the generation's first decode step
        before = llm.moe_cache_stats()
        tokens = []
        for t in llm.generate(prompt, temp=0.0, logits_processor=processor):
            tokens.append(t)
            if len(tokens) == N_GEN:
                break
        after = llm.moe_cache_stats()
        n_vocab = llm.n_vocab()
    assert before is not None and after is not None
    return prompt, tokens, after - before, after, n_vocab


@pytest.fixture(scope="module")
def reference(moe: Path) -> tuple[list[int], list[int], int, int]:
    """Without a draft: the prompt, the greedy tokens, how many of them come before the first near tie, and the size
    of the vocabulary."""
    margins: list[float] = []

    def record(_ids: Any, logits: Any) -> Any:
        top = np.sort(logits)[-2:]
        margins.append(float(top[1] - top[0]))
        return logits

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LLAMA_MOE_CACHE_DEVICE", "1")
        prompt, tokens, during, _, n_vocab = generate(moe, processor=LogitsProcessorList([record]))
    assert during.hits_small + during.misses_small + during.hits_large + during.misses_large == 0, during
    sure = next((i for i, m in enumerate(margins[:N_GEN]) if m < NEAR_TIE), N_GEN)
    return prompt, tokens, sure, n_vocab


@pytest.mark.parametrize("drafted_by", ["replay", "wrong"])
@pytest.mark.parametrize("k", [31, 32])
def test_verification_stays_on_the_device_lookup(monkeypatch: pytest.MonkeyPatch, moe: Path,
                                                 reference: tuple[list[int], list[int], int, int], drafted_by: str,
                                                 k: int) -> None:
    # drafts of k tokens: the text generated without a draft (accepted up to where a ubatch's logits pick otherwise) or
    # other tokens (rejected, a verification per token); the wrong ones get padding so that every proposal is whole
    monkeypatch.setenv("LLAMA_MOE_CACHE_DEVICE", "1")
    prompt, ref_tokens, sure, n_vocab = reference
    text = [*prompt, *ref_tokens] + ([0] * k if drafted_by == "wrong" else [])
    log = DraftLog(Replay(text, k, n_vocab, wrong=drafted_by == "wrong"), limit=511)
    _, tokens, during, total, _ = generate(moe, draft=log)
    sizes = [len(p) for _, p in log.calls]
    assert sizes and max(sizes) == k, sizes  # verifications of k + 1 tokens
    if drafted_by == "wrong":  # rejected: a verification per token (but the last), each of k + 1 tokens
        assert set(sizes) == {k} and len(sizes) >= sure, sizes
    assert total.misses_device + total.misses_small + total.misses_large > N_LAYER * N_EXPERT, total  # it evicted
    device = during.hits_device + during.misses_device
    small = during.hits_small + during.misses_small
    large = during.hits_large + during.misses_large
    assert device > 0 and small == 0, during
    if k + 1 <= 32:  # the device lookup's largest ubatch: every verification stays on the device
        assert large == 0, during
    else:  # one token more: the verifications take the host path (large ubatches), the decode steps stay
        assert large > 0, during
    assert sure >= 16, f"a near tie after {sure} tokens: the comparison below says little"
    assert tokens[:sure] == ref_tokens[:sure]
