"""Patch 0006: the penalties sampler finds the penalized tokens by id when the candidates are in token
order, and scans them otherwise (shuffled, or a subset after a top-k). Both give the same logits, byte for byte."""

from __future__ import annotations

import numpy as np
import pytest

from pyllama_moe.ffi import ffi, lib
from pyllama_moe.sampler import _TOKEN_DATA

N_VOCAB = 5000
HISTORY = [3, 17, 17, 4999, 0, 256, 3, 3, 1234]


def penalized(logits: np.ndarray, order: np.ndarray) -> np.ndarray:
    """The logits by token after a penalties sampler (repeat, frequency and presence) saw HISTORY."""
    smpl = lib.llama_sampler_init_penalties(N_VOCAB, 64, 1.3, 0.25, 0.5)
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


@pytest.mark.parametrize("case", ["shuffled", "subset", "reversed"])
def test_by_id_gives_the_logits_of_the_scan(case: str) -> None:
    rng = np.random.default_rng(1)
    logits = (rng.standard_normal(N_VOCAB) * 4).astype(np.float32)
    by_id = penalized(logits, np.arange(N_VOCAB, dtype=np.int32))  # token order: found by id
    order = {"shuffled": rng.permutation(N_VOCAB).astype(np.int32),
             "reversed": np.arange(N_VOCAB - 1, -1, -1, dtype=np.int32),
             # after a top-k: fewer candidates, some of them at the index of their id by chance
             "subset": np.array([0, 1, 3, 9, 17, 4999, 256, 5], dtype=np.int32)}[case]
    scan = penalized(logits, order)
    seen = np.isin(np.arange(N_VOCAB), order)
    assert by_id[seen].tobytes() == scan[seen].tobytes()
    # and the penalties did apply: the repeated tokens lost, the others kept their logits
    hit = np.zeros(N_VOCAB, dtype=bool)
    hit[sorted(set(HISTORY))] = True
    assert (by_id[hit] < logits[hit]).all()
    assert (by_id[~hit] == logits[~hit]).all()
    # the formula: the repeat penalty divides a positive logit and multiplies a negative one, then frequency and
    # presence
    counts = {t: HISTORY.count(t) for t in set(HISTORY)}
    for t, c in counts.items():
        x = np.float32(logits[t])
        x = x / np.float32(1.3) if x > 0 else x * np.float32(1.3)
        assert by_id[t] == pytest.approx(float(x - np.float32(c) * np.float32(0.25) - np.float32(0.5)), rel=1e-6)
