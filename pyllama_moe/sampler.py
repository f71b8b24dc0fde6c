"""``Sampler``: owns one ``llama_sampler`` chain, built once per request from ``SamplingParams``.

The chain is llama-cpp-python 0.3's: logit bias, penalties, grammar, then greedy (temperature
<= 0), mirostat, or top-k, typical, top-p, min-p, temperature and a seeded draw.
"""

from __future__ import annotations

import math
import os
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from pyllama_moe.errors import GrammarError, LlamaError, check_closed, check_ptr, check_true, native_mark
from pyllama_moe.ffi import ffi, lib
from pyllama_moe.gbnf import check_grammar
from pyllama_moe.grammar import grammar_text
from pyllama_moe.params import check_bias, check_float, check_int, warn_outside

if TYPE_CHECKING:
    from pyllama_moe.context import Context
    from pyllama_moe.vocab import Vocab

DEFAULT_SEED = 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: a random seed
_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    typical_p: float = 1.0
    repeat_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    penalty_last_n: int = 64
    mirostat_mode: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    seed: int = DEFAULT_SEED
    logit_bias: Mapping[int, float] | None = field(default=None)
    grammar: Any = None

    def __post_init__(self) -> None:
        check_float("temperature", self.temperature)
        check_int("top_k", self.top_k, -(2**31), 2**31 - 1)
        for name in ("top_p", "min_p", "typical_p", "mirostat_tau", "mirostat_eta"):
            check_float(name, getattr(self, name))
        # llama-cpp-python passes these on unchecked and llama.cpp clamps or ignores them: kept, but said
        for name in ("top_p", "min_p", "typical_p"):
            warn_outside(name, getattr(self, name), 0.0, 1.0)
        warn_outside("mirostat_tau", self.mirostat_tau, 0.0, None)
        check_float("repeat_penalty", self.repeat_penalty)
        if self.repeat_penalty <= 0:
            raise ValueError(f"repeat_penalty must be > 0, got {self.repeat_penalty}")
        check_float("frequency_penalty", self.frequency_penalty)
        check_float("presence_penalty", self.presence_penalty)
        check_int("last_n_tokens_size", self.penalty_last_n, -1, 2**31 - 1)
        check_int("mirostat_mode", self.mirostat_mode, 0, 2)
        check_int("seed", self.seed, -(2**63), 2**64 - 1)
        if self.logit_bias is not None and not isinstance(self.logit_bias, Mapping):
            raise ValueError(f"logit_bias must be a dict of token id -> bias, got {self.logit_bias!r}")
        for key, bias in (self.logit_bias or {}).items():  # before the prompt is evaluated
            check_bias(f"logit_bias[{_token_key(key)}]", bias)
        g = grammar_text(self.grammar)
        if g is not None:  # before the request evaluates its prompt: a refused grammar costs nothing
            check_grammar(g[0])

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0


class Sampler:
    """llama.cpp's sampler chain for ``params`` over ``vocab``: owns the chain, samples from a context's outputs."""

    def __init__(self, vocab: Vocab, params: SamplingParams) -> None:
        self._ptr: Any = None
        self.n_vocab = vocab.n_tokens
        self._cur: Any = None
        self._failed = ffi.new("bool *")
        # greedy with nothing before it but llama.cpp's repeat penalty (no bias, grammar, frequency or presence
        # penalty): the token is read in Python from the output's logits in place, the penalized ones changed in a
        # copy as llama.cpp's penalties sampler changes them (the same float32 operations), the first largest taken;
        # llama_sampler_sample would copy all n_vocab of them into token data first, a third of a millisecond per
        # token with a 150k vocabulary, half a millisecond with the penalties
        p = params
        last_n = max(p.penalty_last_n, 0)  # llama_sampler_init_penalties's
        repeat = np.float32(p.repeat_penalty)  # the float the chain holds
        others = np.float32(p.frequency_penalty) != 0.0 or np.float32(p.presence_penalty) != 0.0
        self._argmax = (p.greedy and not p.logit_bias and p.grammar is None and not (last_n > 0 and others)
                        and os.environ.get("PYLLAMA_MOE_GREEDY_ARGMAX", "1") != "0")
        self._penalty: np.float32 | None = repeat if self._argmax and last_n > 0 and repeat != 1.0 else None
        self._recent: deque[int] = deque(maxlen=last_n or 1)  # the tokens the penalties count (the chain's ring)
        self._counts: dict[int, int] = {}
        self._native_behind = False  # the argmax path took tokens the chain's penalties did not see
        self._work: np.ndarray | None = None  # the penalized copy of the logits
        chain = lib.llama_sampler_chain_init(lib.llama_sampler_chain_default_params())
        self._ptr = chain
        try:
            self._build(vocab.ptr, params)
        except BaseException:
            self.close()
            raise

    def _add(self, smpl: Any) -> None:
        lib.llama_sampler_chain_add(self.ptr, smpl)  # the chain owns it from here

    def _build(self, vocab: Any, p: SamplingParams) -> None:
        if p.logit_bias:
            items = []
            for key, bias in p.logit_bias.items():
                tok = _token_key(key)
                if not 0 <= tok < self.n_vocab:
                    raise ValueError(f"logit_bias: token {tok} is not in the vocabulary (0..{self.n_vocab - 1})")
                items.append((tok, check_bias(f"logit_bias[{tok}]", bias)))
            arr = ffi.new("llama_logit_bias[]", items)
            self._add(lib.llama_sampler_init_logit_bias(self.n_vocab, len(items), arr))
        if _penalized(p):
            self._add(lib.llama_sampler_init_penalties(self.n_vocab, p.penalty_last_n, p.repeat_penalty,
                                                       p.frequency_penalty, p.presence_penalty))
        g = grammar_text(p.grammar)
        if g is not None:  # checked with the parameters (check_grammar)
            mark = native_mark()
            smpl = check_ptr(lib.llama_sampler_init_grammar(vocab, g[0].encode(), g[1].encode()), GrammarError,
                             "grammar: cannot parse the grammar", since=mark)
            self._add(smpl)
        seed = p.seed & 0xFFFFFFFF
        if p.greedy:
            self._add(lib.llama_sampler_init_greedy())
        elif p.mirostat_mode == 1:  # llama-cpp-python: mirostat alone, without the temperature
            self._add(lib.llama_sampler_init_mirostat(self.n_vocab, seed, p.mirostat_tau, p.mirostat_eta, 100))
        elif p.mirostat_mode == 2:
            self._add(lib.llama_sampler_init_mirostat_v2(seed, p.mirostat_tau, p.mirostat_eta))
        else:
            self._add(lib.llama_sampler_init_top_k(p.top_k))
            self._add(lib.llama_sampler_init_typical(p.typical_p, 1))
            self._add(lib.llama_sampler_init_top_p(p.top_p, 1))
            self._add(lib.llama_sampler_init_min_p(p.min_p, 1))
            self._add(lib.llama_sampler_init_temp(p.temperature))
            self._add(lib.llama_sampler_init_dist(seed))

    @property
    def ptr(self) -> Any:
        return check_closed(self._ptr, "sampler")

    @property
    def in_python(self) -> bool:
        """Whether :meth:`sample` takes its token in Python (greedy, the largest logit) rather than through the
        native chain (``llama_sampler_sample``, which copies every logit first)."""
        check_closed(self._ptr, "sampler")
        return self._argmax

    def sample(self, ctx: Context, idx: int = -1, logits: np.ndarray | None = None) -> int:
        """Sample from output ``idx`` of the context's last decode and accept the token: one call. ``logits``: that
        output's logits when the caller has them already (a view of the context's outputs, not written)."""
        ptr = self.ptr  # raises once the sampler is closed (cffi would pass None on as NULL)
        ctx_ptr = ctx.ptr  # and once the context is
        if self._argmax:
            if logits is None:
                p = lib.llama_get_logits_ith(ctx_ptr, idx)
                if p == ffi.NULL:  # llama_sampler_sample would abort the process
                    raise LlamaError(f"no logits for output {idx}")
                logits = np.frombuffer(ffi.buffer(p, 4 * self.n_vocab), dtype=np.float32)
            token = self._greedy(logits)
            if token is not None:
                self._remember(token)
                self._native_behind = self._penalty is not None
                return token
        self._sync_native()
        mark = native_mark()
        token = int(lib.pyllama_moe_sampler_sample(ptr, ctx_ptr, idx, self._failed))
        self._check(mark)
        self._remember(token)
        return token

    def _greedy(self, logits: np.ndarray) -> int | None:
        """The first largest logit after the repeat penalty; None where it is NaN (llama.cpp's greedy sampler passes
        over a NaN, argmax stops at it: the chain decides)."""
        if self._penalty is not None and self._counts:
            if self._penalty > 1:
                # a penalty above 1 only lowers the logits it touches (or keeps them: 0, infinities, NaN), so an
                # untouched first largest stays the first largest: no copy of the row (a step of many slots pays it
                # for each)
                token = int(logits.argmax())
                if token not in self._counts:
                    return None if math.isnan(logits[token]) else token
            if self._work is None:
                self._work = np.empty(self.n_vocab, dtype=np.float32)
            work = self._work
            np.copyto(work, logits)
            ids = np.fromiter(self._counts, dtype=np.intp, count=len(self._counts))
            v = work[ids]
            # llama.cpp: a logit <= 0 is multiplied by the penalty, a larger one divided (NaN: divided)
            work[ids] = np.where(v <= 0, v * self._penalty, v / self._penalty)
            logits = work
        token = int(logits.argmax())
        return None if math.isnan(logits[token]) else token

    def _sync_native(self) -> None:
        """The chain's penalties count the tokens the argmax path took: reset, they accept the last ones again."""
        if self._native_behind:
            self._native_behind = False
            lib.llama_sampler_reset(self.ptr)
            for t in self._recent:
                self._accept_native(t)

    def _remember(self, token: int) -> None:
        """The penalties' count of the last ``penalty_last_n`` tokens accepted (as the chain's ring buffer)."""
        if self._penalty is None:
            return
        recent, counts = self._recent, self._counts
        if len(recent) == recent.maxlen:
            old = recent[0]
            counts[old] -= 1
            if not counts[old]:
                del counts[old]
        recent.append(token)
        counts[token] = counts.get(token, 0) + 1

    def _check(self, mark: int) -> None:
        # the shim turned an exception of the chain into failed: a grammar that accepts no token
        check_true(not self._failed[0], GrammarError, "grammar: no token can continue the text", since=mark)

    def sample_logits(self, logits: np.ndarray) -> int:
        """Sample from logits given by Python (after logits processors) and accept the token."""
        scores = np.asarray(logits, dtype=np.float32) if logits is not None else None
        if scores is None or scores.shape != (self.n_vocab,):
            shape = None if scores is None else scores.shape
            raise ValueError(f"logits_processor must return {self.n_vocab} scores (one per token), got {shape}")
        if np.isnan(scores).any():
            raise ValueError("logits_processor returned NaN scores")
        logits = scores
        if self._cur is None:
            self._cur = ffi.new("llama_token_data[]", self.n_vocab)
            self._view = np.frombuffer(ffi.buffer(self._cur), dtype=_TOKEN_DATA)
            self._arr = ffi.new("llama_token_data_array *")
        self._view["id"] = np.arange(self.n_vocab, dtype=np.int32)
        self._view["logit"] = logits
        self._view["p"] = 0.0
        self._sync_native()
        arr = self._arr
        arr.data, arr.size, arr.selected, arr.sorted = self._cur, self.n_vocab, -1, False
        lib.llama_sampler_apply(self.ptr, arr)
        if not 0 <= arr.selected < arr.size:
            raise GrammarError("the sampler chain selected no token (the grammar allows none?)")
        token = int(arr.data[arr.selected].id)
        self.accept(token)
        return token

    def accept(self, token: int) -> None:
        self._accept_native(token)
        self._remember(token)

    def _accept_native(self, token: int) -> None:
        mark = native_mark()
        lib.pyllama_moe_sampler_accept(self.ptr, token, self._failed)
        self._check(mark)

    def reset(self) -> None:
        lib.llama_sampler_reset(self.ptr)
        self._recent.clear()
        self._counts.clear()
        self._native_behind = False

    def close(self) -> None:
        ptr, self._ptr = self._ptr, None
        if ptr is not None:
            lib.llama_sampler_free(ptr)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001  # pragma: no cover - interpreter shutdown
            pass


def _token_key(key: Any) -> int:
    """A ``logit_bias`` key: a token id, or its decimal text (JSON keys, as llama-cpp-python's ``int(k)``); a float or
    a bool is refused rather than cut to an integer."""
    if isinstance(key, str) and key.strip().lstrip("-").isdigit():
        return int(key)
    if isinstance(key, bool) or not isinstance(key, (int, np.integer)):
        raise ValueError(f"logit_bias: keys must be integer token ids, got {key!r}")
    return int(key)


def _penalized(p: SamplingParams) -> bool:
    return p.repeat_penalty != 1.0 or p.frequency_penalty != 0.0 or p.presence_penalty != 0.0
