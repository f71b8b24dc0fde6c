"""Greedy sampling alone, or after the repeat penalty, reads the largest logit in place (the Sampler's argmax path):
the token is llama.cpp's greedy sampler's (PYLLAMA_MOE_GREEDY_ARGMAX=0) for any logits, ties, infinities and NaN
included, and with the penalty the chain's over the tokens it has seen."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest

from pyllama_moe.ffi import ffi, lib
from pyllama_moe.llama import Llama
from pyllama_moe.sampler import Sampler, SamplingParams

from fixtures.models import model_path

GREEDY = SamplingParams(temperature=0)


@pytest.fixture(scope="module")
def llm() -> Iterator[Llama]:
    with Llama(str(model_path("qwen3moe")), n_ctx=128, verbose=False) as m:
        m.eval(m.tokenize(b"The quick brown fox"))
        yield m


def sampler(llm: Llama, params: SamplingParams, monkeypatch: pytest.MonkeyPatch, argmax: bool) -> Sampler:
    monkeypatch.setenv("PYLLAMA_MOE_GREEDY_ARGMAX", "1" if argmax else "0")
    return Sampler(llm._vocab, params)


def edit_first_max_twice(x: np.ndarray) -> None:  # a tie: the first of the two wins
    x[[3, 1000]] = x.max() + 1


def edit_nan_at_max(x: np.ndarray) -> None:
    x[int(x.argmax())] = np.nan


def edit_nan_first(x: np.ndarray) -> None:  # greedy starts from token 0 and nothing compares greater than NaN
    x[0] = np.nan


def edit_infinities(x: np.ndarray) -> None:
    x[:] = -np.inf
    x[[50, 7]] = np.inf


def edit_all_minus_infinity(x: np.ndarray) -> None:
    x[:] = -np.inf


def edit_signed_zeros(x: np.ndarray) -> None:  # -0.0 == 0.0: the first stays
    x[:] = -np.inf
    x[4], x[2] = -0.0, 0.0


EDITS: dict[str, Callable[[np.ndarray], None]] = {
    "as decoded": lambda x: None,
    "tie": edit_first_max_twice,
    "NaN at the max": edit_nan_at_max,
    "NaN first": edit_nan_first,
    "infinities": edit_infinities,
    "all -inf": edit_all_minus_infinity,
    "signed zeros": edit_signed_zeros,
}


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_argmax_is_llama_cpp_s_greedy_token(llm: Llama, monkeypatch: pytest.MonkeyPatch, edit: str) -> None:
    fast, ref = (sampler(llm, GREEDY, monkeypatch, argmax) for argmax in (True, False))
    assert fast._argmax and not ref._argmax
    p = lib.llama_get_logits_ith(llm._ctx.ptr, -1)
    logits = np.frombuffer(ffi.buffer(p, 4 * llm.n_vocab()), dtype=np.float32)  # the context's own, edited in place
    saved = logits.copy()
    try:
        EDITS[edit](logits)
        edited = logits.copy()
        token = fast.sample(llm._ctx, -1)
        assert token == ref.sample(llm._ctx, -1)
        if edit == "tie":
            assert token == 3
        elif edit == "infinities":
            assert token == 7
        elif edit in ("NaN first", "all -inf"):
            assert token == 0
        elif edit == "signed zeros":
            assert token == 2
        elif edit == "NaN at the max":
            assert token == int(np.nanargmax(edited))
        np.testing.assert_array_equal(logits, edited)  # read, never written
    finally:
        logits[:] = saved
        fast.close()
        ref.close()


def edit_negative(x: np.ndarray) -> None:  # a penalized logit <= 0 is multiplied
    x[:] = -np.abs(x) - 1


@pytest.mark.parametrize("penalty", [1.3, 0.8])  # above 1 the penalty only lowers what it touches, below it raises
@pytest.mark.parametrize("edit", sorted(EDITS) + ["negative"])
def test_argmax_after_the_repeat_penalty_is_the_chain_s_token(llm: Llama, monkeypatch: pytest.MonkeyPatch,
                                                               edit: str, penalty: float) -> None:
    params = SamplingParams(temperature=0, repeat_penalty=penalty, penalty_last_n=3)
    fast, ref = (sampler(llm, params, monkeypatch, argmax) for argmax in (True, False))
    assert fast._argmax and not ref._argmax
    p = lib.llama_get_logits_ith(llm._ctx.ptr, -1)
    logits = np.frombuffer(ffi.buffer(p, 4 * llm.n_vocab()), dtype=np.float32)
    saved = logits.copy()
    try:
        (EDITS.get(edit) or edit_negative)(logits)
        edited = logits.copy()
        best = [int(t) for t in np.argsort(-np.nan_to_num(edited, nan=-np.inf), kind="stable")[:3]]
        for t in (best[0], best[1], best[0]):  # seen by both: the penalties count them
            fast.accept(t)
            ref.accept(t)
        tokens = []
        for _ in range(8):  # each token sampled is penalized next, the oldest of the last 3 no more
            token = fast.sample(llm._ctx, -1)
            assert token == ref.sample(llm._ctx, -1)
            tokens.append(token)
        if edit in ("as decoded", "negative") and penalty > 1:  # the penalty moves the greedy token
            assert len(set(tokens)) > 1
        np.testing.assert_array_equal(logits, edited)  # read, never written
    finally:
        logits[:] = saved
        fast.close()
        ref.close()


def test_a_nan_after_penalized_argmax_tokens_goes_to_the_chain_with_them(llm: Llama,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    params = SamplingParams(temperature=0, repeat_penalty=1.5, penalty_last_n=8)
    fast, ref = (sampler(llm, params, monkeypatch, argmax) for argmax in (True, False))
    p = lib.llama_get_logits_ith(llm._ctx.ptr, -1)
    logits = np.frombuffer(ffi.buffer(p, 4 * llm.n_vocab()), dtype=np.float32)
    saved = logits.copy()
    try:
        logits[:] = -np.inf
        logits[:5] = [5.0, 4.9, 4.8, 4.7, 4.0]
        taken = [fast.sample(llm._ctx, -1) for _ in range(3)]  # the argmax path: 0, then 1 and 2 (0 penalized)
        assert taken == [ref.sample(llm._ctx, -1) for _ in range(3)] == [0, 1, 2]
        logits[3] = np.nan  # argmax stops at it: the chain decides, having seen 0, 1 and 2 (alone it would take 0)
        token = fast.sample(llm._ctx, -1)
        assert token == ref.sample(llm._ctx, -1) == 4
        assert fast.sample(llm._ctx, -1) == ref.sample(llm._ctx, -1)
    finally:
        logits[:] = saved
        fast.close()
        ref.close()


@pytest.mark.parametrize("params", [SamplingParams(temperature=0, repeat_penalty=1.1, frequency_penalty=0.1),
                                    SamplingParams(temperature=0, presence_penalty=0.5),
                                    SamplingParams(temperature=0, logit_bias={5: 1.0}),
                                    SamplingParams(temperature=0, grammar='root ::= "a"'),
                                    SamplingParams(temperature=0.8)])
def test_the_chain_samples_when_anything_else_is_in_it(llm: Llama, monkeypatch: pytest.MonkeyPatch,
                                                       params: SamplingParams) -> None:
    s = sampler(llm, params, monkeypatch, True)
    try:
        assert not s._argmax
    finally:
        s.close()


def test_greedy_text_is_the_same_with_the_switch_off(llm: Llama, monkeypatch: pytest.MonkeyPatch) -> None:
    out = {}
    for argmax in ("1", "0"):
        monkeypatch.setenv("PYLLAMA_MOE_GREEDY_ARGMAX", argmax)
        llm.reset()
        res = llm.create_completion("Once upon a time", max_tokens=24, temperature=0.0)
        out[argmax] = (res["choices"][0]["text"], res["usage"]["completion_tokens"])
    assert out["1"] == out["0"]
    assert out["1"][1] > 0
