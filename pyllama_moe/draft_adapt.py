"""``Llama(draft_model=..., draft_adapt=True)``: the draft's size chosen from what verifications cost and what the
draft gets accepted.

A verification of ``k`` proposed tokens decodes ``k + 1`` tokens at once. With a MoE it looks up the union of their
experts: on the H200 with a cache of half the experts a 9-token verification cost about 6 one-token decodes, and all
on the GPU about 3 (docs/performance.md), so a draft pays only where most of it is accepted. :class:`AdaptiveDraft`
wraps a draft model and, at each call, cuts its proposal to the size ``k`` that gives the most tokens a second:

- the acceptance: every proposal is compared with the tokens that were sampled after it (seen at the next call, as
  the input grew), also when none of it was verified (a proposal cut to 0 costs the draft's own call only), and a
  per-token acceptance ``p`` is kept (accepted tokens over accepted ones plus first rejections, decayed so that it
  follows the text); a draft of ``k`` then yields ``1 + p + ... + p^k`` tokens a verification;
- the cost: the time from one call to the next is one step (the decode of ``k + 1`` tokens, the samplings, the
  draft's call), kept per size; a size not timed yet is tried once where ``p`` says it could pay, and the times of
  the sizes other than 0 are forgotten every ``RETIME`` calls, as the cache's state and the text change.

A size is taken only where it beats no draft by ``MARGIN``: with a draft that is never accepted nothing is verified
after the first calls, so decoding is as fast as without a draft (less the draft's own calls).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from pyllama_moe.llama_speculative import LlamaDraftModel

__all__ = ["AdaptiveDraft"]

MARGIN = 1.05  # a draft size must give this many times the tokens a second of no draft
DECAY = 0.98  # the acceptance counts' weight per proposal compared (about 50 proposals remembered)
ALPHA = 0.25  # the weight of a new step time in its size's running mean
RETIME = 256  # calls after which the sizes other than 0 are timed again


class AdaptiveDraft(LlamaDraftModel):
    """``inner``'s proposals cut to the size that gives the most tokens a second (module docstring); ``sizes`` are
    the sizes tried (0 and powers of two up to the proposal's length by default). ``clock`` is for tests."""

    def __init__(self, inner: LlamaDraftModel, sizes: tuple[int, ...] | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        if not callable(inner):
            raise ValueError(f"the draft model must be callable, got {inner!r}")
        self.inner = inner
        self.sizes = sizes
        self.clock = clock
        self.accepted = 0.0  # decayed counts of proposed tokens sampled after all those before them were
        self.rejected = 0.0  # and of first tokens that were not
        self.step_s: dict[int, float] = {}  # size -> running mean of a step's seconds
        self.calls = 0
        self.chosen: dict[int, int] = {}  # size -> calls that chose it (statistics)
        self._last: tuple[npt.NDArray[np.intc], npt.NDArray[np.intc], int, float] | None = None

    @property
    def acceptance(self) -> float:
        """The per-token acceptance ``p`` (0.0 before any comparison)."""
        n = self.accepted + self.rejected
        return self.accepted / n if n > 0 else 0.0

    def expected_tokens(self, k: int) -> float:
        """Tokens a verification of ``k`` proposed tokens yields: ``1 + p + ... + p^k``."""
        p = self.acceptance
        return float(sum(p**i for i in range(k + 1)))

    def __call__(self, input_ids: npt.NDArray[np.intc], /, **kwargs: Any) -> npt.NDArray[np.intc]:
        now = self.clock()
        ids = np.asarray(input_ids)
        self._account(ids, now)
        proposal = np.asarray(self.inner(ids, **kwargs), dtype=np.intc).reshape(-1)
        k = self.choose(len(proposal))
        self.calls += 1
        self.chosen[k] = self.chosen.get(k, 0) + 1
        if self.calls % RETIME == 0:
            self.step_s = {s: t for s, t in self.step_s.items() if s == 0}
        self._last = (ids, proposal, k, now)
        return proposal[:k]

    def _account(self, ids: npt.NDArray[np.intc], now: float) -> None:
        """What the last call's proposal got: the tokens sampled since it, and the step's time."""
        if self._last is None:
            return
        prev, proposal, k, then = self._last
        self._last = None
        grown = len(ids) - len(prev)
        # the same generation, one step on: the input grew by the tokens sampled (1 to k + 1) and kept its head
        if not 1 <= grown <= k + 1 or not np.array_equal(ids[:len(prev)], prev):
            return
        new = ids[len(prev):]
        n = min(len(proposal), len(new))
        hits = int(np.argmin(np.append(proposal[:n] == new[:n], False)))  # leading matches
        self.accepted *= DECAY
        self.rejected *= DECAY
        self.accepted += hits
        self.rejected += 1 if hits < n else 0
        t = now - then
        self.step_s[k] = t if k not in self.step_s else (1 - ALPHA) * self.step_s[k] + ALPHA * t

    def choose(self, n_proposed: int) -> int:
        """The size to verify of a proposal of ``n_proposed`` tokens."""
        base = self.step_s.get(0)
        if n_proposed == 0 or base is None:  # no proposal, or no draft's step timed yet: time one
            return 0
        sizes = self.sizes or tuple(1 << i for i in range(n_proposed.bit_length()))
        best, best_rate = 0, MARGIN / base
        for k in sorted({min(s, n_proposed) for s in sizes if s > 0}):
            step = self.step_s.get(k)
            if step is None:
                # not timed: tried once if it would pay at the cost of no draft, the smallest such size first
                if self.expected_tokens(k) / base > best_rate:
                    return k
                continue
            rate = self.expected_tokens(k) / step
            if rate > best_rate:
                best, best_rate = k, rate
        return best
