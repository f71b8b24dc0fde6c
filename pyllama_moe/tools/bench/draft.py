"""``bench --draft 4,8,16``: greedy generation with prompt-lookup speculative decoding, against none.

Two prompts: one quoting source code and starting it again (text that repeats its prompt, what prompt lookup is for)
and one of prose (the language reference's, which rarely repeats itself word for word: little to copy). After each,
``--tg`` greedy tokens through ``create_completion``: without a draft, then with ``LlamaPromptLookupDecoding`` proposing
up to each draft size. Per run: tokens/s, decodes (``llama_decode`` calls) and tokens per decode, draft tokens
proposed and accepted, and the MoE cache's lookups and misses (what a rule choosing the draft size needs: a
verification looks up the union of its tokens' experts, which may miss more than one token's).

With ``bounds`` (``--draft-bounds``), each size also runs with the two bounds of what any draft of that size gets:
the text generated without a draft decoded teacher-forced, size + 1 tokens a decode (``forced``: every proposal
accepted, :func:`forced`), and a draft proposing other tokens (``wrong``, a :class:`Replay`: every one rejected, a
verification of size + 1 tokens per token). These need no model that copies its prompt: on a random-weight model
(``synth``) prompt lookup finds almost nothing to propose, as the text it generates is not its prompt's, but the
bounds measure what verifications cost with the MoE cache. (A :class:`Replay` of the text generated without a draft,
``replay``, is every proposal accepted only where a verification's batched logits pick what single-token decodes
picked: on random weights, whose greedy text is full of near ties, they soon do not; the H200 showed it.)

Each draft also runs with its size chosen by ``Llama(draft_adapt=True)``'s rule (``lookup-adapt``, ``wrong-adapt``:
:class:`pyllama_moe.draft_adapt.AdaptiveDraft`), which should be no slower than no draft.

Only the public API, as the bench's worker (:mod:`.worker`, whose child process runs this).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from pyllama_moe import AdaptiveDraft, LlamaDraftModel, LlamaPromptLookupDecoding

if TYPE_CHECKING:  # pragma: no cover
    from pyllama_moe import Llama, MoeCacheStats

PROMPT_TOKENS = 320  # the most tokens a prompt has (the worker sizes the context for it)
WARMUP_TOKENS = 16  # per draft size, before the timed runs


class DraftLog(LlamaDraftModel):
    """A draft model that records what ``inner`` proposes: per call, the tokens given (their count) and the proposal,
    cut to ``limit`` tokens (what the generation evaluates of it: a batch less the sampled token)."""

    def __init__(self, inner: LlamaDraftModel, limit: int) -> None:
        self.inner, self.limit = inner, limit
        self.calls: list[tuple[int, list[int]]] = []

    def __call__(self, input_ids: npt.NDArray[np.intc], /, **kwargs: Any) -> npt.NDArray[np.intc]:
        proposal = self.inner(input_ids, **kwargs)
        self.calls.append((len(input_ids), [int(t) for t in np.asarray(proposal).reshape(-1)[: self.limit]]))
        return proposal


class Replay(LlamaDraftModel):
    """Proposes the ``k`` tokens of ``tokens`` (the prompt and a text generated after it) that follow an input that
    starts it, nothing after one that does not; with ``wrong``, the ``k`` tokens following any input, each one shifted
    by one in the vocabulary of ``n_vocab`` tokens: never those generated. Greedy verification of the text generated
    without a draft then accepts every proposal (where the verification's logits pick what the single-token decodes
    picked), or none."""

    def __init__(self, tokens: Sequence[int], k: int, n_vocab: int, wrong: bool = False) -> None:
        self.tokens = np.asarray(tokens, dtype=np.intc)
        self.k, self.n_vocab, self.wrong = k, n_vocab, wrong

    def __call__(self, input_ids: npt.NDArray[np.intc], /, **kwargs: Any) -> npt.NDArray[np.intc]:
        n = len(input_ids)
        after = self.tokens[n: n + self.k]
        if self.wrong:
            return ((after.astype(np.int64) + 1) % self.n_vocab).astype(np.intc)
        if n > len(self.tokens) or not np.array_equal(self.tokens[:n], np.asarray(input_ids)):
            return np.array([], dtype=np.intc)
        return after


def acceptance(calls: Sequence[tuple[int, Sequence[int]]], tokens: Sequence[int]) -> tuple[int, int]:
    """Draft tokens proposed and accepted: a proposal made after the first ``n`` tokens is accepted as far as it agrees
    with ``tokens[n:]``, the tokens the generation went on with (greedy verification keeps a proposed token exactly
    when it is the one sampled, and the first one that is not ends the proposal)."""
    proposed = accepted = 0
    for n, proposal in calls:
        proposed += len(proposal)
        for want, got in zip(proposal, tokens[n:], strict=False):
            if want != got:
                break
            accepted += 1
    return proposed, accepted


def code_prompt(llm: Llama, code: Sequence[int]) -> list[int]:
    """256 tokens of source code, a line saying it follows again, and its first 16 tokens (at most 320 tokens)."""
    quoted = list(code[:256])
    again = llm.tokenize(b"\n\n# The same code again, unchanged:\n\n", add_bos=False)[:40]
    return [llm.token_bos(), *quoted, *again, *quoted[:16]]


def prose_prompt(llm: Llama) -> list[int]:
    """Prose of the language reference (at most 320 tokens)."""
    from pyllama_moe.tools.text import prose_text

    return [llm.token_bos(), *llm.tokenize(prose_text().encode(), add_bos=False)[: PROMPT_TOKENS - 1]]


def cache_counts(before: MoeCacheStats | None, after: MoeCacheStats | None, decodes: int,
                 tokens: int) -> dict[str, float]:
    """The MoE cache's experts looked up on the device and on the host (small and large ubatches), and the misses of
    all three, between two ``moe_cache_stats()``, with the misses per decode and per token, and those of them the CPU
    computed instead of uploading (``moe_hybrid``), in all and per token; empty without a cache."""
    if before is None or after is None:
        return {}
    d = after - before
    device = d.hits("device")
    host = d.hits("small", "large")
    misses = device[1] + host[1]
    return {"device_lookups": sum(device), "host_lookups": sum(host), "misses": misses,
            "misses_per_decode": misses / max(decodes, 1), "misses_per_token": misses / max(tokens, 1),
            "host_experts": d.n_host, "host_per_token": d.per_token(tokens)["host"]}


# prompt lookup; Replay of the text generated without a draft, or wrong; "-adapt": the same, its size chosen by
# Llama(draft_adapt=True)'s rule (AdaptiveDraft)
DRAFTERS = ("lookup", "lookup-adapt", "replay", "wrong", "wrong-adapt")
RUNS = ("lookup", "lookup-adapt")  # the rows of each draft size
BOUNDS = ("forced", "wrong", "wrong-adapt")  # and with bounds: every proposal right (forced, :func:`forced`) or wrong


def drafter(drafted_by: str, k: int, reference: Sequence[int], n_vocab: int) -> LlamaDraftModel:
    """The draft model of :data:`DRAFTERS` proposing up to ``k`` tokens (``reference``: the prompt and the text
    generated after it without a draft, for the :class:`Replay` ones)."""
    if drafted_by not in DRAFTERS:
        raise ValueError(f"drafted_by must be one of {', '.join(DRAFTERS)}, got {drafted_by!r}")
    if drafted_by.endswith("-adapt"):
        return AdaptiveDraft(drafter(drafted_by.removesuffix("-adapt"), k, reference, n_vocab))
    if drafted_by == "lookup":
        return LlamaPromptLookupDecoding(num_pred_tokens=k)
    return Replay(reference, k, n_vocab, wrong=drafted_by == "wrong")


def generate(llm: Llama, prompt: list[int], n: int, draft: int, drafted_by: str = "lookup",
             reference: Sequence[int] = ()) -> dict[str, Any]:
    """``n`` greedy tokens after ``prompt`` (evaluated before the timing), with a draft of up to ``draft`` tokens
    (0: none) drafted by prompt lookup or a :class:`Replay` of ``reference`` (:func:`drafter`). Decodes: the prompt's
    last token, which ``create_completion`` evaluates again, and one per draft call (each is followed by one decode:
    its verification, or the sampled token alone where it proposed nothing), or one per token but the last without
    a draft (the last token sampled is not evaluated). Accepted draft tokens are then exactly the tokens generated
    less the decodes."""
    log = DraftLog(drafter(drafted_by, draft, reference, llm.n_vocab()), llm.n_batch - 1) if draft else None
    llm.reset()
    llm.draft_model = log
    try:
        llm.eval(prompt)  # the completion goes on from it
        before = llm.moe_cache_stats()
        t0 = time.perf_counter()
        res = llm.create_completion(prompt, max_tokens=n, temperature=0)
        t = time.perf_counter() - t0
        after = llm.moe_cache_stats()
    finally:
        llm.draft_model = None
    n_gen = int(res["usage"]["completion_tokens"])
    decodes = 1 + len(log.calls) if log else n_gen
    # the tokens evaluated: the prompt and all the generated ones but the last (a proposal's token that would match
    # the last one is not counted as accepted)
    proposed, accepted = acceptance(log.calls, llm.input_ids[: llm.n_tokens].tolist()) if log else (0, 0)
    out: dict[str, Any] = {"n": n_gen, "n_prompt": len(prompt), "draft": draft,
                           "drafted_by": drafted_by if draft else "", "ts": n_gen / t, "decodes": decodes,
                           "tokens_per_decode": n_gen / max(decodes, 1), "proposed": proposed, "accepted": accepted,
                           "digest": hashlib.sha256(res["choices"][0]["text"].encode()).hexdigest()[:16]}
    return out | cache_counts(before, after, decodes, n_gen)


def forced(llm: Llama, prompt: list[int], reference: Sequence[int], draft: int) -> dict[str, Any]:
    """The bound of a draft of ``draft`` tokens that is always right: the text ``reference`` generated after
    ``prompt`` without a draft, decoded teacher-forced ``draft + 1`` tokens a decode, as verifications whose every
    proposal is accepted (less their samplings). Unlike a :class:`Replay`, it holds where a verification's batched
    logits would pick another token at a near tie (random weights are full of them)."""
    cont = list(reference[len(prompt):])
    llm.reset()
    llm.eval(prompt)
    before = llm.moe_cache_stats()
    t0 = time.perf_counter()
    for i in range(0, len(cont), draft + 1):
        llm.eval(cont[i:i + draft + 1])
    t = time.perf_counter() - t0
    after = llm.moe_cache_stats()
    decodes = -(-len(cont) // (draft + 1))
    out: dict[str, Any] = {"n": len(cont), "n_prompt": len(prompt), "draft": draft, "drafted_by": "forced",
                           "ts": len(cont) / t, "decodes": decodes, "tokens_per_decode": len(cont) / max(decodes, 1),
                           "proposed": len(cont) - decodes, "accepted": len(cont) - decodes, "digest": ""}
    return out | cache_counts(before, after, decodes, len(cont))


def generate_with_drafts(llm: Llama, code: Sequence[int], n: int, drafts: Sequence[int],
                         bounds: bool = False) -> list[dict[str, Any]]:
    """Per prompt (``code`` quoted, then prose), ``n`` greedy tokens without a draft and with prompt lookup at each
    draft size (with ``bounds``, also the :class:`Replay` drafts of the text generated without one); each result says
    whether its text is the one without a draft (``same_text``). First, a few tokens with each draft size proposing
    every time, untimed: the verification's ubatch sizes build their graphs and load their kernels outside the
    timing."""
    prompts = {"code": code_prompt(llm, code), "text": prose_prompt(llm)}
    filler = [*prompts["code"], *code[: n + max(drafts, default=0)]]
    for d in drafts:
        generate(llm, prompts["code"], min(n, WARMUP_TOKENS), d, "wrong", filler)
    out = []
    for kind, prompt in prompts.items():
        plain = {"prompt": kind, **generate(llm, prompt, n, 0)}
        plain["same_text"] = True
        reference = llm.input_ids[: llm.n_tokens].tolist()  # the prompt and the text generated, but its last token
        out.append(plain)
        for d in drafts:
            for by in RUNS + BOUNDS if bounds else RUNS:
                if by == "forced":  # the text without a draft, by construction
                    g = {"prompt": kind, **forced(llm, prompt, reference, d), "same_text": True}
                else:
                    g = {"prompt": kind, **generate(llm, prompt, n, d, by, reference)}
                    g["same_text"] = g["digest"] == plain["digest"]
                out.append(g)
    return out
