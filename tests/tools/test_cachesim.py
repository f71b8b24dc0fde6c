"""The device lookup's CLOCK replayed on routing (pyllama_moe.tools.cachesim), with and without the prediction."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pyllama_moe.tools.cachesim import (
    VICTIMS,
    Clock,
    Setting,
    belady,
    class_lru,
    policies,
    predicted_ahead,
    predicted_topk,
    replay,
    simulate,
    simulate_hybrid,
    victims,
)
from pyllama_moe.tools.routing import Recording
from pyllama_moe.tools.slotcache import ClassCache, FreqClock


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


# ---------------------------------------------------------------- the prediction several layers ahead and its pins


def test_the_prediction_d_layers_ahead_reads_the_input_d_layers_before() -> None:
    rec = recording(40, 5, 16, 4, seed=6)
    rng = np.random.default_rng(7)
    ins = {il: rng.standard_normal((40, 16)).astype(np.float32) for il in rec.layers}
    routers = {il: np.eye(16, dtype=np.float32) for il in rec.layers}
    ahead = predicted_ahead(rec.topk, ins, routers, 3)
    assert sorted(ahead) == [1, 2, 3] and sorted(ahead[1]) == [1, 2, 3, 4] and sorted(ahead[3]) == [3, 4]
    for d in (1, 2, 3):
        for b, p in ahead[d].items():
            assert (p == np.argsort(-ins[b - d], axis=1, kind="stable")[:, :4]).all()
    assert all((ahead[1][b] == p).all() for b, p in predicted_topk(rec.topk, ins, routers).items())
    with pytest.raises(ValueError):
        predicted_ahead(rec.topk, ins, routers, 0)


def test_a_prediction_ahead_is_pinned_through_the_lookups_between() -> None:
    # 5 slots; after layer 0's lookup (experts 0, 1: slots 0, 1), the prediction for layer 3 (two lookups between)
    # copies X into slot 2. Layer 1's three misses take the empty slots 3, 4 and, the hand having cleared every bit
    # on its round, slot 0; layer 2's first miss takes slot 1, and the next slot the hand meets is X's
    x = (3, 9)
    layer1, layer2 = [(1, 0), (1, 1), (1, 2)], [(2, 0), (2, 1), (2, 2)]
    for protect in ("pin", "pin+ref", "ref"):
        clock = Clock(5, protect)
        clock.lookup([(0, 0), (0, 1)])
        clock.lookup([x], prefetch=True, ahead=2)
        s = clock.slot_of[x]
        assert s == 2 and clock.ref[s] == (protect != "pin")
        assert clock.pin[s] == clock.epoch + (2 if protect != "ref" else 0)
        clock.lookup(layer1)
        clock.lookup(layer2)
        if protect == "ref":  # only its bit, which the hand cleared on its first round: taken on its second
            assert x not in clock.slot_of and clock.stats.wasted == 1
            continue
        # pinned until layer 3's lookup: the hand passes it by and takes layer 1's first two (slots 3, 4), and layer 3
        # finds it
        assert clock.owner[s] == x and set(clock.slot_of) == {x, layer1[2], *layer2}
        clock.lookup([x])
        assert clock.stats.used == 1 and clock.stats.wasted == 0


def test_a_pin_is_never_moved_back_and_lapses_at_the_lookup_it_was_for() -> None:
    clock = Clock(8)
    clock.lookup([(0, 0)])
    clock.lookup([(3, 4)], prefetch=True, ahead=2)  # for the third lookup from here
    s = clock.slot_of[(3, 4)]
    e = clock.epoch
    clock.lookup([(1, 0)])
    clock.lookup([(3, 4)], prefetch=True, ahead=0)  # a nearer prediction of it: the pin stays
    assert clock.pin[s] == e + 2
    clock.lookup([(2, 0)])
    assert clock.pin[s] >= clock.epoch  # still pinned at the lookup before its layer's
    clock.lookup([(3, 5)])  # its layer selects something else: the pin has lapsed, it may go
    assert clock.pin[s] < clock.epoch + 1 and clock.prefetched[s]


def test_the_prediction_of_a_layer_two_ahead_is_found_by_its_lookup() -> None:
    # a useless prediction one layer ahead (experts the recording never selects) and a right one two ahead: at depth
    # 1 nothing predicted is used, at depth 2 the lookups of layers 2..3 find what was copied for them
    rec = recording(200, 4, 16, 4, seed=8)
    rec = Recording(12, {il: t % 12 for il, t in rec.topk.items()}, {})
    wrong = {il: np.tile(np.arange(12, 16), (200, 1)) for il in (1, 2, 3)}
    right = {il: rec.topk[il] for il in (2, 3)}
    ahead = {1: wrong, 2: right}
    one = replay(rec.topk, 16, 0.5, ahead, depth=1)
    two = replay(rec.topk, 16, 0.5, ahead, depth=2)
    assert one.used == 0 and one.predicted > 0
    assert two.used > 0 and two.misses < one.misses and two.hit_rate > one.hit_rate
    # at most the budget per predicted layer: N per lookup for each of the D layers it predicts
    capped = replay(rec.topk, 16, 0.5, ahead, depth=2, budget=1)
    assert capped.predicted <= 1 * (3 + 2) * 200 and capped.predicted < two.predicted


def test_the_depth_is_cut_to_what_the_slots_hold() -> None:
    # 4 experts a lookup, 8 slots: depth 3 would pin (3 + 1) * 4 = 16 slots at a lookup; depth 2, (1 + 1) * 4 = 8
    rec = recording(100, 5, 16, 4, seed=9)
    ahead = {d: {il: rec.topk[il] for il in rec.layers[d:]} for d in (1, 2, 3)}
    f = 8 / (16 * 5)
    assert replay(rec.topk, 16, f, ahead, depth=3) == replay(rec.topk, 16, f, ahead, depth=2)
    assert replay(rec.topk, 16, f, ahead, depth=2) != replay(rec.topk, 16, f, ahead, depth=1)


# ---------------------------------------------------------------- victim rules for the device lookup


def test_a_use_counter_keeps_the_hot_expert_that_clock_evicts() -> None:
    # 4 slots: expert A used three times, then B, C, D once each; E misses. CLOCK's hand clears the four bits and
    # comes back to A: the expert used most goes. With a counter of two bits A has 3 to the others' 1: the hand takes
    # B, then C and D for the next misses, and A only after it has passed it three times
    keys = [(0, 0), (0, 0), (0, 0), (0, 1), (0, 2), (0, 3)]
    clock, freq = Clock(4), FreqClock(4, count_max=3)
    for c in (clock, freq):
        for k in keys:
            c.lookup([k])
        c.lookup([(0, 4)])
    assert (0, 0) not in clock.slot_of
    assert (0, 0) in freq.slot_of and (0, 1) not in freq.slot_of
    for e in (5, 6):
        freq.lookup([(0, e)])
    assert (0, 0) in freq.slot_of and set(freq.slot_of) == {(0, 0), (0, 4), (0, 5), (0, 6)}
    freq.lookup([(0, 7)])
    assert (0, 0) not in freq.slot_of
    # a counter of one use is CLOCK's bit
    rec = recording(200, 3, 16, 4, seed=15)
    one, bit = FreqClock(12, count_max=1), Clock(12)
    for t in range(200):
        for il in rec.layers:
            for c in (one, bit):
                c.lookup([(il, e) for e in sorted(set(rec.topk[il][t].tolist()))])
    assert one.stats == bit.stats and one.owner == bit.owner and one.stats.hits > 0
    with pytest.raises(ValueError):
        FreqClock(4, count_max=0)


def test_a_burst_keeps_a_hot_expert_through_a_gap_of_more_than_a_round() -> None:
    # expert 0 three times in five tokens, then 8 experts seen once, over and over; 8 slots. LRU and CLOCK lose it in
    # every gap (8 newer experts; the hand passes it twice) and find it only within its bursts; the counter and the
    # classes keep it through the gap nearly always, as Belady does
    rows: list[list[int]] = []
    scan = iter(range(1, 10_000))
    for _ in range(30):
        rows += [[0], [next(scan)], [0], [next(scan)], [0]]
        rows.extend([next(scan)] for _ in range(8))
    topk = {0: np.array(rows, dtype=np.int32)}
    f = 8 / 4096
    hits = {v: replay(topk, 4096, f, victim=v).hits for v in ("clock", "lru", "freq2", "classes")}
    assert hits["clock"] == hits["lru"] == 2 * 30  # within the bursts only
    assert hits["freq2"] >= 3 * 30 - 3 and hits["classes"] == 3 * 30 - 1  # every use but the first (nearly)
    assert belady(topk, 4096, f) * len(rows) == pytest.approx(3 * 30 - 1)


def test_the_classes_under_the_device_rules_are_upstreams_and_one_class_is_lru() -> None:
    # one expert a lookup (no two experts of a lookup to order differently) and 4 layers (class_lru's times, token +
    # layer / 4, exact in binary): the same hits, exactly
    rng = np.random.default_rng(10)
    topk = {il: rng.zipf(1.6, (600, 1)).astype(np.int32) % 24 for il in range(4)}
    rec = Recording(24, topk, {})
    from pyllama_moe.tools.routing import lru_hit_rate

    for f in (0.1, 0.25, 0.5):
        assert replay(topk, 24, f, victim="classes").hit_rate == pytest.approx(class_lru(topk, 24, f))
        assert replay(topk, 24, f, victim="lru").hit_rate == pytest.approx(class_lru(topk, 24, f, n_classes=1))
        assert replay(topk, 24, f, victim="lru").hit_rate == pytest.approx(lru_hit_rate(rec, f))
    # a count kept per slot forgets an expert's uses at its eviction: not upstream's
    assert any(replay(topk, 24, f, victim="classes_slot").hits != replay(topk, 24, f, victim="classes").hits
               for f in (0.1, 0.25))


def test_belady_bounds_every_victim_rule_without_a_prediction() -> None:
    for seed, k in ((11, 4), (12, 2)):
        rec = recording(300, 4, 32, k, seed=seed)
        for f in (0.1, 0.25, 0.5):
            rows = victims(rec.topk, 32, (f,), [Setting(v) for v in VICTIMS])[f"{int(f * 100)}%"]
            best = rows.pop("belady")["hit_rate"]
            assert set(rows) == set(VICTIMS)
            assert all(0.0 < r["hit_rate"] <= best for r in rows.values()), (f, best, rows)


def test_the_settings_name_their_rows_and_a_prediction_needs_its_experts() -> None:
    assert Setting("freq2").name == "freq2"
    assert Setting("clock", 2, 2).name == "clock D=2 N=2" and Setting("lru", 1, None, "ref").name == "lru D=1 N=all ref"
    rec = recording(50, 3, 16, 4, seed=13)
    with pytest.raises(ValueError, match="ahead"):
        victims(rec.topk, 16, (0.5,), [Setting("clock", 1)])
    with pytest.raises(ValueError, match="victim"):
        replay(rec.topk, 16, 0.5, victim="random")
    with pytest.raises(ValueError, match="protect"):
        Clock(4, "always")
    # a prediction's copies count per token, and those evicted unused
    ahead = {1: {il: np.tile(np.arange(12, 16), (50, 1)) for il in (1, 2)}}
    rows = victims(rec.topk, 16, (0.5,), [Setting("clock", 1, None)], ahead)["50%"]["clock D=1 N=all"]
    st = replay(rec.topk, 16, 0.5, ahead)
    assert rows["copies"] == pytest.approx((st.misses + st.predicted) / 50) and rows["wasted"] == st.wasted / 50 > 0


def test_a_pin_lasts_until_the_lookup_of_its_layer_and_no_longer() -> None:
    # 2 experts a lookup, 6 layers, 8 slots, predictions (wrong: never selected) 1 and 2 layers ahead. Right after
    # layer m's lookup the pinned slots are its 2, the 2 copied before it for layer m + 1 and the 2 + 2 it now copies:
    # all 8, so every prediction copies both of its experts. A pin one lookup longer would also hold the copies made
    # for layer m itself, and the predictions would run out of slots
    rng = np.random.default_rng(14)
    n, n_layer = 60, 6
    topk = {il: np.stack([rng.choice(8, 2, replace=False) for _ in range(n)]).astype(np.int32)
            for il in range(n_layer)}
    ahead = {1: {il: np.tile([8, 9], (n, 1)) for il in range(1, n_layer)},
             2: {il: np.tile([10, 11], (n, 1)) for il in range(2, n_layer)}}
    st = replay(topk, 32, 8 / (32 * n_layer), ahead, depth=2)
    assert st.predicted == 2 * ((n_layer - 1) + (n_layer - 2)) * n and st.used == 0
    assert st.wasted == st.predicted - 2  # all but the last copies, still cached at the end


def test_a_softer_protection_marks_what_a_prediction_finds_cached() -> None:
    # "pin": a prediction's hit is only pinned; "pin+ref": it is also marked as used (CLOCK's bit; the classes'
    # recency, not their count)
    for protect in ("pin", "pin+ref"):
        clock, classes = Clock(4, protect), ClassCache(4, protect)
        for c in (clock, classes):
            c.lookup([(0, 0), (0, 1)])
            c.lookup([(1, 0)])
            c.lookup([(5, 5)], prefetch=True)  # takes a slot: the hand moves on, the clock clears nothing
        s = clock.slot_of[(0, 0)]
        clock.ref[s] = 0
        clock.lookup([(0, 0)], prefetch=True)
        assert clock.ref[s] == (protect == "pin+ref") and clock.pin[s] == clock.epoch
        s = classes.slot_of[(0, 0)]
        count = dict(classes.count)
        classes.lookup([(0, 0)], prefetch=True)
        assert classes.last[s] == (classes.epoch if protect == "pin+ref" else 1) and classes.count == count
        # a copy of "pin" is the first to go once its pin lapses; one of "pin+ref" counts as used now
        c = classes.slot_of[(5, 5)]
        assert classes.last[c] == (-math.inf if protect == "pin" else classes.epoch)
