"""The MoE cache's device lookup replayed on recorded routing, with and without the prediction, beside the policies
it could have: Belady's optimum, upstream's recency-frequency classes and the victim rules of :mod:`.slotcache`.

One CLOCK over the slots of every layer's experts, looked up token by token and layer by layer as a decode step
looks it up, by the rules of ``GGML_OP_MOE_CACHE_LOOKUP`` (``ggml.h``): a lookup pins the slots of its experts for its
epoch, and each miss takes the first slot from the hand that is neither pinned nor referenced, clearing the reference
bits it passes. With the prediction (``LLAMA_MOE_CACHE_PREDICT=N[:D]``), after the lookup of layer l the experts that
the routers of the next D MoE layers select on layer l's router input (the stale gate, :func:`predicted_ahead`) are
prefetched, nearest layer first, for each layer best first and at most N of those missing: in the epoch of that
lookup, into slots that start unreferenced, and the slots of a prediction's hits and copies stay pinned until the
lookup of the layer it was made for (``ggml_moe_cache_predict_ahead``), so that no lookup or farther prediction
before then takes them; the lookup of that layer then finds those it selects. :func:`replay` runs it with any victim
rule of :mod:`.slotcache` (:data:`VICTIMS`) and any way of protecting what was predicted; :func:`victims` tabulates
settings of both against Belady's optimum; :func:`simulate` is today's device (CLOCK, the next layer only).

Two other policies over the same lookups bound what a better policy could still buy:

- Belady's optimum (:func:`belady`): each miss evicts the cached expert whose next use is the farthest away (it knows
  the future; no policy that copies only what a lookup misses can hit more);
- the recency-frequency classes that upstream llama.cpp's cache moved to after our pin (:func:`class_lru`, modelled
  from its description): each expert keeps a use count decayed with a half-life of 128 tokens, kept across evictions;
  its class is the count's log2 (at most 7) as of its last use, and a miss evicts the expert with the largest age
  (tokens since its last use) over 2^class. Under the op's rules (pins, the prediction) it is :data:`VICTIMS`'
  ``"classes"``.

And the hybrid decode's split (:func:`simulate_hybrid`): the CPU computes up to ``host_max`` of a lookup's misses,
which take no slot, so they are never found again; which misses it takes decides how much the cache loses.

Public API: :func:`simulate`, :func:`replay`, :func:`victims`, :class:`Setting`, :data:`VICTIMS`, :class:`Clock`,
:class:`ClockStats`, :func:`predicted_topk`, :func:`predicted_ahead`, :func:`belady`, :func:`class_lru`,
:func:`policies`, :func:`simulate_hybrid`, :class:`HybridStats`.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections import Counter, OrderedDict
from collections.abc import Iterator, Mapping, Sequence

import numpy as np
import numpy.typing as npt

from pyllama_moe.tools.slotcache import CLASS_HALF_LIFE, N_CLASSES, VICTIMS, Clock, ClockStats, Key, make_cache

__all__ = ["VICTIMS", "Clock", "ClockStats", "HybridStats", "Setting", "belady", "class_lru", "policies",
           "predicted_ahead", "predicted_topk", "replay", "simulate", "simulate_hybrid", "victims"]

Routing = Mapping[int, npt.NDArray[np.integer]]  # per MoE layer: the experts each token selects, [n_tokens, K]


def predicted_topk(topk: Routing, router_in: Mapping[int, npt.NDArray[np.float32]],
                   routers: Mapping[int, npt.NDArray[np.float32]]) -> dict[int, npt.NDArray[np.integer]]:
    """Per recorded MoE layer b that has a router, with the MoE layer a recorded before it (dense layers between are
    skipped, as the device's prediction does): the top-K of b's router (``[n_expert, n_embd]``) applied to a's router
    input (``[n_tokens, n_embd]``), best first (ties: the lower expert), for every token (``[n_tokens, K]``)."""
    return predicted_ahead(topk, router_in, routers, 1)[1]


def predicted_ahead(topk: Routing, router_in: Mapping[int, npt.NDArray[np.float32]],
                    routers: Mapping[int, npt.NDArray[np.float32]], depth: int
                    ) -> dict[int, dict[int, npt.NDArray[np.integer]]]:
    """Per distance ``d`` in 1..``depth``, per recorded MoE layer b that is the ``d``-th after a recorded MoE layer a:
    the top-K of b's router on a's router input (the stale gate), as :func:`predicted_topk` gives it for ``d`` 1."""
    if depth < 1:
        raise ValueError(f"depth must be at least 1, not {depth}")
    layers = sorted(topk)
    out: dict[int, dict[int, npt.NDArray[np.integer]]] = {}
    for d in range(1, depth + 1):
        out[d] = {}
        for a, b in zip(layers, layers[d:], strict=False):
            if a not in router_in or b not in routers:
                continue
            logits = router_in[a] @ routers[b].T  # [n_tokens, n_expert]
            out[d][b] = np.argsort(-logits, axis=1, kind="stable")[:, :topk[b].shape[1]]
    return out


def simulate(topk: Routing, n_expert: int, fraction: float, predicted: Routing | None = None,
             budget: int | None = None) -> ClockStats:
    """The device lookup of a cache holding ``fraction`` of all the layers' experts over the routing ``topk``,
    decoded one token at a time; with ``predicted`` (:func:`predicted_topk`), each lookup of layer l is followed by
    the prefetch of ``predicted[next]`` for the next recorded layer, at most ``budget`` of its misses."""
    return replay(topk, n_expert, fraction, {1: predicted} if predicted else None, budget=budget)


def replay(topk: Routing, n_expert: int, fraction: float, ahead: Mapping[int, Routing] | None = None,
           depth: int = 1, budget: int | None = None, victim: str = "clock", protect: str = "pin") -> ClockStats:
    """The device lookup of a cache of ``fraction`` of all the layers' experts whose victim rule is ``victim``
    (:data:`VICTIMS`), decoded one token at a time. With ``ahead`` (:func:`predicted_ahead`), each lookup of layer l
    is followed by the predictions of the next ``depth`` recorded layers of the token, nearest first, each copying at
    most ``budget`` of its misses and pinning its slots until the lookup of its layer (``protect``: how). As the
    context does (``llama-moe-cache.cpp``), the depth is cut to fit the slots: each lookup meets the pins of the
    depth*(depth - 1)/2 predictions made before it for the layers after it and needs room for its own experts."""
    layers = sorted(topk)
    if not layers:
        return ClockStats()
    cache = make_cache(victim, _capacity(topk, n_expert, fraction), protect, len(layers))
    n_sel = max(topk[il].shape[1] for il in layers)
    while depth > 1 and (depth * (depth - 1) // 2 + 1) * n_sel > cache.n_slots:
        depth -= 1
    n_tokens = len(topk[layers[0]])
    for t in range(n_tokens):
        for i, il in enumerate(layers):
            cache.lookup([(il, e) for e in sorted(set(topk[il][t].tolist()))])
            for d in range(1, depth + 1) if ahead else ():
                if i + d >= len(layers):
                    break
                nl = layers[i + d]
                nxt = ahead.get(d, {}).get(nl) if ahead else None
                if nxt is None:
                    break
                cache.lookup([(nl, e) for e in dict.fromkeys(nxt[t].tolist())], prefetch=True, budget=budget,
                             ahead=d - 1)
    cache.stats.n_tokens = n_tokens
    return cache.stats


@dataclasses.dataclass
class HybridStats:
    """Per decoded token: the experts the lookups found, uploaded and left to the CPU."""

    n_tokens: int = 0
    hits: int = 0
    uploads: int = 0
    host: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hits / max(self.hits + self.uploads + self.host, 1)

    def per_token(self) -> tuple[float, float]:
        """Uploads and experts on the CPU per token."""
        return self.uploads / max(self.n_tokens, 1), self.host / max(self.n_tokens, 1)


HYBRID_CHOICES = ("last", "coldest")


def simulate_hybrid(topk: Routing, n_expert: int, fraction: float, host_max: int, choose: str = "last",
                    ) -> HybridStats:
    """The device lookup as :func:`simulate` replays it, without the prediction, where the CPU takes up to
    ``host_max`` of each lookup's misses: ``"last"``, the last of the miss list in ascending expert order (what the
    lookup kernel leaves to the host, ggml.h), or ``"coldest"``, those of the experts used least so far (the
    counts of every selection before this one, ties to the lower expert). The CPU's experts take no slot."""
    if choose not in HYBRID_CHOICES:
        raise ValueError(f"choose must be one of {HYBRID_CHOICES}, not {choose!r}")
    layers = sorted(topk)
    if not layers:
        return HybridStats()
    clock = Clock(_capacity(topk, n_expert, fraction))
    uses: Counter[Key] = Counter()
    n_tokens = len(topk[layers[0]])
    n_host = 0
    for t in range(n_tokens):
        for il in layers:
            keys = [(il, e) for e in sorted(set(topk[il][t].tolist()))]
            misses = [k for k in keys if k not in clock.slot_of]
            if choose == "last":
                host = set(misses[-host_max:] if host_max else [])
            else:
                host = set(sorted(misses, key=lambda k: (uses[k], k))[:host_max])
            clock.lookup([k for k in keys if k not in host])
            n_host += len(host)
            uses.update(keys)
    # the clock saw only the lookups' own part: its hits and copies are the hybrid's
    return HybridStats(n_tokens, clock.stats.hits, clock.stats.misses, n_host)


# ---------------------------------------------------------------- other policies over the same lookups


def _lookups(topk: Routing) -> Iterator[tuple[int, int, list[int]]]:
    """``(token, layer, keys)`` of every lookup in decode order: a layer's distinct experts of a token, the key of
    expert ``e`` of the ``i``-th layer being ``i * n_expert + e`` (computed by the callers)."""
    layers = sorted(topk)
    n_tokens = len(topk[layers[0]]) if layers else 0
    for t in range(n_tokens):
        for i, il in enumerate(layers):
            yield t, i, sorted(set(topk[il][t].tolist()))


def _capacity(topk: Routing, n_expert: int, fraction: float) -> int:
    """Slots of a cache of ``fraction`` of every layer's experts, at least one lookup's: the device lookup needs room
    for one token's experts (llama_moe_cache does not cache a smaller group)."""
    k = max(topk[il].shape[1] for il in topk)
    return max(k, int(round(fraction * n_expert * len(topk))))


def belady(topk: Routing, n_expert: int, fraction: float) -> float:
    """The hit rate of Belady's optimum: a miss evicts the cached expert used again the latest (or never), never one
    of the lookup's own experts."""
    if not topk:
        return 0.0
    seq = [(i * n_expert + e, ln) for ln, (_, i, keys) in enumerate(_lookups(topk)) for e in keys]
    nxt = [0] * len(seq)
    last: dict[int, int] = {}
    for j in range(len(seq) - 1, -1, -1):
        nxt[j] = last.get(seq[j][0], len(seq))
        last[seq[j][0]] = j
    cap = _capacity(topk, n_expert, fraction)
    cached: dict[int, int] = {}  # key -> the position of its next use
    heap: list[tuple[int, int]] = []  # (-next use, key), stale entries skipped
    hits = 0
    j = 0
    while j < len(seq):
        end = j
        while end < len(seq) and seq[end][1] == seq[j][1]:
            end += 1
        group = {seq[i][0] for i in range(j, end)}
        for i in range(j, end):
            key = seq[i][0]
            if key in cached:
                hits += 1
            elif len(cached) >= cap:
                skipped = []
                while True:
                    neg, victim = heapq.heappop(heap)
                    if cached.get(victim) != -neg:
                        continue  # stale
                    if victim in group:
                        skipped.append((neg, victim))
                        continue
                    del cached[victim]
                    break
                for item in skipped:
                    heapq.heappush(heap, item)
            cached[key] = nxt[i]
            heapq.heappush(heap, (-nxt[i], key))
        j = end
    return hits / len(seq) if seq else 0.0


def class_lru(topk: Routing, n_expert: int, fraction: float, half_life: float = CLASS_HALF_LIFE,
              n_classes: int = N_CLASSES) -> float:
    """The hit rate of the recency-frequency classes (module docstring): one LRU list per class; a miss evicts, of
    the least recently used expert of each list, the one with the largest age over 2^class. The clock counts tokens,
    and a layer's lookup a fraction of one, so that earlier layers of the same token are older."""
    if not topk:
        return 0.0
    n_layer = len(topk)
    cap = _capacity(topk, n_expert, fraction)
    decay = math.log(2.0) / half_life
    crf: dict[int, float] = {}
    used_at: dict[int, float] = {}
    lists: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(n_classes)]
    class_of: dict[int, int] = {}  # cached key -> its list
    hits = lookups = 0
    for t, i, keys in _lookups(topk):
        now = t + i / n_layer
        group = [i * n_expert + e for e in keys]
        for key in group:
            lookups += 1
            if key in class_of:
                hits += 1
                del lists[class_of[key]][key]
            elif len(class_of) >= cap:
                victim, worst = -1, -1.0
                pinned = set(group)
                for c, lst in enumerate(lists):
                    for cand in lst:  # the least recently used first; the lookup's own experts are skipped
                        if cand in pinned:
                            continue
                        score = (now - used_at[cand]) / 2.0**c
                        if score > worst:
                            victim, worst = cand, score
                        break
                del lists[class_of.pop(victim)][victim]
            c0 = crf.get(key, 0.0) * math.exp(-decay * (now - used_at.get(key, now))) + 1.0
            crf[key], used_at[key] = c0, now
            c = min(int(math.floor(math.log2(c0))), n_classes - 1)
            class_of[key] = c
            lists[c][key] = None
    return hits / lookups if lookups else 0.0


def policies(topk: Routing, n_expert: int, fractions: Sequence[float]) -> dict[str, dict[str, float]]:
    """Per cache size (``"25%"``): the hit rates of the device lookup's CLOCK, the recency-frequency classes and
    Belady's optimum on the same lookups."""
    return {f"{int(f * 100)}%": {"clock": simulate(topk, n_expert, f).hit_rate,
                                 "class_lru": class_lru(topk, n_expert, f), "belady": belady(topk, n_expert, f)}
            for f in fractions}


# ---------------------------------------------------------------- victim rules with the prediction ahead


@dataclasses.dataclass(frozen=True)
class Setting:
    """One replay of :func:`victims`: a victim rule (:data:`VICTIMS`), the prediction's depth (0: off), its copies per
    predicted layer and how it protects what it predicted (:data:`pyllama_moe.tools.slotcache.PROTECTS`)."""

    victim: str = "clock"
    depth: int = 0
    budget: int | None = 2
    protect: str = "pin"

    @property
    def name(self) -> str:
        if not self.depth:
            return self.victim
        n = "all" if self.budget is None else self.budget
        return f"{self.victim} D={self.depth} N={n}" + ("" if self.protect == "pin" else f" {self.protect}")


def victims(topk: Routing, n_expert: int, fractions: Sequence[float], settings: Sequence[Setting],
            ahead: Mapping[int, Routing] | None = None) -> dict[str, dict[str, dict[str, float]]]:
    """Per cache size (``"25%"``), per setting (:attr:`Setting.name`): the hit rate, the experts copied per token
    (the lookups' and the prediction's), those the prediction copied for nothing and the victim search's steps per
    miss or copy; ``"belady"``, Belady's optimum without a prediction (what no cache that copies only what a lookup
    misses can beat; a prediction copies more, so its hit rate may)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for f in fractions:
        row: dict[str, dict[str, float]] = {"belady": {"hit_rate": belady(topk, n_expert, f)}}
        for s in settings:
            if s.depth and not ahead:
                raise ValueError(f"{s.name}: a prediction needs the predicted experts (ahead)")
            st = replay(topk, n_expert, f, ahead if s.depth else None, max(s.depth, 1), s.budget, s.victim,
                        s.protect)
            copies, wasted = st.per_token()
            row[s.name] = {"hit_rate": st.hit_rate, "copies": copies, "wasted": wasted,
                           "steps": st.steps / max(st.misses + st.predicted, 1)}
        out[f"{int(f * 100)}%"] = row
    return out
