"""The slots of one MoE cache group as the device lookup keeps them, with the victim rules it could have.

Every rule runs under the op's rules (``GGML_OP_MOE_CACHE_LOOKUP``, ``ggml_moe_cache_predict_ahead`` in ``ggml.h``):
a lookup starts a new epoch and pins the slots of its experts for it; a prediction runs in the epoch of the last
lookup and pins the slots of its hits and copies until the lookup of the layer it was made for, ``ahead`` lookups
later (a pin is never moved back); no miss or copy takes a pinned slot. What differs is the victim among the unpinned
slots, and what a slot keeps to choose it:

- :class:`Clock`, today's: a reference bit per slot, set by a lookup's use; the hand takes the first unpinned slot
  whose bit is clear, clearing those it passes; a prediction's copy starts with the bit clear;
- :class:`FreqClock`: the bit becomes a saturating counter of uses (``count_max``, 3: two bits), which the hand
  decrements where it cleared the bit (GCLOCK): an expert used often survives more rounds of the hand;
- :class:`ClassCache`: upstream's recency-frequency classes (:func:`pyllama_moe.tools.cachesim.class_lru`) under the
  op's rules: a use count decayed with a half-life, its log2 as the class, and the victim the unpinned slot with the
  largest age over 2^class (one reduction over the slots); the count kept per expert across evictions (upstream's) or
  per slot; with one class it is LRU.

How a prediction protects what it found or copied (``protect``): ``"pin"``, the op's: only by its pins, and its copies
start as the first to go (reference bit clear; the oldest of class 0); ``"pin+ref"``: the pins, and a predicted
expert is also marked as used (its bit set, its recency refreshed; its count unchanged); ``"ref"``: the mark without
the pins past the prediction's own epoch.

Public API: :class:`ClockStats`, :class:`Clock`, :class:`FreqClock`, :class:`ClassCache`, :data:`VICTIMS`,
:data:`PROTECTS`, :func:`make_cache`.
"""

from __future__ import annotations

import dataclasses
import math
from collections import OrderedDict
from collections.abc import Callable

Key = tuple[int, int]  # (layer, expert)

PROTECTS = ("pin", "pin+ref", "ref")


@dataclasses.dataclass
class ClockStats:
    """Distinct experts found (``hits``, prefetched ones included) and copied by the lookups (``misses``); experts
    copied by prefetches (``predicted``), those a lookup then found (``used``) and those evicted unused (``wasted``);
    the slots the victim search looked at (``steps``: the hand's moves, or the class heads a search compared)."""

    n_tokens: int = 0
    hits: int = 0
    misses: int = 0
    predicted: int = 0
    used: int = 0
    wasted: int = 0
    steps: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hits / max(self.hits + self.misses, 1)

    @property
    def misses_predicted(self) -> float:
        """The share of what the lookups would have copied that the prediction had copied before them."""
        return self.used / max(self.used + self.misses, 1)

    def per_token(self) -> tuple[float, float]:
        """Experts copied per token (the lookups' and the prediction's) and the prediction's copies evicted unused."""
        n = max(self.n_tokens, 1)
        return (self.misses + self.predicted) / n, self.wasted / n


class Clock:
    """The slots of one cache group and their CLOCK state, as the op keeps them."""

    def __init__(self, n_slots: int, protect: str = "pin") -> None:
        if n_slots <= 0:
            raise ValueError(f"a cache needs a slot, not {n_slots}")
        if protect not in PROTECTS:
            raise ValueError(f"protect must be one of {PROTECTS}, not {protect!r}")
        self.n_slots = n_slots
        self.protect = protect
        self.count_max = 1  # a reference bit: the hand clears it
        self.owner: list[Key | None] = [None] * n_slots
        self.ref = [0] * n_slots
        self.pin = [0] * n_slots  # the last epoch whose lookups may not take the slot
        self.prefetched = [False] * n_slots
        self.slot_of: dict[Key, int] = {}
        self.hand = 0
        self.epoch = 0
        self.stats = ClockStats()

    # the victim rule: what a use, a prediction and a fill leave in the slot, and which slot a miss takes

    def _use(self, s: int, key: Key) -> None:
        self.ref[s] = 1

    def _hint(self, s: int, key: Key) -> None:
        """A prediction found ``key`` cached in ``s``."""
        if self.protect != "pin":
            self.ref[s] = 1

    def _fill(self, s: int, key: Key, prefetch: bool) -> None:
        if prefetch:
            self.ref[s] = 0 if self.protect == "pin" else 1  # only predicted: the first to go
        else:
            self._use(s, key)

    def _take(self) -> int | None:
        """The first slot from the hand that is neither pinned nor referenced, the hand taking one off each reference
        it passes (None after count_max + 1 rounds)."""
        for _ in range((self.count_max + 1) * self.n_slots):
            s = self.hand
            self.hand = (s + 1) % self.n_slots
            self.stats.steps += 1
            if self.pin[s] >= self.epoch:
                continue
            if self.ref[s]:
                self.ref[s] -= 1
                continue
            return s
        return None

    def lookup(self, keys: list[Key], prefetch: bool = False, budget: int | None = None, ahead: int = 0) -> None:
        """The distinct ``keys`` of one layer, in ascending expert order (a prefetch: best first); a prefetch copies
        those it finds room for, at most ``budget`` of its misses, and pins its slots through the ``ahead`` lookups
        before the one it is for (``"ref"``: only in its own epoch)."""
        st = self.stats
        if not prefetch:
            self.epoch += 1
        pin_to = self.epoch + (ahead if prefetch and self.protect != "ref" else 0)
        misses = []
        for k in keys:
            s = self.slot_of.get(k)
            if s is None:
                misses.append(k)
                continue
            self.pin[s] = max(self.pin[s], pin_to)
            if prefetch:
                self._hint(s, k)
                continue
            self._use(s, k)
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
            self.pin[s] = pin_to
            self._fill(s, k, prefetch)
            if prefetch:
                st.predicted += 1
            else:
                st.misses += 1


class FreqClock(Clock):
    """CLOCK with a saturating use counter per slot (GCLOCK): a use adds one up to ``count_max``, the hand takes one
    off where CLOCK clears the bit, and takes the first unpinned slot at 0. ``count_max`` 1 is :class:`Clock`."""

    def __init__(self, n_slots: int, protect: str = "pin", count_max: int = 3) -> None:
        super().__init__(n_slots, protect)
        if count_max < 1:
            raise ValueError(f"count_max must be at least 1, not {count_max}")
        self.count_max = count_max

    def _use(self, s: int, key: Key) -> None:
        self.ref[s] = min(self.ref[s] + 1, self.count_max)

    def _hint(self, s: int, key: Key) -> None:
        if self.protect != "pin":
            self.ref[s] = max(self.ref[s], 1)

    def _fill(self, s: int, key: Key, prefetch: bool) -> None:
        self.ref[s] = 0 if prefetch and self.protect == "pin" else 1



CLASS_HALF_LIFE = 128.0  # tokens
N_CLASSES = 8


class ClassCache(Clock):
    """Recency-frequency classes under the op's rules (module docstring). The clock is the epoch (one per lookup), so
    ``half_life`` is in lookups: upstream's 128 tokens are ``128 * n_layer``. ``per_expert``: an expert's decayed count
    outlives its slot (upstream's; a counter and a time per expert of the group), else a slot's starts again at each
    fill. With ``n_classes`` 1 the victim is the least recently used unpinned slot: LRU."""

    def __init__(self, n_slots: int, protect: str = "pin", half_life: float = CLASS_HALF_LIFE,
                 n_classes: int = N_CLASSES, per_expert: bool = True) -> None:
        super().__init__(n_slots, protect)
        if half_life <= 0 or n_classes < 1:
            raise ValueError(f"a half-life and a class are needed, not {half_life} and {n_classes}")
        self.n_classes = n_classes
        self.per_expert = per_expert
        self.decay = math.log(2.0) / half_life
        self.free = list(range(n_slots - 1, -1, -1))  # empty slots, the lowest taken first
        self.last = [0.0] * n_slots  # the slot's last use (its age's origin)
        self.cls = [0] * n_slots
        self.lists: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(n_classes)]  # least recent first
        self.count: dict[Key | int, tuple[float, float]] = {}  # per expert (or slot): decayed count, its time

    def _place(self, s: int, c: int, oldest: bool = False) -> None:
        self.lists[self.cls[s]].pop(s, None)
        self.cls[s] = c
        self.lists[c][s] = None
        if oldest:
            self.lists[c].move_to_end(s, last=False)

    def _use(self, s: int, key: Key) -> None:
        now = float(self.epoch)
        who: Key | int = key if self.per_expert else s
        crf, at = self.count.get(who, (0.0, now))
        crf = crf * math.exp(-self.decay * (now - at)) + 1.0
        self.count[who] = (crf, now)
        self.last[s] = now
        self._place(s, min(int(math.floor(math.log2(crf))), self.n_classes - 1))

    def _hint(self, s: int, key: Key) -> None:
        if self.protect != "pin":
            self.last[s] = float(self.epoch)
            self._place(s, self.cls[s])

    def _fill(self, s: int, key: Key, prefetch: bool) -> None:
        if not self.per_expert:
            self.count.pop(s, None)
        if not prefetch:
            self._use(s, key)
        elif self.protect == "pin":
            self.last[s] = -math.inf  # only predicted: the first to go once its pin lapses
            self._place(s, 0, oldest=True)
        else:
            self.last[s] = float(self.epoch)
            self._place(s, 0)

    def _take(self) -> int | None:
        if self.free:
            return self.free.pop()
        now = float(self.epoch)
        victim, worst = -1, -1.0
        for c, lst in enumerate(self.lists):
            for s in lst:  # the least recent unpinned slot of the class
                self.stats.steps += 1
                if self.pin[s] >= self.epoch:
                    continue
                score = (now - self.last[s]) / 2.0**c
                if score > worst:
                    victim, worst = s, score
                break
        if victim < 0:
            return None
        del self.lists[self.cls[victim]][victim]
        return victim


def _classes(per_expert: bool, n_classes: int = N_CLASSES) -> Callable[[int, str, int], Clock]:
    return lambda n, protect, n_layer: ClassCache(n, protect, CLASS_HALF_LIFE * n_layer, n_classes, per_expert)


# the victim rules by name: (slots, protect, MoE layers of a token) -> the cache
VICTIMS: dict[str, Callable[[int, str, int], Clock]] = {
    "clock": lambda n, protect, _: Clock(n, protect),
    "freq2": lambda n, protect, _: FreqClock(n, protect, 3),
    "freq3": lambda n, protect, _: FreqClock(n, protect, 7),
    "classes": _classes(True),
    "classes_slot": _classes(False),
    "lru": _classes(False, 1),
}


def make_cache(victim: str, n_slots: int, protect: str = "pin", n_layer: int = 1) -> Clock:
    """The cache of ``n_slots`` slots whose victim rule is ``victim`` (:data:`VICTIMS`), for ``n_layer`` lookups a
    token (the classes' half-life counts tokens)."""
    if victim not in VICTIMS:
        raise ValueError(f"victim must be one of {tuple(VICTIMS)}, not {victim!r}")
    return VICTIMS[victim](n_slots, protect, n_layer)
