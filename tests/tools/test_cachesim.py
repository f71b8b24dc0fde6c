"""The device lookup's CLOCK replayed on routing (pyllama_moe.tools.cachesim), with and without the prediction."""

from __future__ import annotations

import numpy as np
import pytest

from pyllama_moe.tools.cachesim import Clock, predicted_topk, simulate
from pyllama_moe.tools.routing import Recording


def recording(n_tokens: int, n_layer: int, n_expert: int, k: int, seed: int = 0) -> Recording:
    rng = np.random.default_rng(seed)
    topk = {il: np.stack([rng.choice(n_expert, k, replace=False) for _ in range(n_tokens)]).astype(np.int32)
            for il in range(n_layer)}
    return Recording(n_expert=n_expert, topk=topk, router_in={})


def perfect_routers(rec: Recording) -> dict[int, np.ndarray]:
    """Router inputs and routers (the identity) whose prediction of each layer after the first is its selection."""
    routers = {}
    for il in rec.layers[1:]:
        x = np.zeros((len(rec.topk[il]), rec.n_expert), dtype=np.float32)
        for t, sel in enumerate(rec.topk[il]):
            x[t, sel] = 1.0 + np.arange(len(sel))
        rec.router_in[il - 1] = x
        routers[il] = np.eye(rec.n_expert, dtype=np.float32)
    return routers


def test_a_cache_of_every_expert_misses_each_once() -> None:
    rec = recording(200, 3, 16, 4)
    st = simulate(rec.topk, rec.n_expert, 1.0)
    distinct = sum(len(np.unique(rec.topk[il])) for il in rec.layers)
    lookups = sum(len(set(row.tolist())) for il in rec.layers for row in rec.topk[il])
    assert st.misses == distinct and st.hits == lookups - distinct
    assert st.predicted == st.used == st.wasted == 0


def test_a_right_prediction_leaves_only_the_first_layer_to_miss() -> None:
    rec = recording(300, 4, 16, 4, seed=1)
    predicted = predicted_topk(rec.topk, rec.router_in, perfect_routers(rec))
    assert sorted(predicted) == [1, 2, 3]
    for il, p in predicted.items():
        assert (np.sort(p, axis=1) == np.sort(rec.topk[il], axis=1)).all()
    off, on = simulate(rec.topk, rec.n_expert, 0.25), simulate(rec.topk, rec.n_expert, 0.25, predicted)
    assert on.hits + on.misses == off.hits + off.misses  # the same lookups
    # layers 1..3 find every expert they miss prefetched: their misses are gone, layer 0's are left
    assert on.used > 0 and on.misses < off.misses
    assert on.hits > off.hits and on.misses_predicted > 0.5
    assert on.used + on.wasted <= on.predicted


def test_a_wrong_prediction_is_wasted_and_hides_nothing() -> None:
    rec = recording(300, 3, 16, 4, seed=2)
    # predicted: experts 12..15, which the recording never selects
    rec = Recording(rec.n_expert, {il: t % 12 for il, t in rec.topk.items()}, {})
    wrong = {il: np.tile(np.arange(12, 16), (300, 1)) for il in (1, 2)}
    on = simulate(rec.topk, rec.n_expert, 0.5, wrong)
    assert on.used == 0 and on.misses_predicted == 0.0
    assert on.predicted > 0 and on.wasted > 0
    assert on.predicted - on.wasted <= 2 * 4  # at most the last predictions of each layer are still cached


def test_a_prefetch_never_takes_the_slots_of_the_lookup_before_it() -> None:
    clock = Clock(4)
    clock.lookup([(0, 0), (0, 1), (0, 2), (0, 3)])
    clock.lookup([(1, 5), (1, 6)], prefetch=True)
    assert clock.stats.predicted == 0 and set(clock.slot_of) == {(0, 0), (0, 1), (0, 2), (0, 3)}
    # the next lookup's epoch frees them; a prefetch then takes unreferenced slots and leaves them unreferenced
    clock.lookup([(0, 0)])
    clock.lookup([(1, 5)], prefetch=True)
    s = clock.slot_of[(1, 5)]
    assert clock.ref[s] == 0 and clock.prefetched[s] and clock.stats.predicted == 1
    clock.lookup([(1, 5)])
    assert clock.stats.used == 1 and clock.ref[s] == 1 and not clock.prefetched[s]


def test_a_lookup_larger_than_the_cache_is_refused() -> None:
    with pytest.raises(ValueError, match="fit"):
        Clock(2).lookup([(0, 0), (0, 1), (0, 2)])
    with pytest.raises(ValueError, match="slot"):
        Clock(0)
