"""``Llama(draft_adapt=True)`` (#45): the draft's size chosen from the steps' measured times and the draft's measured
acceptance (``pyllama_moe.draft_adapt``). The rule is driven here by a simulated generation with a clock of its own:
the verification costs of the H200's cache of half the experts and of all on the GPU, drafts that are always,
sometimes and never right; then, on the CPU, a draft that is never right stops being verified."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from pyllama_moe.draft_adapt import AdaptiveDraft
from pyllama_moe.llama_speculative import LlamaDraftModel

TEXT = [int(t) for t in np.random.default_rng(0).integers(10, 1000, 4000)]  # what the "model" samples


class Draft(LlamaDraftModel):
    """Proposes ``n`` tokens: each the text's next one with probability ``p`` (the first wrong one ends the run of
    right ones, as a lookup's proposal goes wrong), else a token the text does not have there."""

    def __init__(self, n: int, p: float, seed: int = 1) -> None:
        self.n, self.p, self.rng = n, p, np.random.default_rng(seed)

    def __call__(self, input_ids: npt.NDArray[np.intc], /, **kwargs: Any) -> npt.NDArray[np.intc]:
        i, out, right = len(input_ids), [], True
        for j in range(self.n):
            right = right and self.rng.random() < self.p
            out.append(TEXT[i + j] if right else 5)
        return np.array(out, dtype=np.intc)


def simulate(draft: LlamaDraftModel, step_s: Callable[[int], float], n_tokens: int) -> tuple[float, float]:
    """Generation of ``n_tokens`` of TEXT with ``draft`` as the session runs it: tokens a second, and the mean size
    verified. ``step_s(n)``: the seconds of a step that decodes n tokens."""
    clock = [0.0]
    if isinstance(draft, AdaptiveDraft):
        draft.clock = lambda: clock[0]
    done, sizes = 1, []
    while done < n_tokens:
        proposal = draft(np.array(TEXT[:done], dtype=np.intc))
        sizes.append(len(proposal))
        accepted = 0
        for t in proposal:
            if t != TEXT[done + accepted]:
                break
            accepted += 1
        clock[0] += step_s(1 + len(proposal))
        done += accepted + 1  # the accepted ones and the token sampled after them
    return done / clock[0], float(np.mean(sizes))


# a step's seconds by tokens decoded: measured on the H200 (docs/performance.md, realistic routing, tg of source code)
def cache_50(n: int) -> float:  # a cache of half the experts: 5 tokens cost 2.0 steps of one, 9 tokens 5.8, 17 8.6
    return float(np.interp(n, [1, 5, 9, 17], [1.0, 2.0, 5.8, 8.6])) / 183.5


def all_gpu(n: int) -> float:  # all on the GPU: 2.0, 2.8 and 3.5
    return float(np.interp(n, [1, 5, 9, 17], [1.0, 2.0, 2.8, 3.5])) / 255.9


def cheap(n: int) -> float:  # a dense model's verification: about one step whatever its size
    return (1.0 + 0.02 * (n - 1)) / 200.0


@pytest.mark.parametrize("step_s", [cache_50, all_gpu, cheap])
def test_a_draft_never_right_is_not_verified(step_s: Callable[[int], float]) -> None:
    draft = AdaptiveDraft(Draft(16, 0.0))
    rate, mean_size = simulate(draft, step_s, 2000)
    assert mean_size == 0.0 and draft.acceptance == 0.0
    assert rate == pytest.approx(1 / step_s(1), rel=1e-3)  # as fast as without a draft


@pytest.mark.parametrize("step_s", [cache_50, all_gpu, cheap])
@pytest.mark.parametrize("p", [0.0, 0.3, 0.6, 0.8, 0.95, 1.0])
def test_never_slower_than_no_draft_nor_than_the_best_fixed_size(step_s: Callable[[int], float], p: float) -> None:
    rate, _ = simulate(AdaptiveDraft(Draft(16, p)), step_s, 3000)
    none = 1 / step_s(1)
    fixed = {k: simulate(Draft(k, p), step_s, 3000)[0] for k in (1, 2, 4, 8, 16)}
    # within the cost of learning (a few timed tries of each size) of the better of no draft and the best size
    assert rate >= 0.97 * none
    assert rate >= 0.9 * max(none, *fixed.values()), (rate, none, fixed)


def test_the_size_follows_the_cost() -> None:
    # a good draft: verified in full where verification is cheap, cut where it costs as much as the cache's
    _, cheap_size = simulate(AdaptiveDraft(Draft(16, 0.9)), cheap, 3000)
    _, cache_size = simulate(AdaptiveDraft(Draft(16, 0.9)), cache_50, 3000)
    assert cheap_size > 10 and cache_size < 6, (cheap_size, cache_size)


def test_a_fixed_draft_of_the_wrong_size_is_slower() -> None:
    # the comparison the rule is for: a draft of 16 that is right 60% of the time loses to no draft with the cache
    slow, _ = simulate(Draft(16, 0.6), cache_50, 3000)
    assert slow < 0.5 / cache_50(1)


def test_a_new_generation_is_not_counted_as_a_step() -> None:
    draft = AdaptiveDraft(Draft(4, 1.0), clock=iter([0.0, 100.0, 200.0]).__next__)
    draft(np.array(TEXT[:10], dtype=np.intc))
    draft(np.array(TEXT[:500], dtype=np.intc))  # another prompt: the input grew by far more than a step
    assert draft.step_s == {} and draft.acceptance == 0.0
    draft(np.array(TEXT[:501], dtype=np.intc))  # one token on: a step of 100 s with no draft
    assert draft.step_s == {0: 100.0}


def test_draft_adapt_needs_a_draft() -> None:
    pytest.importorskip("pyllama_moe._cffi", reason="native part not built")
    from pyllama_moe import Llama

    from fixtures.models import model_path

    with pytest.raises(ValueError, match="draft_adapt"):
        Llama(str(model_path()), draft_adapt=True, verbose=False)
    with pytest.raises(ValueError, match="draft_adapt"):
        Llama(str(model_path()), draft_adapt=1, draft_model=Draft(4, 1.0), verbose=False)  # type: ignore[arg-type]


def test_a_llama_stops_verifying_a_draft_that_is_never_right() -> None:
    pytest.importorskip("pyllama_moe._cffi", reason="native part not built")
    from pyllama_moe import Llama

    from fixtures.models import model_path

    class Wrong(LlamaDraftModel):
        def __call__(self, input_ids: npt.NDArray[np.intc], /, **kwargs: Any) -> npt.NDArray[np.intc]:
            return np.full(8, 5 + (int(input_ids[-1]) + 1) % 50, dtype=np.intc)

    with Llama(str(model_path()), n_ctx=512, verbose=False, draft_model=Wrong(), draft_adapt=True) as llm:
        llm.create_completion("The quick brown fox", max_tokens=48, temperature=0)
        chosen = llm.draft_model.chosen
    # every call proposed 8 tokens; after the first calls (whose steps time no draft) none of them is verified
    assert sum(chosen.values()) > 40 and set(chosen) == {0}, chosen
