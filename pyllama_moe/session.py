"""``Session``: the tokens evaluated in sequence 0 of a context and their logits: prepare, generate, state, embed.

A generated token costs four calls into the library, whatever the sampler: ``llama_sampler_sample``
(the whole chain runs in C and accepts the token; through the shim, which turns an exception into an
error), ``llama_vocab_is_eog``, ``llama_token_to_piece`` and ``llama_decode``. Logits are copied to Python only
when the request needs them (``logprobs``, ``logits_processor``, ``stopping_criteria``, ``logits_all``).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from pyllama_moe.batch import Batch
from pyllama_moe.context import Context
from pyllama_moe.errors import ContextLengthError, LlamaError
from pyllama_moe.llama_types import LlamaState, LogitsProcessorList, StoppingCriteriaList
from pyllama_moe.sampler import Sampler
from pyllama_moe.vocab import Vocab, token_array

if TYPE_CHECKING:  # pragma: no cover
    from pyllama_moe.llama_speculative import LlamaDraftModel


MEDIA_TOKEN = 0
"""What ``input_ids`` holds at a position decoded from an image's embeddings (any id of the vocabulary would do:
:meth:`Session.prepare` never takes it for the image unless the prompt is the one :meth:`Session.media_prompt`
gave)."""


def logits_to_logprobs(logits: Any, axis: int = -1) -> np.ndarray:
    """log-softmax (llama-cpp-python's ``Llama.logits_to_logprobs``)."""
    logits = np.asarray(logits, dtype=np.single)
    m = np.amax(logits, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    shifted = logits - m
    with np.errstate(divide="ignore"):
        return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))


class Session:
    """The tokens evaluated in sequence 0 of a context, and the logits kept for them."""

    def __init__(self, ctx: Context, batch: Batch, vocab: Vocab, logits_all: bool, seed: int,
                 model_id: str | None = None, n_ctx: int | None = None) -> None:
        self.ctx = ctx
        self.model_id = model_id  # saved with the state; a state of another model is refused
        self.batch = batch
        self.vocab = vocab
        # the context asked for: llama.cpp rounds a context up to a multiple of 256 (n_ctx=32 holds 256 tokens), but
        # a prompt and its completion get what was asked for, as with llama-cpp-python over a llama.cpp that did not;
        # a context of several sequences gives each its share (n_ctx / n_seq_max)
        self.n_ctx = min(ctx.n_ctx_seq(), n_ctx) if n_ctx else ctx.n_ctx_seq()
        self.n_batch = batch.capacity
        self.n_vocab = vocab.n_tokens
        self.logits_all = logits_all
        self.input_ids = np.zeros(self.n_ctx, dtype=np.intc)
        self.n_tokens = 0
        self.moves = 0  # counts prepare, eval, reset, load_state and embed: a stream sees another call's move
        self.seed = seed  # the sampling seed, saved with the state (llama-cpp-python's Llama._seed)
        self._scores: np.ndarray | None = None  # (n_ctx, n_vocab), allocated when first needed
        # the first position that holds embeddings (an image's) rather than a token's, None if none: input_ids says
        # MEDIA_TOKEN there, which no later prompt may take for the image (see prepare)
        self.media_from: int | None = None
        self._media_prompt: int | None = None  # the count of moves at which eval_media's prompt was evaluated

    @property
    def scores(self) -> np.ndarray:
        """Logits by position: kept for every token with ``logits_all``; otherwise only the last
        position's row is filled, on access."""
        if self._scores is None:
            self._scores = np.zeros((self.n_ctx, self.n_vocab), dtype=np.single)  # calloc: pages come on use
        if not self.logits_all and self.n_tokens > 0:
            self._scores[self.n_tokens - 1] = self.ctx.logits_ith(-1)
        return self._scores

    def reset(self) -> None:
        self.n_tokens = 0
        self.moves += 1
        self.media_from = None

    def _check_room(self, n: int) -> None:
        if self.n_tokens + n > self.n_ctx:
            raise ContextLengthError(self.n_tokens + n, self.n_ctx)

    def eval(self, tokens: Sequence[int]) -> None:
        """Decode ``tokens`` after the ones evaluated (in batches of n_batch)."""
        self.moves += 1
        arr = token_array("tokens", tokens, self.n_vocab)
        self._check_room(len(arr))
        self.ctx.seq_rm(-1, self.n_tokens, -1)
        for i in range(0, len(arr), self.n_batch):
            chunk = arr[i:i + self.n_batch]
            # only the last batch needs an output (without logits_all): the batches before it compute no logits,
            # and llama.cpp seeds the MoE cache at their end only where the prompt starts
            self._decode(chunk, self.logits_all, last_output=i + len(chunk) >= len(arr))

    def _decode(self, tokens: Sequence[int] | np.ndarray, all_outputs: bool, last_output: bool) -> None:
        """One decode of at most a batch of tokens after the evaluated ones, kept in ``input_ids`` (and their
        logits in ``scores`` with ``logits_all``)."""
        n, k = self.n_tokens, len(tokens)
        self.batch.set_tokens(tokens, n, all_outputs, last_logits=last_output)
        self.ctx.decode(self.batch)
        self.input_ids[n:n + k] = tokens
        if self.logits_all:
            self.scores[n:n + k] = self.ctx.logits_rows(k)
        self.n_tokens += k

    def prepare(self, tokens: Sequence[int], reset: bool = True) -> None:
        """Evaluate a prompt, keeping the longest prefix already in the context (its KV cache)."""
        tokens = token_array("tokens", tokens, self.n_vocab).tolist()
        if not tokens:
            raise ValueError("the prompt has no tokens")
        media_prompt = self.media_prompt_pending()
        self._media_prompt = None
        if reset and self.n_tokens > 0:
            head = np.asarray(tokens[:-1], dtype=np.intc)
            n = min(len(head), self.n_tokens)
            diff = np.flatnonzero(self.input_ids[:n] != head[:n])
            prefix = int(diff[0]) if len(diff) else n
            if self.media_from is not None and not media_prompt:  # placeholders are no image: not kept
                prefix = min(prefix, self.media_from)
            if prefix > 0 and self.ctx.seq_rm(-1, prefix, -1):
                self.n_tokens = prefix
                self._forget_media_after(prefix)
                tokens = tokens[prefix:]
            else:
                self.reset()
        elif reset:
            self.reset()
        self.eval(tokens)

    def generate(self, sampler: Sampler, *, want_logits: bool = False,
                 logits_processor: LogitsProcessorList | None = None,
                 stopping_criteria: StoppingCriteriaList | None = None,
                 draft_model: LlamaDraftModel | None = None,
                 ) -> Generator[tuple[int, np.ndarray | None], Sequence[int] | None, None]:
        """Sample, yield (token, its logits or None), evaluate it (and any tokens sent) when resumed.

        The caller stops by leaving the loop: the last token yielded is then not evaluated (as in
        llama-cpp-python), which saves a decode. With ``draft_model`` a sampled token is evaluated together with the
        tokens the draft proposes after it; each of them that is sampled next is then taken from that decode's
        outputs instead of a decode of its own, and the first one that is not is removed with those after it.
        """
        need_logits = want_logits or logits_processor is not None or stopping_criteria is not None
        drafts: list[int] = []  # proposed tokens evaluated after the last sampled one and not sampled yet
        row = -1  # the output of the last decode to sample from
        try:
            while True:
                done = self.n_tokens - len(drafts)  # the tokens sampled (or given) so far
                if done >= self.n_ctx:
                    return
                logits: np.ndarray | None = None
                if logits_processor is not None:
                    logits = self.ctx.logits_ith(row)
                    token = sampler.sample_logits(logits_processor(self.input_ids[:done], logits.copy()))
                else:
                    token = sampler.sample(self.ctx, row)  # raises once the Llama is closed under a live stream
                    logits = self.ctx.logits_ith(row) if need_logits else None
                if stopping_criteria is not None and logits is not None \
                        and stopping_criteria(self.input_ids[:done], logits):
                    return
                sent = yield token, logits
                if drafts and not sent and token == drafts[0]:  # evaluated already: its outputs are the next row
                    drafts.pop(0)
                    row += 1
                    continue
                self._drop(drafts)
                drafts, row = [], -1
                if sent:  # llama-cpp-python's generate: tokens sent are evaluated after this one
                    self.eval([token, *sent])
                    continue
                proposal = self._proposal(draft_model, token) if draft_model is not None else []
                if proposal:
                    self._eval_outputs([token, *proposal])
                    drafts, row = proposal, 0
                else:
                    self.eval_one(token)
        finally:  # left with proposals not sampled: as without a draft, only what was sampled stays evaluated
            self._drop(drafts)

    def _drop(self, drafts: list[int]) -> None:
        """Remove the last ``len(drafts)`` evaluated tokens (proposals that were not sampled)."""
        if drafts:
            self.n_tokens -= len(drafts)
            self.ctx.seq_rm(-1, self.n_tokens, -1)

    # media: what is decoded from embeddings (an image's) rather than from tokens
    def eval_media(self, n_tokens: int, evaluate: Callable[[int], int]) -> None:
        """Decode embeddings after the evaluated tokens: ``evaluate(n_past)`` decodes them from position ``n_past``
        (``MtmdContext.eval_chunk``) and returns the position after them. They take ``n_tokens`` cells of the
        context; their positions hold ``MEDIA_TOKEN`` in ``input_ids``, which only :meth:`media_prompt` hands on."""
        self.moves += 1
        self._check_room(n_tokens)
        self.ctx.seq_rm(-1, self.n_tokens, -1)
        start = self.n_tokens
        end = evaluate(start)
        if not start < end <= self.n_ctx:
            raise LlamaError(f"evaluating an image from position {start} ended at position {end}, outside "
                             f"{start + 1}..{self.n_ctx}")
        self.input_ids[start:end] = MEDIA_TOKEN
        self.n_tokens = end
        if self.media_from is None:
            self.media_from = start

    def media_prompt(self) -> list[int]:
        """The evaluated tokens (``MEDIA_TOKEN`` where media was decoded), as the prompt of the completion that
        follows them: the next :meth:`prepare`, if nothing moves the context before it, keeps all but the last
        position of it (its embeddings included); any other prompt keeps nothing from the first media on."""
        self._media_prompt = self.moves
        return self.input_ids[:self.n_tokens].tolist()

    def media_prompt_pending(self) -> bool:
        """Whether the next :meth:`prepare` is that of :meth:`media_prompt`'s prompt (nothing moved since)."""
        return self._media_prompt is not None and self._media_prompt == self.moves

    def _forget_media_after(self, n: int) -> None:
        if self.media_from is not None and self.media_from >= n:
            self.media_from = None

    def _proposal(self, draft_model: LlamaDraftModel, token: int) -> list[int]:
        """What ``draft_model`` proposes after the evaluated tokens and ``token``, cut to what one batch and the
        context hold."""
        ids = np.append(self.input_ids[:self.n_tokens], np.intc(token)).astype(np.intc)
        room = min(self.n_batch, self.n_ctx - self.n_tokens) - 1
        if room <= 0:
            return []
        proposal = np.asarray(draft_model(ids), dtype=np.int64).reshape(-1)[:room]
        if len(proposal) and (proposal.min() < 0 or proposal.max() >= self.n_vocab):
            raise ValueError(f"the draft model proposed a token outside the vocabulary (0..{self.n_vocab - 1})")
        return [int(t) for t in proposal]

    def _eval_outputs(self, tokens: list[int]) -> None:
        """One decode of ``tokens`` (at most a batch) with an output for each: a draft's verification."""
        self._check_room(len(tokens))
        self._decode(tokens, True, True)

    def eval_one(self, token: int) -> None:
        """The generation step: one token, one ``llama_decode``."""
        n = self.n_tokens
        self.ctx.ptr  # noqa: B018 - raises once closed, before the batch is touched
        self.batch.set_one(token, n)
        self.ctx.decode(self.batch)
        self.input_ids[n] = token
        self.n_tokens = n + 1
        if self.logits_all:
            self.scores[n] = self.ctx.logits_ith(-1)

    # state
    def save_state(self) -> LlamaState:
        data = self.ctx.state_get()
        n = self.n_tokens
        scores = self.scores[:n].copy() if self.logits_all else np.zeros((0, self.n_vocab), dtype=np.single)
        return LlamaState(input_ids=self.input_ids.copy(), scores=scores, n_tokens=n, llama_state=data,
                          llama_state_size=len(data), seed=self.seed, model_id=self.model_id,
                          media_from=self.media_from)

    def load_state(self, state: LlamaState) -> None:
        if not isinstance(state, LlamaState):
            raise TypeError(f"load_state takes a LlamaState (from save_state), got {type(state).__name__}")
        other = getattr(state, "model_id", None)  # a state pickled before the field existed has none
        if other is not None and self.model_id is not None and other != self.model_id:
            raise ValueError(f"load_state: the state was saved from another model (model_id {other}, this one is "
                             f"{self.model_id}): its KV cache would be taken for this model's")
        # llama_state_set_data reads nothing from an empty buffer and reports success: the context would go on
        # with what it held while input_ids said otherwise
        if state.llama_state_size <= 0 or len(state.llama_state) < state.llama_state_size:
            raise ValueError("load_state: the state is empty or shorter than its llama_state_size")
        if not 0 <= state.n_tokens <= min(self.n_ctx, len(state.input_ids)):
            raise ValueError(f"load_state: n_tokens {state.n_tokens} is outside the context (0..{self.n_ctx}) "
                             "or its input_ids")
        self.moves += 1
        try:
            self.ctx.state_set(state.llama_state[:state.llama_state_size])
        except LlamaError:
            self.reset()  # llama.cpp emptied or half read the cache: none of the tokens held before are there
            raise
        n = state.n_tokens
        self.input_ids[:] = 0
        self.input_ids[:n] = state.input_ids[:n]
        if self.logits_all and len(state.scores):
            self.scores[:n] = state.scores[:n]
        self.n_tokens = n
        self.seed = state.seed
        self.media_from = getattr(state, "media_from", None)  # a state pickled before the field existed has none

    # embeddings
    def embed(self, texts: list[str], normalize: bool, truncate: bool) -> tuple[list[Any], int]:
        """Each text decoded alone in sequence 0 of a cleared context; its pooled vector, or with
        pooling none one vector per token. Returns the embeddings and the number of tokens."""
        ctx = self.ctx
        self.moves += 1
        pooled = ctx.pooled()
        limit = min(self.n_batch, ctx.n_ubatch()) if pooled else self.n_batch
        out: list[Any] = []
        total = 0
        for text in texts:
            tokens = self.vocab.tokenize(text.encode("utf-8"), add_special=True, parse_special=False)
            if truncate:
                tokens = tokens[:limit]
            if len(tokens) > limit:
                raise ValueError(f"Requested tokens ({len(tokens)}) exceed batch size of {limit}")
            if not tokens:
                raise ValueError("cannot embed an empty text")
            total += len(tokens)
            ctx.memory_clear()
            self.batch.set_tokens(tokens, 0, all_logits=True)
            ctx.decode(self.batch)
            if pooled:
                out.append(_normalized(ctx.embeddings_seq(0), normalize).tolist())
            else:
                out.append([_normalized(ctx.embeddings_ith(i), normalize).tolist() for i in range(len(tokens))])
        ctx.memory_clear()
        self.reset()
        return out, total


def _normalized(v: np.ndarray, normalize: bool) -> np.ndarray:
    if not normalize:
        return v
    norm = float(np.linalg.norm(v))
    return v / norm if norm > 0 else v
