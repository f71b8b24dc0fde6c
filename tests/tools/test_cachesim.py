"""The device lookup's CLOCK replayed on routing (pyllama_moe.tools.cachesim), with and without the prediction."""

from __future__ import annotations

import numpy as np
import pytest

from pyllama_moe.tools.cachesim import (
    Clock,
    belady,
    class_lru,
    policies,
    predicted_topk,
    simulate,
    simulate_hybrid,
)
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


def test_a_prediction_copies_its_best_misses_first_and_no_more_than_its_budget() -> None:
    clock = Clock(8)
    clock.lookup([(0, 0), (0, 1)])
    # best first: expert 7, then 3 (already cached: pinned, not copied), then 5 and 2; a budget of 2 copies 7 and 5
    clock.lookup([(1, 3)])
    clock.lookup([(0, 0)])
    clock.lookup([(1, 7), (1, 3), (1, 5), (1, 2)], prefetch=True, budget=2)
    assert clock.stats.predicted == 2 and {(1, 7), (1, 5)} <= set(clock.slot_of) and (1, 2) not in clock.slot_of
    # over a recording: never more copies than the budget per layer and token
    rec = recording(200, 4, 16, 4, seed=3)
    predicted = predicted_topk(rec.topk, rec.router_in, perfect_routers(rec))
    for budget in (1, 2):
        on = simulate(rec.topk, rec.n_expert, 0.25, predicted, budget=budget)
        assert 0 < on.predicted <= budget * 3 * 200
    assert simulate(rec.topk, rec.n_expert, 0.25, predicted, budget=1).predicted < \
        simulate(rec.topk, rec.n_expert, 0.25, predicted).predicted


def test_the_prediction_targets_the_next_recorded_moe_layer() -> None:
    # layers 0, 2, 4 are MoE (1 and 3 dense, as in Llama 4): layer 0's input predicts layer 2, 2's predicts 4
    rec = recording(50, 5, 16, 4, seed=4)
    x = np.random.default_rng(5).standard_normal((50, 16)).astype(np.float32)
    moe = Recording(rec.n_expert, {il: rec.topk[il] for il in (0, 2, 4)}, {0: x, 2: -x})
    routers = {il: np.eye(rec.n_expert, dtype=np.float32) for il in (2, 4)}
    predicted = predicted_topk(moe.topk, moe.router_in, routers)
    assert sorted(predicted) == [2, 4]
    # best first: the largest of each token's inputs, in order
    assert (predicted[2] == np.argsort(-x, axis=1, kind="stable")[:, :4]).all()
    assert (predicted[4] == np.argsort(x, axis=1, kind="stable")[:, :4]).all()


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


# ---------------------------------------------------------------- Belady's optimum and the recency-frequency classes


def test_belady_evicts_what_is_used_again_the_latest() -> None:
    # one layer, one expert per token, a cache of 2 slots (2 of 8): a b c a b c ... LRU and CLOCK always evict the
    # expert needed next and hit nothing; the optimum keeps one of the two it holds for the round after
    topk = {0: np.array([[e] for e in [0, 1, 2] * 20], dtype=np.int32)}
    assert belady(topk, 8, 0.25) == pytest.approx(29 / 60)  # after the first two misses, every second access hits
    rec = Recording(8, topk, {})
    from pyllama_moe.tools.routing import lru_hit_rate

    assert lru_hit_rate(rec, 0.25) == 0.0 and simulate(topk, 8, 0.25).hit_rate == 0.0


def test_belady_bounds_every_policy_from_above() -> None:
    rec = recording(300, 4, 32, 4, seed=5)
    for f in (0.25, 0.5):
        rates = policies(rec.topk, rec.n_expert, (f,))[f"{int(f * 100)}%"]
        assert rates["belady"] >= max(rates["clock"], rates["class_lru"])
        assert 0.0 < rates["clock"] < rates["belady"] <= 1.0
    # a cache of every expert: each expert misses once, whatever the policy
    full = policies(rec.topk, rec.n_expert, (1.0,))["100%"]
    assert full["belady"] == full["clock"] == full["class_lru"]


def test_classes_keep_a_frequent_expert_through_a_scan() -> None:
    # expert 0 of a layer comes back every sixth token; between its uses a scan of 5 experts seen once passes through
    # a cache of 4 slots. LRU evicts expert 0 before each return and hits nothing. The classes evict it too while its
    # decayed count is below 2 (class 0: the oldest goes), then at its third use it enters class 1, where its age
    # counts half, and stays: every use from the fourth on is a hit
    rows = []
    scan = iter(range(1, 10_000))
    for _ in range(40):
        rows.append([0])
        rows.extend([next(scan) % 60 + 1] for _ in range(5))
    topk = {0: np.array(rows, dtype=np.int32)}
    rec = Recording(64, topk, {})
    from pyllama_moe.tools.routing import lru_hit_rate

    f = 4 / 64
    assert lru_hit_rate(rec, f) == 0.0
    assert class_lru(topk, 64, f) == pytest.approx(37 / len(rows))
    # no frequency to see (each expert once): the classes evict the oldest, as LRU does
    once = {0: np.arange(40, dtype=np.int32).reshape(-1, 1)}
    assert class_lru(once, 64, f) == 0.0


def test_a_hybrid_without_a_host_share_is_the_device_lookup() -> None:
    rec = recording(64, 3, 16, 4, seed=5)
    for f in (0.25, 0.5):
        plain, hybrid = simulate(rec.topk, 16, f), simulate_hybrid(rec.topk, 16, f, 0)
        assert (hybrid.hits, hybrid.uploads, hybrid.host) == (plain.hits, plain.misses, 0)
        assert hybrid.hit_rate == pytest.approx(plain.hit_rate)


def test_the_cpu_taking_the_coldest_misses_keeps_the_hot_expert_cached() -> None:
    # every token selects expert 7 and a new one; a cache of 2 slots, the CPU takes one miss a lookup. Taking the last
    # of the miss list (ascending ids) gives the CPU expert 7 every time, so it is never cached; taking the coldest
    # leaves 7 to the upload once, and it is found ever after
    n = 6
    topk = {0: np.array([[1 + t, 7] for t in range(n)], dtype=np.int32)}
    last = simulate_hybrid(topk, 8, 0.25, 1, "last")
    cold = simulate_hybrid(topk, 8, 0.25, 1, "coldest")
    assert (last.hits, last.uploads, last.host) == (0, n, n)
    assert (cold.hits, cold.uploads, cold.host) == (n - 1, 1, n)
    assert cold.per_token() == (1 / n, 1.0)
    with pytest.raises(ValueError):
        simulate_hybrid(topk, 8, 0.25, 1, "hottest")
