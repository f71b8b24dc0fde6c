"""The batch sizes a prompt runs with: llama-cpp-python's where the caller gave them or the experts are on the GPU,
a larger ubatch chosen where the experts come from host memory (#68).

With the experts in host memory and a GPU running the rest, every ubatch of a prompt uploads every host expert once
(the scheduler's copies for the GPU's matmuls, or the MoE cache's prefetch of a large ubatch): the prompt's speed is
bounded by uploads per ubatch, so a larger ubatch divides that cost. Its price is the compute buffer, which grows
with the ubatch and shares the device with the weights, the KV cache and the MoE cache.

The rule (``choose``) takes the facts as values and the memory as a callable, so that it is tested without a GPU;
``moe.place`` gathers them from the placement it made and measures the memory through llama.cpp.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from pyllama_moe.params import check_int

__all__ = ["Batches", "Choice", "Facts", "Room", "TARGET_UBATCH", "UNSET", "choose"]

# llama-cpp-python 0.3.36's defaults of Llama(n_batch=512, n_ubatch=512)
LLAMA_CPP_PYTHON_BATCH: Final = 512

# The ubatch chosen where the experts come from host memory. Measured on one H100 (PCIe gen5, 55 GB/s pinned upload),
# the synthetic 30b-a3b model (48 layers of 128 experts of 2.53 MiB, 16.3 GB uploaded per ubatch): a prompt of 512
# at ub 512 1587 tokens/s with cpu_moe (a cache of 25%: 2215; all on the GPU 6387), prompts of 8192 and 32768 at
# ub 2048 6142-6213 tokens/s (docs/performance.md, 2026-12-07). A larger ubatch nears the compute bound further at
# twice the compute buffer; 4096 is not measured yet.
TARGET_UBATCH: Final = 2048

# How much of itself an auto-sized MoE cache (moe_cache_mib="auto", alone or with fit) gives to a larger compute
# buffer before the ubatch halves instead. A judgement, not a measurement: 2048 against 512 was 2.8-3.9x on the
# prompt above, while a quarter less cache costs decode a fraction of that (README's table: 25% -> 50% of the experts
# took the realistic regime's decode from 137.5 to 185.8 tokens/s).
CACHE_GIVE_MAX: Final = 0.25


class Unset(int):
    """A keyword's default that reads as llama-cpp-python's number (``inspect.signature``, ``repr``) while saying
    that the caller gave none: ``Llama(n_ubatch=512)`` is an ``int`` and honoured, the default is this."""

    __slots__ = ()

    def __repr__(self) -> str:
        return int.__repr__(self)


UNSET: Final = Unset(LLAMA_CPP_PYTHON_BATCH)


@dataclass(frozen=True)
class Batches:
    """``n_batch`` and ``n_ubatch`` as the caller gave them (None: left at the default)."""

    n_batch: int | None
    n_ubatch: int | None

    @classmethod
    def asked(cls, n_batch: int, n_ubatch: int) -> Batches:
        """The keywords, checked once: a default (``UNSET``) is None."""
        def given(name: str, value: int) -> int | None:
            return None if isinstance(value, Unset) else check_int(name, value, 1, 2**32 - 1)
        return cls(given("n_batch", n_batch), given("n_ubatch", n_ubatch))

    def defaults(self, n_ctx: int) -> tuple[int, int]:
        """llama-cpp-python's ``n_batch`` and ``n_ubatch`` for a context of ``n_ctx`` (0: the model's, cut at load):
        the batch at most the context, the ubatch at most the batch."""
        n_batch = self.n_batch or LLAMA_CPP_PYTHON_BATCH
        n_ubatch = self.n_ubatch or LLAMA_CPP_PYTHON_BATCH
        return (min(n_ctx, n_batch) if n_ctx else n_batch), min(n_ctx or n_batch, n_batch, n_ubatch)


@dataclass(frozen=True)
class Facts:
    """What the placement made, as far as the ubatch cares."""

    gpu: bool  # a GPU device holds layers of the model
    host_experts: int  # expert tensors in host memory
    n_ctx: int  # the context (0: the model's, which the load cuts the batch sizes to)
    cache_bytes: int  # the MoE cache as placed
    cache_auto: bool  # the cache was sized from the memory left (moe_cache_mib="auto"): it may give way
    host_expert_bytes: int = 0  # the host experts' bytes: a cache holds no more than them (0: no bound known)

    def cache_used(self, size: int) -> int:
        """What a cache of ``size`` bytes holds: llama.cpp makes no more slots than there are host experts."""
        return min(size, self.host_expert_bytes) if self.host_expert_bytes else size


@dataclass(frozen=True)
class Room:
    """The devices' memory with the compute buffer of one ubatch."""

    fits: bool  # every device keeps its margin (fit_target_mib) after the weights, context, cache and compute
    cache_bytes: int = 0  # an auto-sized cache: the size it would have beside this compute buffer


@dataclass(frozen=True)
class Choice:
    n_batch: int
    n_ubatch: int
    chosen: bool  # False: as given, or llama-cpp-python's default
    reason: str
    cache_bytes: int | None = None  # an auto-sized cache that gave way: its new size


def choose(asked: Batches, facts: Facts, room: Callable[[int], Room]) -> Choice:
    """The batch sizes for this placement. An ``n_ubatch`` given is honoured (at most ``n_batch`` and the context, as
    llama-cpp-python cuts it). Otherwise, with experts in host memory and a GPU: the largest of ``TARGET_UBATCH``
    (at most a given ``n_batch`` and the context), then its halves above 512, whose compute buffer fits the device
    memory left; an auto-sized cache gives way up to ``CACHE_GIVE_MAX`` of itself, a cache of a given size or the
    fit's layers do not. ``n_batch``, when not given, follows the ubatch. ``room`` is called per candidate."""
    n_batch, n_ubatch = asked.defaults(facts.n_ctx)
    if asked.n_ubatch is not None:
        return Choice(n_batch, n_ubatch, False, "given")
    if not facts.gpu:
        return Choice(n_batch, n_ubatch, False, "llama-cpp-python's default: no GPU holds layers")
    if not facts.host_experts:
        return Choice(n_batch, n_ubatch, False, "llama-cpp-python's default: the experts are in device memory")
    caps = [(TARGET_UBATCH, "")]
    if asked.n_batch is not None:
        caps.append((asked.n_batch, f" (n_batch={asked.n_batch})"))
    if facts.n_ctx:
        caps.append((facts.n_ctx, f" (n_ctx={facts.n_ctx})"))
    first, capped = min(caps, key=lambda c: c[0])
    if first <= n_ubatch:
        return Choice(n_batch, n_ubatch, False, f"llama-cpp-python's default: no larger ubatch{capped}")
    had = facts.cache_used(facts.cache_bytes)
    tried: list[str] = []
    ub = first
    while ub > n_ubatch:
        r = room(ub)
        gave = had - facts.cache_used(r.cache_bytes) if facts.cache_auto else 0
        if r.fits and gave <= CACHE_GIVE_MAX * had:
            why = f"experts in host memory: ubatch {ub}{capped if ub == first else ''}"
            if tried:
                why += f", not {' or '.join(tried)}"
            if gave > 0:
                why += f"; the MoE cache (auto) gave {gave >> 20} MiB to the compute buffer"
            return Choice(n_batch if asked.n_batch is not None else max(n_batch, ub), ub, True, why,
                          r.cache_bytes if facts.cache_auto else None)
        tried.append(f"{ub} ({f'the cache would give more than {CACHE_GIVE_MAX:.0%}' if r.fits else 'no room'})")
        ub //= 2
    return Choice(n_batch, n_ubatch, False,
                  f"llama-cpp-python's default: a larger ubatch's compute buffer does not fit ({', '.join(tried)})")
