"""On a GPU: speculative decoding's verifications through the MoE cache (#45). A verification of a draft of k tokens
decodes k + 1 tokens in one ubatch; up to the device lookup's 32 tokens it stays on the device lookup (the host LRU
never runs during the generation), past it the host LRU serves it. (The text is not compared with the generation
without a draft: a verification's batched kernels round apart from single-token decodes, docs/compat.md.)"""

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

    # 64 experts, 2 a token: a cache of half of them serves ubatches of up to 32 tokens on the device
    return synth.write_model(tmp_path_factory.mktemp("draft") / "qwen3moe.gguf", "tiny", arch="qwen3moe", skew=1.0,
                             seed=9, n_expert=64, n_expert_used=2)


def generate(path: Path, k: int | None) -> tuple[str, Any, int]:
    draft = Proposes(k) if k else None
    from pyllama_moe.gguf_info import GGUFInfo

    cache_mib = GGUFInfo.read(path).expert_bytes / 2 / 2**20
    with Llama(str(path), n_ctx=512, n_gpu_layers=-1, cpu_moe=True, moe_cache_mib=cache_mib, draft_model=draft,
               verbose=False) as llm:
        before = llm.moe_cache_stats()
        text = llm.create_completion(PROMPT, max_tokens=24, temperature=0)["choices"][0]["text"]
        after = llm.moe_cache_stats()
        assert before is not None and after is not None
        return text, after - before, draft.calls if draft else 0


@pytest.mark.parametrize("k", [4, 16, 31])
def test_verifications_of_up_to_32_tokens_stay_on_the_device_lookup(moe: Path, k: int) -> None:
    text, st, calls = generate(moe, k)
    assert calls > 0 and text
    assert st.hits_device + st.misses_device > 0
    assert st.hits_small + st.misses_small + st.hits_large + st.misses_large == 0, st


def test_a_verification_past_32_tokens_takes_the_host_lru(moe: Path) -> None:
    # the same check fails where a verification leaves the device lookup: 41 tokens a step
    text, st, calls = generate(moe, 40)
    assert calls > 0 and text
    assert st.hits_small + st.misses_small + st.hits_large + st.misses_large > 0, st
