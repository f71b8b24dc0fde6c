"""Speculative decoding (#31): ``Llama(draft_model=...)`` with llama-cpp-python's ``LlamaPromptLookupDecoding`` or any
``LlamaDraftModel``: the proposal's lookup, and greedy results that do not depend on what the draft proposes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from pyllama_moe.llama_speculative import LlamaDraftModel, LlamaPromptLookupDecoding

find = LlamaPromptLookupDecoding.find_candidate_pred_tokens


def test_prompt_lookup_proposals() -> None:
    ids = np.array([1, 2, 3, 1, 2, 3, 1, 2, 3])
    assert find(ids, max_ngram_size=3, num_pred_tokens=2).tolist() == [1, 2]  # after the first [1, 2, 3]
    assert find(np.arange(1, 10), max_ngram_size=3, num_pred_tokens=2).tolist() == []  # nothing recurs
    # the longest n-gram that recurs wins: [7, 8] occurs once before (followed by 5), [8] earlier (followed by 4)
    ids = np.array([8, 4, 0, 7, 8, 5, 6, 9, 7, 8])
    assert find(ids, max_ngram_size=2, num_pred_tokens=3).tolist() == [5, 6, 9]
    assert find(ids, max_ngram_size=1, num_pred_tokens=3).tolist() == [4, 0, 7]
    # no more than the input holds after the match
    assert find(np.array([5, 6, 5]), max_ngram_size=2, num_pred_tokens=10).tolist() == [6, 5]
    assert find(np.array([5]), max_ngram_size=2, num_pred_tokens=10).tolist() == []
    with pytest.raises(ValueError, match="num_pred_tokens"):
        LlamaPromptLookupDecoding(num_pred_tokens=0)


class Oracle(LlamaDraftModel):
    """Proposes ``n`` tokens of a known continuation (right: every proposal accepted) or of a wrong one."""

    def __init__(self, prompt: list[int], continuation: list[int], n: int, wrong: bool = False) -> None:
        self.prompt, self.cont, self.n, self.wrong = prompt, continuation, n, wrong
        self.calls = 0

    def __call__(self, input_ids: Any, /, **kwargs: Any) -> Any:
        self.calls += 1
        done = len(input_ids) - len(self.prompt)
        nxt = self.cont[done: done + self.n]
        return np.array([(t + 1) % 1000 if self.wrong else t for t in nxt], dtype=np.intc)


@pytest.fixture(scope="module")
def model() -> Any:
    pytest.importorskip("pyllama_moe._cffi", reason="native part not built")
    from fixtures.models import model_path

    return model_path()


def _decodes(llm: Any) -> list[int]:
    """Counts the decodes of the Llama's generation steps (one per eval_one, one per verification)."""
    count = [0]
    session = llm._session
    for name in ("eval_one", "_eval_outputs"):
        orig = getattr(session, name)

        def wrapped(*a: Any, _orig: Any = orig) -> Any:
            count[0] += 1
            return _orig(*a)
        setattr(session, name, wrapped)
    return count


def _greedy(llm: Any, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
    """``n`` greedy tokens after ``prompt`` and, for each, the margin of its logit over the runner-up."""
    from pyllama_moe.llama_types import LogitsProcessorList

    margins: list[float] = []

    def record(_ids: Any, logits: Any) -> Any:
        top = np.sort(logits)[-2:]
        margins.append(float(top[1] - top[0]))
        return logits

    tokens = []
    for t in llm.generate(prompt, temp=0.0, logits_processor=LogitsProcessorList([record])):
        tokens.append(t)
        if len(tokens) == n:
            break
    return tokens, margins[:n]


@pytest.mark.parametrize("kind", ["right", "wrong", "lookup"])
def test_greedy_output_does_not_depend_on_the_draft(model: Any, kind: str) -> None:
    from pyllama_moe import Llama

    prompt_text = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b\n\ndef"
    with Llama(str(model), n_ctx=512, verbose=False, seed=3) as plain:
        prompt = plain.tokenize(prompt_text.encode())
        ref_tokens, margins = _greedy(plain, prompt, 48)
    # a multi-token decode rounds otherwise than one-token decodes: the greedy pick can only differ where two
    # logits are that close, so the outputs are compared up to the first near tie (where it falls depends on the
    # CPU's kernels: none in 48 tokens on some machines, at 33 on an AVX-512 one); enough tokens for several drafts
    sure = next((i for i, m in enumerate(margins) if m < 1e-3), len(margins))
    assert sure >= 24, margins
    n_ref = min(40, sure)
    with Llama(str(model), n_ctx=512, verbose=False, seed=3) as plain:
        ref = plain.create_completion(prompt, max_tokens=n_ref, temperature=0.0)
        n_plain = plain._session.n_tokens
    draft: LlamaDraftModel = (LlamaPromptLookupDecoding(max_ngram_size=3, num_pred_tokens=8) if kind == "lookup"
                              else Oracle(prompt, ref_tokens, 6, wrong=kind == "wrong"))
    with Llama(str(model), n_ctx=512, verbose=False, seed=3, draft_model=draft) as llm:
        decodes = _decodes(llm)
        got = llm.create_completion(prompt, max_tokens=n_ref, temperature=0.0)
        assert got["choices"][0]["text"] == ref["choices"][0]["text"]
        assert got["choices"][0]["finish_reason"] == ref["choices"][0]["finish_reason"]
        # only what was sampled stays evaluated, as without a draft (the last token yielded is not)
        assert llm._session.n_tokens == n_plain
        if kind == "right":  # every proposal sampled: one decode per 7 tokens
            assert decodes[0] <= -(-ref["usage"]["completion_tokens"] // 7) + 1
        elif kind == "wrong":  # every proposal rejected: one decode per token, as without a draft
            assert decodes[0] == ref["usage"]["completion_tokens"] - 1
        # a second completion reuses the evaluated prefix and agrees with a fresh one
        again = llm.create_completion(prompt, max_tokens=n_ref, temperature=0.0)
        assert again["choices"][0]["text"] == ref["choices"][0]["text"]
        got_tokens, _ = _greedy(llm, prompt, 48)
        assert got_tokens[:sure] == ref_tokens[:sure]


def test_a_draft_outside_the_vocabulary_is_an_error(model: Any) -> None:
    from pyllama_moe import Llama

    class Bad(LlamaDraftModel):
        def __call__(self, input_ids: Any, /, **kwargs: Any) -> Any:
            return np.array([10**9], dtype=np.int64)

    with Llama(str(model), n_ctx=128, verbose=False, draft_model=Bad()) as llm:
        with pytest.raises(ValueError, match="outside the vocabulary"):
            llm.create_completion("hello", max_tokens=4, temperature=0.0)
        # the Llama still works afterwards, without the draft
        llm.draft_model = None
        assert llm.create_completion("hello", max_tokens=2, temperature=0.0)["usage"]["completion_tokens"] >= 1
