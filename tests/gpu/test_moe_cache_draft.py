"""On a GPU: speculative decoding's verifications through the MoE cache (#45). A verification of a draft of k tokens
decodes k + 1 tokens in one ubatch; up to the device lookup's 32 tokens it stays on the device lookup (the host LRU
never runs during the generation), past it the cache is not looked up at all: the ubatch is evaluated as a prompt's
is, its experts read from host memory. (The text is not compared with the generation without a draft: a
verification's batched kernels round apart from single-token decodes, docs/compat.md.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from pyllama_moe import Llama, LlamaDraftModel

pytestmark = pytest.mark.gpu
PROMPT = "The quick brown fox jumps over"  # fewer than 32 tokens: the prompt is looked up on the device too


class Proposes(LlamaDraftModel):
    """Proposes ``k`` tokens after any input (the input's last token, shifted): each step verifies k + 1 tokens."""

    def __init__(self, k: int) -> None:
        self.k, self.calls = k, 0

    def __call__(self, input_ids: npt.NDArray[np.intc], /, **kwargs: Any) -> npt.NDArray[np.intc]:
        self.calls += 1
        return np.full(self.k, 5 + (int(input_ids[-1]) + 1) % 200, dtype=np.intc)


@pytest.fixture(scope="module")
def moe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pyllama_moe.tools import synth

    # 2 layers of 64 experts of 13.5 KiB, 2 a token: a cache of 1 MiB holds 75 of the 128 (a cache holding every expert
    # is not looked up at all), enough for the 32 tokens' 64 experts of a layer that the device lookup serves
    return synth.write_model(tmp_path_factory.mktemp("draft") / "qwen3moe.gguf", "tiny", arch="qwen3moe", skew=1.0,
                             seed=9, n_expert=64, n_expert_used=2, n_ff_exp=128)


def generate(path: Path, k: int | None, max_tokens: int = 24) -> tuple[str, Any, int]:
    draft = Proposes(k) if k else None
    with Llama(str(path), n_ctx=512, n_gpu_layers=-1, cpu_moe=True, moe_cache_mib=1, draft_model=draft,
               verbose=False) as llm:
        before = llm.moe_cache_stats()
        text = llm.create_completion(PROMPT, max_tokens=max_tokens, temperature=0)["choices"][0]["text"]
        after = llm.moe_cache_stats()
        assert before is not None and after is not None
        return text, after - before, draft.calls if draft else 0


@pytest.mark.parametrize("k", [4, 16, 31])
def test_verifications_of_up_to_32_tokens_stay_on_the_device_lookup(moe: Path, k: int) -> None:
    text, st, calls = generate(moe, k)
    assert calls > 0 and text
    assert st.hits_device + st.misses_device > 0
    assert st.hits_small + st.misses_small + st.hits_large + st.misses_large == 0, st


def test_a_verification_past_32_tokens_leaves_the_cache(moe: Path) -> None:
    # 41 tokens a step: the device lookups are the prompt's alone (those of a generation of one token, which decodes
    # nothing after the prompt), and the host LRU does not take the verifications either, so the check above fails
    # where a verification leaves the device lookup
    text, st, calls = generate(moe, 40)
    _, prompt_only, _ = generate(moe, None, max_tokens=1)
    assert calls > 0 and text
    assert prompt_only.hits_device + prompt_only.misses_device > 0, prompt_only
    assert (st.hits_device, st.misses_device) == (prompt_only.hits_device, prompt_only.misses_device), st
    assert st.hits_small + st.misses_small + st.hits_large + st.misses_large == 0, st
