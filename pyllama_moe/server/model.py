"""The served models: each loaded once; with ``n_parallel`` 1 used by one request at a time, with more its
completions run side by side in the Llama's parallel slots (one batch per step); past ``n_parallel + max_queue``
requests in flight a model refuses more (``QueueFullError``, HTTP 429)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from pyllama_moe.server.settings import ModelSettings


@dataclass
class Stats:
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    busy_seconds: float = 0.0


class ModelNotServedError(LookupError):
    """A request names a model this server does not serve (a 404, ``model_not_found``)."""


class QueueFullError(RuntimeError):
    """More requests than the model runs and queues (``n_parallel + max_queue``): a 429."""


class SlotRouted:
    """The Llama as a request's code sees it with parallel slots: its completions, and those of the chat handlers,
    go to ``Llama.submit_completion``; everything else is the Llama's."""

    def __init__(self, llama: Any) -> None:
        self._llama = llama

    def __getattr__(self, name: str) -> Any:
        return getattr(self._llama, name)

    def create_completion(self, prompt: Any = "", **kwargs: Any) -> Any:
        job = self._llama.submit_completion(prompt, **kwargs)
        return job.chunks() if kwargs.get("stream") else job.result()

    def create_chat_completion(self, messages: list[dict[str, Any]], **kwargs: Any) -> Any:
        from pyllama_moe.chat.dispatch import create_chat_completion

        return create_chat_completion(self, messages=messages, **kwargs)


@dataclass
class ServedModel:
    """One model: with ``n_parallel`` 1 behind a lock (requests queue on it; ``stop`` asks a running stream to end),
    with more its completions share the Llama's parallel slots. ``n_ctx`` is a request's context (a slot's share),
    read once at the start, so that requests are checked against it without waiting for the model."""

    settings: ModelSettings
    llama: Any
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)
    stats: Stats = field(default_factory=Stats)
    n_ctx: int | None = None
    in_flight: int = 0  # requests admitted and not ended (running and waiting)
    executor: ThreadPoolExecutor | None = None  # the streams' producers, one thread for each request admitted
    moe_read: Any = None  # the MoE cache's counts at the last /metrics read
    moe_hit_rate: float | None = None  # their hits over lookups between the last two reads that looked up

    def __post_init__(self) -> None:
        n_ctx = getattr(self.llama, "n_ctx", None)
        if self.n_ctx is None and callable(n_ctx):
            self.n_ctx = int(n_ctx())
        self._admission = threading.Lock()
        if self.parallel:
            self.executor = ThreadPoolExecutor(self.settings.n_parallel + self.settings.max_queue,
                                               thread_name_prefix="pyllama_moe-request")

    @property
    def parallel(self) -> bool:
        return self.settings.n_parallel > 1

    @property
    def capacity(self) -> int:
        return self.settings.n_parallel + self.settings.max_queue

    def admit(self) -> Callable[[], None]:
        """Count a generation request in, or QueueFullError past ``n_parallel + max_queue``; returns its release
        (idempotent)."""
        with self._admission:
            if self.in_flight >= self.capacity:
                raise QueueFullError(f"the server is busy: {self.in_flight} requests running or waiting for model "
                                     f"{self.settings.alias!r} (n_parallel {self.settings.n_parallel} + max_queue "
                                     f"{self.settings.max_queue}); retry later")
            self.in_flight += 1
        released = False

        def release() -> None:
            nonlocal released
            with self._admission:
                if not released:
                    released = True
                    self.in_flight -= 1

        return release

    def slot_info(self) -> dict[str, Any]:
        """Slots, their context, and the requests running and waiting (``/health``, ``/v1/models``)."""
        n = self.settings.n_parallel
        slots = getattr(self.llama, "slots", None) if self.parallel else None
        if slots is not None:
            busy, queued = slots.busy, slots.queued
        else:
            busy = min(self.in_flight, n)
            queued = self.in_flight - busy
        return {"n_parallel": n, "n_ctx_per_slot": self.n_ctx, "slots_busy": busy, "queued": queued,
                "max_queue": self.settings.max_queue}

    def run(self, fn: Callable[[Any], Any]) -> Any:
        """Run ``fn(llama)`` on the model (blocking; call it from a worker thread): alone, or with parallel slots
        beside the other requests."""
        if self.parallel:
            return fn(SlotRouted(self.llama))
        with self.lock:
            self.stop.clear()
            t0 = time.perf_counter()
            try:
                return fn(self.llama)
            finally:
                self.stats.busy_seconds += time.perf_counter() - t0

    def moe_hit_rate_since_read(self, now: Any) -> float | None:
        """With parallel slots, the MoE cache's hits over lookups between the last read of its counts (or its start)
        and ``now`` (the value of the last reads that looked up, if none since): the steps do not read the counts
        themselves (on a GPU each read waits for the device). None without a cache."""
        if not self.parallel or now is None:
            return None
        hits, misses = (now - self.moe_read if self.moe_read is not None else now).hits("small", "large", "device")
        if hits + misses:
            self.moe_hit_rate = hits / (hits + misses)
        self.moe_read = now
        return self.moe_hit_rate

    def count(self, usage: dict[str, int] | None) -> None:
        self.stats.requests += 1
        if usage:
            self.stats.prompt_tokens += usage.get("prompt_tokens", 0)
            self.stats.completion_tokens += usage.get("completion_tokens", 0)


class ModelPool:
    """The models by alias; the first one answers requests that name none."""

    def __init__(self, settings: list[ModelSettings], factory: Callable[..., Any] | None = None) -> None:
        if factory is None:
            from pyllama_moe.llama import Llama

            factory = Llama
        self.models: dict[str, ServedModel] = {}
        try:
            for s in settings:
                if s.alias in self.models:
                    raise ValueError(f"two models are served as {s.alias!r}: give each a model_alias")
                self.models[s.alias] = ServedModel(s, factory(s.model, **s.llama_kwargs()))
        except BaseException:
            self.close()
            raise

    def get(self, name: str | None) -> ServedModel:
        if not name or (len(self.models) == 1 and name not in self.models):
            # like llama-cpp-python: with one model, any name selects it
            return next(iter(self.models.values()))
        try:
            return self.models[name]
        except KeyError:
            raise ModelNotServedError(f"model {name!r} is not served here; models: {', '.join(self.models)}") from None

    def close(self) -> None:
        for m in self.models.values():
            if m.executor is not None:
                m.executor.shutdown(wait=False, cancel_futures=True)
            close = getattr(m.llama, "close", None)
            if close is not None:
                close()
        self.models.clear()
