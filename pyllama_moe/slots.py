"""``Slots``: continuous batching of completions over one context of ``n_seq_max`` sequences.

One worker thread owns the steps. A request (a ``completion.Request``) is handed to it through a queue and gets a
free slot (a sequence id, its KV range, its sampler chain) between two steps; each step is one ``llama_decode``
of the next token of every generating slot plus chunks of the prompts being read, split evenly among them so that a
long prompt does not stall the others; each slot then samples from its own output and takes the token through
``Completion.accept`` (stop strings, logprobs, ``max_tokens``: the single-request path's code). A request that is
cancelled (a client gone) leaves its slot at the next step. A slot keeps its tokens' KV range when its request
leaves: the next request given to it keeps the prefix they share and evaluates the rest.

A step decodes as many tokens as there are generating slots, plus prompt chunks up to ``n_batch``. A ubatch of up to
32 tokens is looked up in the MoE cache on the device; a larger one (a step with prompt chunks, or more than 32
generating slots) is not looked up at all: it runs as a prompt's ubatch does, its experts copied from host memory, and
the generating slots wait for it.

The slots whose chain samples natively (all but greedy sampling: ``llama_sampler_sample`` copies every logit into
token data and runs the chain, about half a millisecond a slot with a 152k vocabulary) draw their tokens in a pool of
threads (``PYLLAMA_MOE_SAMPLE_THREADS``; the C calls release the interpreter), each chain on its own output, the
decode's logits read-only; the tokens are then taken in slot order by the step's thread, as before.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Generator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pyllama_moe.batch import Batch
from pyllama_moe.cache import longest_token_prefix
from pyllama_moe.completion import ENDED, LAST, Completion
from pyllama_moe.context import Context
from pyllama_moe.errors import ClosedError, LlamaError
from pyllama_moe.sampler import Sampler
from pyllama_moe.session import Session

_END = object()


class Job:
    """One request's generation on a slot: its events (chunks, then the end or an exception) for the thread that
    reads them, its cancellation, and its times."""

    def __init__(self, completion: Completion, stream: bool) -> None:
        self.completion = completion
        self.stream = stream
        self.events: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.cancelled = threading.Event()
        self.t_submit = time.perf_counter()
        self.t_first: float | None = None  # its first token sampled
        self.t_end: float | None = None

    def cancel(self) -> None:
        """Leave the slot at the next step (the chunks not read are dropped)."""
        self.cancelled.set()

    def chunks(self) -> Generator[dict[str, Any], None, dict[str, int]]:
        """The stream's chunks as they come, returning its usage (``Completion.chunks``); closing the iterator early
        cancels the request."""
        try:
            while True:
                item = self.events.get()
                if item is _END:
                    return self.completion.usage()
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self.cancel()

    def result(self) -> dict[str, Any]:
        """The whole completion once it ends (``Completion.summary``)."""
        try:
            for _ in self.chunks():
                pass
        finally:
            self.cancel()
        return self.completion.summary()

    @property
    def tokens_per_second(self) -> float:
        """Its generated tokens over the time from its first token to its end."""
        n = len(self.completion.tokens)
        if self.t_first is None or self.t_end is None or n < 2 or self.t_end <= self.t_first:
            return 0.0
        return (n - 1) / (self.t_end - self.t_first)


@dataclass
class _Slot:
    seq: int
    tokens: list[int] = field(default_factory=list)  # evaluated in its KV range
    job: Job | None = None
    pending: list[int] = field(default_factory=list)  # to evaluate: the prompt's rest, or the token sampled
    sampler: Sampler | None = None
    reading: bool = False  # evaluating its prompt (no token sampled yet)


@dataclass
class SlotStats:
    """The counts of ``Slots`` since it started (read by the server's ``/metrics``)."""

    steps: int = 0
    tokens_generated: int = 0
    prompt_tokens: int = 0
    busy_seconds: float = 0.0
    requests: int = 0
    request_tps_sum: float = 0.0  # the finished requests' tokens per second, summed
    last_request_tps: float = 0.0
    ttft_seconds_sum: float = 0.0


class Slots:
    """``n_parallel`` slots over one context, stepped by a worker thread (see the module's docstring).

    ``hold`` is the owner's lock for one step: it raises when the owner is closed, and keeps the owner's other
    calls (which may move the context) apart from the steps."""

    def __init__(self, ctx: Context, session: Session, n_parallel: int, n_batch: int,
                 hold: Callable[[], contextlib.AbstractContextManager[Any]]) -> None:
        if not 1 <= n_parallel <= ctx.n_seq_max():
            raise ValueError(f"n_parallel must be 1..{ctx.n_seq_max()} (the context's n_seq_max), got {n_parallel}")
        if n_parallel > n_batch:  # each step holds a token of every generating slot and one of a prompt
            raise ValueError(f"n_parallel ({n_parallel}) must be at most n_batch ({n_batch})")
        self.ctx, self.session, self.hold = ctx, session, hold
        self.n_ctx = session.n_ctx  # each slot's share of the context
        self.n_batch = n_batch
        self.slots = [_Slot(i) for i in range(n_parallel)]
        self.stats = SlotStats()
        self._batch = Batch(n_batch)
        self._waiting: deque[Job] = deque()
        self._wake = threading.Condition()
        self._closed = False
        self._moves = -1  # the session's count of moves after the last step: another call moved the context
        self._events: list[tuple[Job, Any]] = []  # the step's, handed over at its end
        n_draw = sample_threads(n_parallel)
        self._draws = ThreadPoolExecutor(n_draw, thread_name_prefix="pyllama_moe-sample") if n_draw > 1 else None
        self._thread = threading.Thread(target=self._loop, name="pyllama_moe-slots", daemon=True)
        self._thread.start()

    # the requests' side
    def submit(self, completion: Completion, stream: bool = True) -> Job:
        """Queue a request; it gets a slot between two steps."""
        req = completion.req
        if req.logits_processor is not None or req.stopping_criteria is not None or req.draft_model is not None:
            raise ValueError("logits_processor, stopping_criteria and draft_model are not supported by parallel slots")
        job = Job(completion, stream)
        with self._wake:
            if self._closed:
                raise LlamaError("the parallel slots are closed")
            self._waiting.append(job)
            self._wake.notify()
        return job

    @property
    def queued(self) -> int:
        """Requests waiting for a slot."""
        return len(self._waiting)

    @property
    def busy(self) -> int:
        """Slots running a request."""
        return sum(s.job is not None for s in self.slots)

    def close(self) -> None:
        """Stop the worker; the requests in progress and waiting end with LlamaError (idempotent)."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        if self._thread is not threading.current_thread():
            self._thread.join()
        self._fail_all(LlamaError("the parallel slots were closed"))
        if self._draws is not None:
            self._draws.shutdown()
        self._batch.close()

    # the worker
    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._closed and not self._waiting and not self.busy:
                    self._wake.wait()
                if self._closed:
                    return
            try:
                with self.hold():
                    t0 = time.perf_counter()
                    self._step()
                    self.stats.busy_seconds += time.perf_counter() - t0
            except BaseException as e:  # noqa: BLE001 - every request in progress learns it; the loop goes on
                self._fail_all(e)
                if isinstance(e, ClosedError):
                    with self._wake:
                        self._closed = True
                    return

    def _step(self) -> None:
        try:
            self._step_slots()
        finally:
            self._flush()

    def _step_slots(self) -> None:
        session = self.session
        if session.moves != self._moves:  # the owner's own calls used the context: the slots' ranges are gone
            for s in self.slots:
                if s.job is not None:
                    self._finish(s, LlamaError("another call moved the context under the parallel slots"))
                s.tokens = []
            self.ctx.memory_clear()
        self._leave_cancelled()
        self._admit()
        rows = self._fill()
        if rows is not None:
            self.ctx.decode(self._batch)
            self.stats.steps += 1
            # the outputs' logits read in place, one call for the step: the j-th output is rows[j]'s
            logits = self.ctx.logits_view(len(rows))
            drawn = self._draw(rows, logits)
            for j, (slot, _) in enumerate(rows):
                self._sample(slot, logits[j], drawn[j])
        if session.n_tokens:  # the single-request path's tokens are gone from sequence 0
            session.reset()
        self._moves = session.moves

    def _leave_cancelled(self) -> None:
        for s in self.slots:
            if s.job is not None and s.job.cancelled.is_set():
                self._finish(s, None)
        with self._wake:
            if any(j.cancelled.is_set() for j in self._waiting):
                self._waiting = deque(j for j in self._waiting if not j.cancelled.is_set())

    def _admit(self) -> None:
        """Waiting requests into free slots, each to the one whose tokens share most of its prompt."""
        while True:
            free = [s for s in self.slots if s.job is None]
            with self._wake:
                if not free or not self._waiting:
                    return
                job = self._waiting.popleft()
            prompt = job.completion.req.prompt_tokens
            slot = max(free, key=lambda s: longest_token_prefix(s.tokens, prompt))
            keep = min(longest_token_prefix(slot.tokens, prompt), len(prompt) - 1)  # the last one gives the logits
            if keep < len(slot.tokens) and not self.ctx.seq_rm(slot.seq, keep, -1):
                self.ctx.seq_rm(slot.seq, 0, -1)  # a recurrent memory cannot drop a suffix: start over
                keep = 0
            slot.tokens = slot.tokens[:keep]
            slot.pending = list(prompt[keep:])
            slot.job, slot.reading = job, True
            try:
                slot.sampler = Sampler(self.session.vocab, job.completion.req.sampling)
            except BaseException as e:  # noqa: BLE001 - this request's failure
                self._finish(slot, e)
                continue
            self.stats.prompt_tokens += len(slot.pending)
            if job.completion.req.max_tokens <= 0:
                self._finish(slot, None)

    def _fill(self) -> list[tuple[_Slot, int]] | None:
        """The step's batch: the sampled token of each generating slot, then the prompts' chunks sharing what is
        left of ``n_batch``. Returns the slots with an output and its row (none for a step of prompt chunks that
        all go on), None when there is nothing to decode."""
        gen = [s for s in self.slots if s.job is not None and not s.reading and s.pending]
        reading = [s for s in self.slots if s.job is not None and s.reading]
        tokens: list[int] = []
        pos: list[int] = []
        seqs: list[int] = []
        outs: list[bool] = []
        rows: list[tuple[_Slot, int]] = []
        for s in gen:
            tokens.append(s.pending[0])
            pos.append(len(s.tokens))
            seqs.append(s.seq)
            outs.append(True)
            rows.append((s, len(tokens) - 1))
        room = self.n_batch - len(tokens)
        parts: list[tuple[_Slot, int]] = []
        for i, s in enumerate(reading):
            share = max(1, room // (len(reading) - i)) if room > 0 else 0
            n = min(share, len(s.pending))
            if n == 0:
                continue
            room -= n
            last = n == len(s.pending)
            tokens += s.pending[:n]
            pos += range(len(s.tokens), len(s.tokens) + n)
            seqs += [s.seq] * n
            outs += [False] * (n - 1) + [last]
            if last:
                rows.append((s, len(tokens) - 1))
            parts.append((s, n))
        if not tokens:
            return None
        self._batch.set_entries(tokens, pos, seqs, outs)
        # the slots' evaluated tokens move on now: a failed decode fails every request of the step
        for s in gen:
            s.tokens.append(s.pending.pop(0))
        for s, n in parts:
            s.tokens += s.pending[:n]
            del s.pending[:n]
        return rows

    def _draw(self, rows: list[tuple[_Slot, int]], logits: np.ndarray) -> list[int | BaseException]:
        """Each output's token from its slot's sampler (batch index ``row``, logits ``logits[j]``: views, valid in
        this step), or the exception its chain raised (a grammar with no way on fails its own request only). The
        native chains' draws run in the pool where there are two or more; each touches its own chain only."""

        def draw(j: int) -> int | BaseException:
            slot, row = rows[j]
            assert slot.sampler is not None
            try:
                return slot.sampler.sample(self.ctx, row, logits[j])
            except BaseException as e:  # noqa: BLE001 - handed to the request
                return e

        order = range(len(rows))
        native = [j for j, (slot, _) in enumerate(rows) if slot.sampler is not None and not slot.sampler.in_python]
        if self._draws is None or len(native) < 2:
            return [draw(j) for j in order]
        drawn: dict[int, int | BaseException] = dict(zip(native, self._draws.map(draw, native), strict=True))
        return [drawn[j] if j in drawn else draw(j) for j in order]

    def _sample(self, slot: _Slot, out: np.ndarray, drawn: int | BaseException) -> None:
        """Take the slot's token ``drawn`` from its output (logits ``out``: a view, valid in this step), or fail its
        request with the exception its sampler raised."""
        job = slot.job
        assert job is not None
        completion = job.completion
        if isinstance(drawn, BaseException):
            self._finish(slot, drawn)
            return
        token = drawn
        logits = out if completion.lp is not None else None  # read by accept (logprobs), not kept
        if job.t_first is None:
            job.t_first = time.perf_counter()
            self.stats.ttft_seconds_sum += job.t_first - job.t_submit
        slot.reading = False
        took = completion.accept(token, logits)
        if took != ENDED:
            self.stats.tokens_generated += 1
            if job.stream:
                chunk = completion.step_chunk()
                if chunk is not None:
                    self._emit(job, chunk)
        if took == ENDED or took == LAST:
            self._finish(slot, None)
        elif len(slot.tokens) >= self.n_ctx:  # the slot's share of the context is full
            completion.finish_reason = "length"
            self._finish(slot, None)
        else:
            slot.pending = [token]

    def _finish(self, slot: _Slot, error: BaseException | None) -> None:
        """The slot's request ends (with ``error``): its chunks' end, its sampler freed; the slot is free and keeps
        its evaluated tokens for the next request's prefix."""
        job, slot.job = slot.job, None
        if slot.sampler is not None:
            slot.sampler.close()
            slot.sampler = None
        slot.pending, slot.reading = [], False
        if job is None:
            return
        job.t_end = time.perf_counter()
        if error is not None:
            self._emit(job, error)
        else:
            if job.stream and not job.cancelled.is_set():
                for chunk in job.completion.final_chunks():
                    self._emit(job, chunk)
            tps = job.tokens_per_second
            self.stats.requests += 1
            self.stats.request_tps_sum += tps
            self.stats.last_request_tps = tps
        self._emit(job, _END)

    def _emit(self, job: Job, item: Any) -> None:
        """An event of ``job``, handed over when the step ends (``_flush``)."""
        self._events.append((job, item))

    def _flush(self) -> None:
        """The step's events to their readers, together once the step's work is done: a reader woken by its token
        while the step still samples other slots would contend with it for the interpreter."""
        events, self._events = self._events, []
        for job, item in events:
            job.events.put(item)

    def _fail_all(self, error: BaseException) -> None:
        for s in self.slots:
            if s.job is not None:
                self._finish(s, error)
            s.tokens = []
        self._flush()
        with self._wake:
            waiting, self._waiting = list(self._waiting), deque()
        for job in waiting:
            job.events.put(error)
            job.events.put(_END)
        with contextlib.suppress(Exception):
            self.ctx.memory_clear()


def sample_threads(n_parallel: int) -> int:
    """The threads that draw the slots' tokens from native chains: ``PYLLAMA_MOE_SAMPLE_THREADS`` (1: in the step's
    thread, as before), else one a slot up to the CPUs there are."""
    env = os.environ.get("PYLLAMA_MOE_SAMPLE_THREADS", "").strip()
    if env:
        try:
            n = int(env)
        except ValueError:
            raise ValueError(f"PYLLAMA_MOE_SAMPLE_THREADS must be a whole number, got {env!r}") from None
        return max(1, min(n, n_parallel))
    return max(1, min(n_parallel, os.cpu_count() or 1))
