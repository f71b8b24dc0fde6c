"""The MoE cache's device lookup replayed on recorded routing, with and without the prediction, beside the policies
it could have: Belady's optimum and upstream's recency-frequency classes.

One CLOCK over the slots of every layer's experts, looked up token by token and layer by layer as a decode step
looks it up, by the rules of ``GGML_OP_MOE_CACHE_LOOKUP`` (``ggml.h``): a lookup pins the slots of its experts for its
epoch, and each miss takes the first slot from the hand that is neither pinned nor referenced, clearing the reference
bits it passes. With the prediction (``LLAMA_MOE_CACHE_PREDICT=N``), after the lookup of layer l the experts that the
next MoE layer's router selects on layer l's router input are prefetched, best first and at most N of those missing:
in the epoch of that lookup, into slots that start unreferenced; the lookup of that layer then finds those it selects.

Two other policies over the same lookups bound what a better policy could still buy:

- Belady's optimum (:func:`belady`): each miss evicts the cached expert whose next use is the farthest away (it knows
  the future; no policy that does not can hit more);
- the recency-frequency classes that upstream llama.cpp's cache moved to after our pin (:func:`class_lru`, modelled
  from its description): each expert keeps a use count decayed with a half-life of 128 tokens, kept across evictions;
  its class is the count's log2 (at most 7) as of its last use, and a miss evicts the expert with the largest age
  (tokens since its last use) over 2^class.

And the hybrid decode's split (:func:`simulate_hybrid`): the CPU computes up to ``host_max`` of a lookup's misses,
which take no slot, so they are never found again; which misses it takes decides how much the cache loses.

Public API: :func:`simulate`, :class:`ClockStats`, :func:`belady`, :func:`class_lru`, :func:`policies`,
:func:`simulate_hybrid`, :class:`HybridStats`.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections import Counter, OrderedDict
from collections.abc import Iterator, Mapping, Sequence

import numpy as np
import numpy.typing as npt

Key = tuple[int, int]  # (layer, expert)
Routing = Mapping[int, npt.NDArray[np.integer]]  # per MoE layer: the experts each token selects, [n_tokens, K]


@dataclasses.dataclass
class ClockStats:
    """Distinct experts found (``hits``, prefetched ones included) and copied by the lookups (``misses``); experts
    copied by prefetches (``predicted``), those a lookup then found (``used``) and those evicted unused (``wasted``)."""

    n_tokens: int = 0
    hits: int = 0
    misses: int = 0
    predicted: int = 0
    used: int = 0
    wasted: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hits / max(self.hits + self.misses, 1)

    @property
    def misses_predicted(self) -> float:
        """The share of what the lookups would have copied that the prediction had copied before them."""
        return self.used / max(self.used + self.misses, 1)


class Clock:
    """The slots of one cache group and their CLOCK state, as the op keeps them."""

    def __init__(self, n_slots: int) -> None:
        if n_slots <= 0:
            raise ValueError(f"a cache needs a slot, not {n_slots}")
        self.n_slots = n_slots
        self.owner: list[Key | None] = [None] * n_slots
        self.ref = [0] * n_slots
        self.pin = [0] * n_slots
        self.prefetched = [False] * n_slots
        self.slot_of: dict[Key, int] = {}
        self.hand = 0
        self.epoch = 0
        self.stats = ClockStats()

    def _take(self) -> int | None:
        """The first slot from the hand that is neither pinned nor referenced (None after two rounds)."""
        for _ in range(2 * self.n_slots):
            s = self.hand
            self.hand = (s + 1) % self.n_slots
            if self.pin[s] == self.epoch:
                continue
            if self.ref[s]:
                self.ref[s] = 0
                continue
            return s
        return None

    def lookup(self, keys: list[Key], prefetch: bool = False, budget: int | None = None) -> None:
        """The distinct ``keys`` of one layer, in ascending expert order (a prefetch: best first); a prefetch copies
        those it finds room for, at most ``budget`` of its misses."""
        st = self.stats
        if not prefetch:
            self.epoch += 1
        misses = []
        for k in keys:
            s = self.slot_of.get(k)
            if s is None:
                misses.append(k)
                continue
            self.pin[s] = self.epoch
            if prefetch:
                continue
            self.ref[s] = 1
            st.hits += 1
            if self.prefetched[s]:
                self.prefetched[s] = False
                st.used += 1
        for k in misses[:budget]:
            s = self._take()
            if s is None:
                if prefetch:
                    return
                raise ValueError("the experts of a lookup do not fit in the slots")
            old = self.owner[s]
            if old is not None:
                del self.slot_of[old]
            st.wasted += self.prefetched[s]
            self.prefetched[s] = prefetch
            self.owner[s] = k
            self.slot_of[k] = s
            self.ref[s] = 0 if prefetch else 1
            self.pin[s] = self.epoch
            if prefetch:
                st.predicted += 1
            else:
                st.misses += 1


def predicted_topk(topk: Routing, router_in: Mapping[int, npt.NDArray[np.float32]],
                   routers: Mapping[int, npt.NDArray[np.float32]]) -> dict[int, npt.NDArray[np.integer]]:
    """Per recorded MoE layer b that has a router, with the MoE layer a recorded before it (dense layers between are
    skipped, as the device's prediction does): the top-K of b's router (``[n_expert, n_embd]``) applied to a's router
    input (``[n_tokens, n_embd]``), best first (ties: the lower expert), for every token (``[n_tokens, K]``)."""
    out: dict[int, npt.NDArray[np.integer]] = {}
    layers = sorted(topk)
    for a, b in zip(layers, layers[1:], strict=False):
        if a not in router_in or b not in routers:
            continue
        k = topk[b].shape[1]
        logits = router_in[a] @ routers[b].T  # [n_tokens, n_expert]
        out[b] = np.argsort(-logits, axis=1, kind="stable")[:, :k]
    return out


def simulate(topk: Routing, n_expert: int, fraction: float, predicted: Routing | None = None,
             budget: int | None = None) -> ClockStats:
    """The device lookup of a cache holding ``fraction`` of all the layers' experts over the routing ``topk``,
    decoded one token at a time; with ``predicted`` (:func:`predicted_topk`), each lookup of layer l is followed by
    the prefetch of ``predicted[next]`` for the next recorded layer, at most ``budget`` of its misses."""
    layers = sorted(topk)
    if not layers:
        return ClockStats()
    clock = Clock(_capacity(topk, n_expert, fraction))
    n_tokens = len(topk[layers[0]])
    for t in range(n_tokens):
        for i, il in enumerate(layers):
            clock.lookup([(il, e) for e in sorted(set(topk[il][t].tolist()))])
            nl = layers[i + 1] if i + 1 < len(layers) else -1
            nxt = predicted.get(nl) if predicted else None
            if nxt is not None:
                clock.lookup([(nl, e) for e in dict.fromkeys(nxt[t].tolist())], prefetch=True, budget=budget)
    clock.stats.n_tokens = n_tokens
    return clock.stats


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


CLASS_HALF_LIFE = 128.0  # tokens
N_CLASSES = 8


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
