"""Patch 0007: the penalties sampler finds the penalized tokens by id when the candidates are in token
order. The logits and the sampled tokens are the same as with the scan (LLAMA_SAMPLER_PENALTIES_INDEXED=0)."""

from __future__ import annotations

import numpy as np
import pytest

from pyllama_moe.ffi import ffi, lib
from pyllama_moe.llama import Llama
from pyllama_moe.sampler import _TOKEN_DATA

from llama_models import model_path

N_VOCAB = 5000
HISTORY = [3, 17, 17, 4999, 0, 256, 3, 3, 1234]


def penalized(logits: np.ndarray, order: np.ndarray, indexed: bool, monkeypatch: pytest.MonkeyPatch) -> np.ndarray:
    """The logits by token after a penalties sampler (repeat, frequency and presence) saw HISTORY."""
    monkeypatch.setenv("LLAMA_SAMPLER_PENALTIES_INDEXED", "1" if indexed else "0")
    smpl = lib.llama_sampler_init_penalties(N_VOCAB, 64, 1.3, 0.25, 0.5)  # reads the switch here
    try:
        for tok in HISTORY:
            lib.llama_sampler_accept(smpl, tok)
        cur = ffi.new("llama_token_data[]", len(order))
        view = np.frombuffer(ffi.buffer(cur), dtype=_TOKEN_DATA)
        view["id"], view["logit"], view["p"] = order, logits[order], 0.0
        arr = ffi.new("llama_token_data_array *", {"data": cur, "size": len(order), "selected": -1, "sorted": True})
        lib.llama_sampler_apply(smpl, arr)
        assert not arr.sorted
        out = np.full(N_VOCAB, np.nan, dtype=np.float32)
        out[view["id"]] = view["logit"]
        return out
    finally:
        lib.llama_sampler_free(smpl)


@pytest.mark.parametrize("case", ["token order", "shuffled", "subset"])
def test_same_logits_as_the_scan(monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    rng = np.random.default_rng(1)
    logits = (rng.standard_normal(N_VOCAB) * 4).astype(np.float32)
    order = {"token order": np.arange(N_VOCAB, dtype=np.int32),
             "shuffled": rng.permutation(N_VOCAB).astype(np.int32),
             # after a top-k: fewer candidates, some of them at the index of their id by chance
             "subset": np.array([0, 1, 3, 9, 17, 4999, 256, 5], dtype=np.int32)}[case]
    fast = penalized(logits, order, True, monkeypatch)
    scan = penalized(logits, order, False, monkeypatch)
    assert fast.tobytes() == scan.tobytes()
    # and the penalties did apply: the repeated tokens lost, the others kept their logits
    seen = np.isin(np.arange(N_VOCAB), order)
    hit = np.zeros(N_VOCAB, dtype=bool)
    hit[[t for t in set(HISTORY) if t in set(order.tolist())]] = True
    assert (fast[hit] < logits[hit]).all()
    assert (fast[seen & ~hit] == logits[seen & ~hit]).all()


def test_same_tokens_with_a_fixed_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    kw = {"max_tokens": 48, "temperature": 0.8, "top_p": 0.95, "top_k": 40, "repeat_penalty": 1.1,
          "frequency_penalty": 0.2, "presence_penalty": 0.1, "seed": 7}
    with Llama(str(model_path()), n_ctx=128, verbose=False) as llm:
        texts = []
        for indexed in ("1", "0"):
            monkeypatch.setenv("LLAMA_SAMPLER_PENALTIES_INDEXED", indexed)
            llm.reset()
            texts.append(llm.create_completion("The quick brown fox", **kw)["choices"][0]["text"])
    assert texts[0] == texts[1] and len(texts[0]) > 0
