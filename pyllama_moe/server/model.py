"""The served models: each loaded once and used by one request at a time."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
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


@dataclass
class ServedModel:
    """One model behind a lock: requests queue on it; ``stop`` asks a running stream to end. ``n_ctx`` is its
    context, read once at the start, so that requests are checked against it without waiting for the lock."""

    settings: ModelSettings
    llama: Any
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)
    stats: Stats = field(default_factory=Stats)
    n_ctx: int | None = None

    def __post_init__(self) -> None:
        n_ctx = getattr(self.llama, "n_ctx", None)
        if self.n_ctx is None and callable(n_ctx):
            self.n_ctx = int(n_ctx())

    def run(self, fn: Callable[[Any], Any]) -> Any:
        """Run ``fn(llama)`` alone on the model (blocking; call it from a worker thread)."""
        with self.lock:
            self.stop.clear()
            t0 = time.perf_counter()
            try:
                return fn(self.llama)
            finally:
                self.stats.busy_seconds += time.perf_counter() - t0

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
            close = getattr(m.llama, "close", None)
            if close is not None:
                close()
        self.models.clear()
