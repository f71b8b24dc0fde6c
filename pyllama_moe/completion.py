"""The generation loop: the evaluated tokens of a context (``Session``) and ``create_completion``.

A generated token costs four calls into the library, whatever the sampler: ``llama_sampler_sample``
(the whole chain runs in C and accepts the token; through the shim, which turns an exception into an
error), ``llama_vocab_is_eog``,
``llama_token_to_piece`` and ``llama_decode``. Logits are copied to Python only when the request
needs them (``logprobs``, ``logits_processor``, ``stopping_criteria``, ``logits_all``). The text is
built incrementally: a token adds its piece's bytes, stop strings are searched only where the new
bytes can complete one, and the stream releases text through an incremental UTF-8 decoder, holding
back the bytes that may still become a stop string. Streamed chunks join to the non-streamed text.
"""

from __future__ import annotations

import codecs
import random
import time
import uuid
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from pyllama_moe.batch import Batch
from pyllama_moe.cache import longest_token_prefix
from pyllama_moe.context import Context
from pyllama_moe.errors import ContextLengthError, check_decode
from pyllama_moe.ffi import lib
from pyllama_moe.sampler import Sampler, SamplingParams
from pyllama_moe.llama_types import CompletionLogprobs, LogitsProcessorList, StoppingCriteriaList
from pyllama_moe.vocab import Vocab

if TYPE_CHECKING:  # pragma: no cover
    from pyllama_moe.llama import Llama
    from pyllama_moe.llama_speculative import LlamaDraftModel


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

    def __init__(self, ctx: Context, batch: Batch, vocab: Vocab, logits_all: bool) -> None:
        self.ctx = ctx
        self.batch = batch
        self.vocab = vocab
        self.n_ctx = ctx.n_ctx()
        self.n_batch = batch.capacity
        self.n_vocab = vocab.n_tokens
        self.logits_all = logits_all
        self.input_ids = np.zeros(self.n_ctx, dtype=np.intc)
        self.n_tokens = 0
        self._scores: np.ndarray | None = None  # (n_ctx, n_vocab), allocated when first needed

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

    def _check_room(self, n: int) -> None:
        if self.n_tokens + n > self.n_ctx:
            raise ContextLengthError(self.n_tokens + n, self.n_ctx)

    def eval(self, tokens: Sequence[int]) -> None:
        """Decode ``tokens`` after the ones evaluated (in batches of n_batch)."""
        arr = _token_ids(tokens, self.n_vocab)
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
        if not len(tokens):
            raise ValueError("the prompt has no tokens")
        tokens = list(tokens)
        if reset and self.n_tokens > 0:
            head = np.asarray(tokens[:-1], dtype=np.intc)
            n = min(len(head), self.n_tokens)
            diff = np.flatnonzero(self.input_ids[:n] != head[:n])
            prefix = int(diff[0]) if len(diff) else n
            if prefix > 0 and self.ctx.seq_rm(-1, prefix, -1):
                self.n_tokens = prefix
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
                ctx_ptr = self.ctx.ptr  # raises once the Llama is closed under a live stream
                done = self.n_tokens - len(drafts)  # the tokens sampled (or given) so far
                if done >= self.n_ctx:
                    return
                logits: np.ndarray | None = None
                if logits_processor is not None:
                    logits = self.ctx.logits_ith(row)
                    token = sampler.sample_logits(logits_processor(self.input_ids[:done], logits.copy()))
                else:
                    token = sampler.sample(ctx_ptr, row)
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
        ctx_ptr = self.ctx.ptr  # raises once closed, before the batch is touched
        self.batch.set_one(token, n)
        check_decode(lib.llama_decode(ctx_ptr, self.batch.value))
        self.input_ids[n] = token
        self.n_tokens = n + 1
        if self.logits_all:
            self.scores[n] = self.ctx.logits_ith(-1)


def _token_ids(tokens: Sequence[int], n_vocab: int) -> np.ndarray:
    """Token ids as the batch takes them (int32), each checked against the vocabulary: an id past it (or one that
    wraps around in 32 bits) would make llama.cpp read outside the embedding table."""
    try:
        wide = np.asarray(tokens, dtype=np.int64).reshape(-1)
    except (OverflowError, TypeError, ValueError) as e:
        raise ValueError(f"tokens must be integer token ids: {e}") from None
    bad = np.flatnonzero((wide < 0) | (wide >= n_vocab))
    if len(bad):
        raise ValueError(f"token {int(wide[bad[0]])} (at {int(bad[0])}) is not in the vocabulary (0..{n_vocab - 1})")
    return wide.astype(np.intc)


class _Text:
    """The generated bytes, the first stop string in them, and what the stream has released."""

    def __init__(self, stops: list[bytes]) -> None:
        self.buf = bytearray()
        self.stops = [s for s in stops if s]
        self.reach = max((len(s) for s in self.stops), default=0)
        self.stop_at: int | None = None
        self.released = 0
        self.decoder = codecs.getincrementaldecoder("utf-8")("ignore")

    def add(self, piece: bytes) -> bool:
        """Append a token's bytes; True when a stop string is now complete."""
        start = max(0, len(self.buf) - self.reach + 1)
        self.buf += piece
        if self.stops:
            found = [i for i in (self.buf.find(s, start) for s in self.stops) if i >= 0]
            if found:
                self.stop_at = min(found)
                return True
        return False

    @property
    def end(self) -> int:
        return len(self.buf) if self.stop_at is None else self.stop_at

    def _held(self) -> int:
        """The longest tail that is the beginning of a stop string (it may still become one)."""
        held = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(self.buf)), held, -1):
                if self.buf.endswith(s[:k]):
                    held = k
                    break
        return held

    def release(self, final: bool = False) -> str:
        """The text that can be streamed now (all of it up to the stop when ``final``)."""
        end = self.end if final else max(self.released, len(self.buf) - self._held())
        out = self.decoder.decode(bytes(self.buf[self.released:end]), final=final)
        self.released = end
        return out

    def text(self) -> str:
        return self.buf[:self.end].decode("utf-8", errors="ignore")


@dataclass
class _Logprobs:
    """Per-token logprobs, computed when the token is sampled (its logits are not kept)."""

    n: int
    vocab: Vocab
    offset: int
    tokens: list[str] = field(default_factory=list)
    text_offset: list[int] = field(default_factory=list)
    token_logprobs: list[float | None] = field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = field(default_factory=list)
    _decoder: Any = field(default_factory=lambda: codecs.getincrementaldecoder("utf-8")("ignore"))

    def add(self, token: int, logits: np.ndarray | None) -> None:
        piece = self.vocab.piece(token)
        text = piece.decode("utf-8", errors="ignore")
        self.text_offset.append(self.offset)
        self.offset += len(self._decoder.decode(piece))
        self.tokens.append(text)
        if logits is None:
            self.token_logprobs.append(None)
            self.top_logprobs.append(None)
            return
        lp = logits_to_logprobs(logits)
        k = min(self.n, len(lp))
        top = np.argpartition(-lp, k - 1)[:k] if k > 0 else np.array([], dtype=np.intp)
        top = top[np.argsort(-lp[top], kind="stable")]
        d = {self.vocab.piece(int(i)).decode("utf-8", errors="ignore"): float(lp[i]) for i in top}
        d[text] = float(lp[token])
        self.token_logprobs.append(float(lp[token]))
        self.top_logprobs.append(d)

    def result(self, upto: int) -> CompletionLogprobs:
        return {"tokens": self.tokens[:upto], "text_offset": self.text_offset[:upto],
                "token_logprobs": self.token_logprobs[:upto], "top_logprobs": self.top_logprobs[:upto]}


@dataclass
class Request:
    """A validated ``create_completion`` call."""

    prompt_text: str
    prompt_tokens: list[int]
    max_tokens: int
    stops: list[bytes]
    sampling: SamplingParams
    logprobs: int | None
    echo: bool
    model: str
    logits_processor: LogitsProcessorList | None
    stopping_criteria: StoppingCriteriaList | None


def prompt_tokens(llama: Llama, prompt: str | Sequence[int], suffix: str | None) -> list[int]:
    """llama-cpp-python's prompt: BOS (if the vocabulary adds one) + the text's tokens (special
    tokens parsed); a token list is taken as is. With ``suffix``, fill-in-the-middle tokens."""
    vocab = llama._vocab
    if not isinstance(prompt, str):
        tokens = [int(t) for t in prompt]
        bad = [t for t in tokens if not 0 <= t < vocab.n_tokens]
        if bad:
            raise ValueError(f"prompt: tokens {bad[:5]} are not in the vocabulary (0..{vocab.n_tokens - 1})")
        return tokens
    bos = [vocab.bos()] if vocab.add_bos() and vocab.bos() != -1 else []
    eos = [vocab.sep() if vocab.sep() != -1 else vocab.eos()] if (vocab.add_eos() or vocab.sep() != -1) else []
    text = llama.tokenize(prompt.encode("utf-8"), add_bos=False, special=suffix is None) if prompt else []
    if suffix is None:
        tokens = bos + text + eos
    else:
        pre, suf, mid = (int(f(vocab.ptr)) for f in (lib.llama_vocab_fim_pre, lib.llama_vocab_fim_suf,
                                                     lib.llama_vocab_fim_mid))
        if -1 in (pre, suf, mid):
            raise ValueError("suffix: the model has no fill-in-the-middle tokens")
        tail = llama.tokenize(suffix.encode("utf-8"), add_bos=False, special=False)
        parts = [suf] + tail + [pre] + text if llama.spm_infill else [pre] + text + [suf] + tail
        tokens = bos + parts + [mid]
    if not tokens:
        bos_id = vocab.bos()
        if bos_id == -1:
            raise ValueError("prompt is empty and the model has no BOS token to start from")
        tokens = [bos_id]
    return tokens


def make_request(llama: Llama, prompt: str | Sequence[int], *, suffix: str | None, max_tokens: int | None,
                 stop: str | list[str] | None, logprobs: int | None, echo: bool, seed: int | None,
                 model: str | None, logits_processor: Any, stopping_criteria: Any, sampling: dict[str, Any]) -> Request:
    if not isinstance(prompt, (str, list, tuple, np.ndarray)):
        raise ValueError(f"prompt must be a string or a list of tokens, got {type(prompt).__name__}")
    tokens = prompt_tokens(llama, prompt, suffix)
    n_ctx = llama._session.n_ctx
    if len(tokens) >= n_ctx:
        raise ContextLengthError(len(tokens), n_ctx)
    if max_tokens is None or max_tokens <= 0:
        max_tokens = n_ctx - len(tokens)
    max_tokens = min(int(max_tokens), n_ctx - len(tokens))
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if not all(isinstance(s, str) for s in stops):
        raise ValueError(f"stop must be a string or a list of strings, got {stop!r}")
    if logprobs is not None and (isinstance(logprobs, bool) or not isinstance(logprobs, int) or logprobs < 0):
        raise ValueError(f"logprobs must be a non-negative integer or None, got {logprobs!r}")
    if logprobs is not None and echo and not llama._logits_all:
        raise ValueError("logprobs with echo=True needs the prompt's logits: create the Llama with logits_all=True")
    # llama-cpp-python: without a seed, the next one is drawn from the current one (reproducible)
    new_seed = seed if seed is not None else random.Random(llama._seed).randint(0, 2**32)
    params = SamplingParams(seed=new_seed, penalty_last_n=llama.last_n_tokens_size, **sampling)
    llama.set_seed(new_seed)
    if isinstance(logits_processor, list) and not isinstance(logits_processor, LogitsProcessorList):
        logits_processor = LogitsProcessorList(logits_processor)
    if isinstance(stopping_criteria, list) and not isinstance(stopping_criteria, StoppingCriteriaList):
        stopping_criteria = StoppingCriteriaList(stopping_criteria)
    prompt_text = prompt if isinstance(prompt, str) else llama.detokenize(tokens).decode("utf-8", errors="ignore")
    return Request(prompt_text=prompt_text, prompt_tokens=tokens, max_tokens=max_tokens,
                   stops=[s.encode("utf-8") for s in stops], sampling=params, logprobs=logprobs, echo=echo,
                   model=model if model is not None else llama.model_path,
                   logits_processor=logits_processor or None, stopping_criteria=stopping_criteria or None)


class Completion:
    """One request's generation; ``chunks()`` streams it, ``result()`` returns the whole."""

    def __init__(self, llama: Llama, req: Request) -> None:
        self.llama = llama
        self.req = req
        self.id = f"cmpl-{uuid.uuid4()}"
        self.created = int(time.time())
        self.tokens: list[int] = []
        self.finish_reason = "length"
        self.text = _Text(req.stops)
        offset = 0 if req.echo else len(req.prompt_text)
        self.lp = _Logprobs(req.logprobs, llama._vocab, offset) if req.logprobs is not None else None

    def _chunk(self, text: str, logprobs: Any, finish: str | None) -> dict[str, Any]:
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.req.model,
                "choices": [{"text": text, "index": 0, "logprobs": logprobs, "finish_reason": finish}]}

    def _run(self) -> Iterator[int]:
        """Generate; yields the number of tokens done after each one."""
        req, session = self.req, self.llama._session
        self._cache_load()
        session.prepare(req.prompt_tokens)
        if self.lp is not None and req.echo:
            self._echo_logprobs()
        if req.max_tokens <= 0:
            return
        vocab = session.vocab
        vocab_ptr = vocab.ptr
        sampler = Sampler(vocab_ptr, session.n_vocab, req.sampling)
        try:
            steps = session.generate(sampler, want_logits=self.lp is not None, logits_processor=req.logits_processor,
                                     stopping_criteria=req.stopping_criteria, draft_model=self.llama.draft_model)
            for token, logits in steps:
                if lib.llama_vocab_is_eog(vocab_ptr, token):
                    self.finish_reason = "stop"
                    break
                self.tokens.append(token)
                if self.lp is not None:
                    self.lp.add(token, logits)
                if self.text.add(vocab.piece(token)):
                    self.finish_reason = "stop"
                    break
                yield len(self.tokens)
                if len(self.tokens) >= req.max_tokens:
                    break
            else:  # the steps ended: a stopping criterion, or the context is full
                self.finish_reason = "stop" if session.n_tokens < session.n_ctx else "length"
            steps.close()
        finally:
            sampler.close()
        cache = self.llama.cache
        if cache is not None:
            cache[req.prompt_tokens + self.tokens] = self.llama.save_state()

    def _cache_load(self) -> None:
        """``Llama.set_cache``: start from the cached state when it shares more of the prompt."""
        cache, llama, prompt = self.llama.cache, self.llama, self.req.prompt_tokens
        if cache is None:
            return
        try:
            item = cache[prompt]
        except KeyError:
            return
        cached = longest_token_prefix(item.input_ids[:item.n_tokens].tolist(), prompt)
        if cached > longest_token_prefix(llama._input_ids.tolist(), prompt):
            llama.load_state(item)

    def _echo_logprobs(self) -> None:
        assert self.lp is not None
        session, req = self.llama._session, self.req
        toks = req.prompt_tokens
        first = 1 if toks and toks[0] == session.vocab.bos() else 0
        scores = session.scores
        for j in range(first, len(toks)):
            self.lp.add(toks[j], scores[j - 1] if j > first else None)

    def result(self) -> dict[str, Any]:
        for _ in self._run():
            pass
        text = self.text.text()
        if self.req.echo:
            text = self.req.prompt_text + text
        logprobs = None
        if self.lp is not None:
            logprobs = self.lp.result(len(self.lp.tokens))
            if self.req.echo and logprobs["token_logprobs"]:
                logprobs["token_logprobs"][0] = None
                logprobs["top_logprobs"][0] = None
        out = self._chunk(text, logprobs, self.finish_reason)
        n_prompt, n_gen = len(self.req.prompt_tokens), len(self.tokens)
        out["usage"] = {"prompt_tokens": n_prompt, "completion_tokens": n_gen, "total_tokens": n_prompt + n_gen}
        return out

    def chunks(self) -> Generator[dict[str, Any], None, None]:
        for _ in self._run():
            text = self.text.release()
            logprobs = None
            if self.lp is not None:  # the token just generated
                logprobs = {k: v[-1:] for k, v in self.lp.result(len(self.lp.tokens)).items()}  # type: ignore
            if text or logprobs is not None:
                yield self._chunk(text, logprobs, None)
        rest = self.text.release(final=True)
        if rest:
            yield self._chunk(rest, None, None)
        yield self._chunk("", None, self.finish_reason)


def embed(llama: Llama, texts: list[str], normalize: bool, truncate: bool) -> tuple[list[Any], int]:
    """Each text decoded alone in sequence 0 of a cleared context; its pooled vector, or with
    pooling none one vector per token. Returns the embeddings and the number of tokens."""
    session, ctx = llama._session, llama._ctx
    pooled = ctx.pooling_type() != lib.LLAMA_POOLING_TYPE_NONE
    limit = min(session.n_batch, ctx.n_ubatch()) if pooled else session.n_batch
    out: list[Any] = []
    total = 0
    for text in texts:
        tokens = llama.tokenize(text.encode("utf-8"))
        if truncate:
            tokens = tokens[:limit]
        if len(tokens) > limit:
            raise ValueError(f"Requested tokens ({len(tokens)}) exceed batch size of {limit}")
        if not tokens:
            raise ValueError("cannot embed an empty text")
        total += len(tokens)
        ctx.memory_clear()
        session.batch.set_tokens(tokens, 0, all_logits=True)
        ctx.decode(session.batch)
        if pooled:
            out.append(_normalized(ctx.embeddings_seq(0), normalize).tolist())
        else:
            out.append([_normalized(ctx.embeddings_ith(i), normalize).tolist() for i in range(len(tokens))])
    ctx.memory_clear()
    session.reset()
    return out, total


def _normalized(v: np.ndarray, normalize: bool) -> np.ndarray:
    if not normalize:
        return v
    norm = float(np.linalg.norm(v))
    return v / norm if norm > 0 else v
