"""The MoE cache's device lookup replayed on recorded routing, with and without the prediction.

One CLOCK over the slots of every layer's experts, looked up token by token and layer by layer as a decode step
looks it up, by the rules of ``GGML_OP_MOE_CACHE_LOOKUP`` (``ggml.h``): a lookup pins the slots of its experts for its
epoch, and each miss takes the first slot from the hand that is neither pinned nor referenced, clearing the reference
bits it passes. With the prediction (``LLAMA_MOE_CACHE_PREDICT=1``), after the lookup of layer l the experts that
layer l + 1's router selects on layer l's router input are prefetched: in the epoch of that lookup, into slots that
start unreferenced; the lookup of layer l + 1 then finds those it selects.

Public API: :func:`simulate`, :class:`ClockStats`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

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

    def lookup(self, keys: list[Key], prefetch: bool = False) -> None:
        """The distinct ``keys`` of one layer, in ascending expert order; a prefetch copies those it finds room for."""
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
        for k in misses:
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
    """Per layer l + 1 that has a router and a layer l recorded before it: the top-K of its router (``[n_expert,
    n_embd]``) applied to layer l's router input (``[n_tokens, n_embd]``), for every token (``[n_tokens, K]``)."""
    out: dict[int, npt.NDArray[np.integer]] = {}
    layers = sorted(topk)
    for a, b in zip(layers, layers[1:], strict=False):
        if b != a + 1 or a not in router_in or b not in routers:
            continue
        k = topk[b].shape[1]
        logits = router_in[a] @ routers[b].T  # [n_tokens, n_expert]
        out[b] = np.argpartition(-logits, k - 1, axis=1)[:, :k]
    return out


def simulate(topk: Routing, n_expert: int, fraction: float, predicted: Routing | None = None) -> ClockStats:
    """The device lookup of a cache holding ``fraction`` of all the layers' experts over the routing ``topk``,
    decoded one token at a time; with ``predicted`` (:func:`predicted_topk`), each lookup of layer l is followed by
    the prefetch of ``predicted[l + 1]``."""
    layers = sorted(topk)
    if not layers:
        return ClockStats()
    # the device lookup needs room for one token's experts (llama_moe_cache does not cache a smaller group)
    k = max(topk[il].shape[1] for il in layers)
    clock = Clock(max(k, int(round(fraction * n_expert * len(layers)))))
    n_tokens = len(topk[layers[0]])
    for t in range(n_tokens):
        for il in layers:
            clock.lookup([(il, e) for e in sorted(set(topk[il][t].tolist()))])
            nxt = predicted.get(il + 1) if predicted else None
            if nxt is not None:
                clock.lookup([(il + 1, e) for e in sorted(set(nxt[t].tolist()))], prefetch=True)
    clock.stats.n_tokens = n_tokens
    return clock.stats
