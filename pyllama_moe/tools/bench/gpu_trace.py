"""What the GPU did during a timed region: kernels and copies per stream, through PyTorch's profiler (CUPTI).

``bench --trace`` wraps the timed prompt (and the ``--first`` tokens) of each Python run in a
:class:`Tracer`. CUPTI records the activity of every CUDA library in the process, ours included, so
the summary shows what a timeline would: how long the compute kernels and the host-to-device copies
kept the device busy, how much of the copying hid under compute, bytes per copy kind, and the kernels
that took the most time. Nsight Systems does not run on our GPU machine; this does.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

# kernels that move bytes rather than compute: the copy-regions kernel, the MoE cache's miss copies, cpy
COPY_KERNELS = ("copy_regions", "moe_cache_copy")
# the MoE cache's copy kernel as the prediction launches it, on its own stream: a grid of at most this many blocks
# (MOE_CACHE_PREFETCH_BLOCKS), where a lookup's own misses take a block per 64 KiB of each missing expert (42 an
# expert on the 30b-a3b's shapes). In a captured graph the streams are the graph's, so the grid tells them apart
PREFETCH_COPY = "moe_cache_copy"
PREFETCH_BLOCKS = 16

Interval = tuple[float, float]


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint intervals covering the same time."""
    out: list[Interval] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def length(intervals: Iterable[Interval]) -> float:
    return sum(end - start for start, end in intervals)


def intersection(a: list[Interval], b: list[Interval]) -> float:
    """Time covered by both (each a union, sorted and disjoint)."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


@dataclass
class TraceSummary:
    """Milliseconds unless named otherwise; busy times are unions over streams (time the device had any of it)."""

    wall_ms: float = 0.0
    compute_ms: float = 0.0  # kernels that compute
    h2d_ms: float = 0.0
    d2d_ms: float = 0.0  # device-to-device memcpys and the copy kernels
    h2d_under_compute_ms: float = 0.0  # host-to-device copying that overlapped compute
    # the copy kernels alone: the MoE cache's copies from mapped host memory (the device lookup's misses on the
    # compute stream, the prediction's on a stream of its own), which are kernels, not memcpys
    copy_kernel_ms: float = 0.0
    copy_under_compute_ms: float = 0.0
    # the step's time split: the prediction's copies (PREFETCH_BLOCKS) and what of them ran with no other kernel (a
    # lookup waiting for them), the other copy kernels (a lookup's own misses, which its layer waits for), compute
    # with no copy beside it, and nothing at all
    prefetch_copy_ms: float = 0.0
    prefetch_alone_ms: float = 0.0
    demand_copy_ms: float = 0.0
    compute_alone_ms: float = 0.0
    idle_ms: float = 0.0
    h2d_mib: float = 0.0
    d2d_mib: float = 0.0
    n_kernels: int = 0
    n_memcpy: int = 0
    streams: dict[str, float] = field(default_factory=dict)  # stream -> busy ms
    top_kernels: list[tuple[str, int, float]] = field(default_factory=list)  # name, count, total ms

    def line(self) -> str:
        gbps = self.h2d_mib * 1.048576 / self.h2d_ms if self.h2d_ms else 0.0
        hidden = 100.0 * self.h2d_under_compute_ms / self.h2d_ms if self.h2d_ms else 0.0
        top = "; ".join(f"{name[:48]} x{n} {ms:.1f}" for name, n, ms in self.top_kernels[:4])
        copy_hidden = 100.0 * self.copy_under_compute_ms / self.copy_kernel_ms if self.copy_kernel_ms else 0.0
        return (f"wall {self.wall_ms:.1f} ms: compute {self.compute_ms:.1f}, H2D {self.h2d_ms:.1f} "
                f"({self.h2d_mib:.0f} MiB, {gbps:.1f} GB/s, {hidden:.0f}% under compute), copy kernels "
                f"{self.copy_kernel_ms:.1f} ({copy_hidden:.0f}% under compute), D2D {self.d2d_ms:.1f} "
                f"({self.d2d_mib:.0f} MiB); prediction's copies {self.prefetch_copy_ms:.1f} "
                f"({self.prefetch_alone_ms:.1f} alone), other copy kernels {self.demand_copy_ms:.1f}, compute alone "
                f"{self.compute_alone_ms:.1f}, idle {self.idle_ms:.1f}; {self.n_kernels} kernels, {self.n_memcpy} "
                f"memcpys; streams busy "
                + ", ".join(f"{k} {v:.1f}" for k, v in self.streams.items()) + f"; top: {top}")


def _kind(event: Mapping[str, Any]) -> str | None:
    cat, name = event.get("cat", ""), event.get("name", "")
    if cat == "kernel":
        if PREFETCH_COPY in name:
            grid = event.get("args", {}).get("grid") or [0]
            return "prefetch" if 0 < int(grid[0]) <= PREFETCH_BLOCKS else "copy"
        return "copy" if any(k in name for k in COPY_KERNELS) else "compute"
    if cat == "gpu_memcpy":
        if "HtoD" in name:
            return "h2d"
        if "DtoD" in name or "PtoP" in name:
            return "d2d"
        return "other"
    return None


def summarize(events: Iterable[Mapping[str, Any]]) -> TraceSummary:
    """A summary of the GPU events of a Chrome trace (``ts`` and ``dur`` in microseconds)."""
    spans: dict[str, list[Interval]] = {"compute": [], "copy": [], "prefetch": [], "h2d": [], "d2d": [], "other": []}
    per_stream: dict[str, list[Interval]] = {}
    kernels: dict[str, list[float]] = {}
    s = TraceSummary()
    for e in events:
        kind = _kind(e)
        if kind is None or "ts" not in e or "dur" not in e:
            continue
        start, dur = float(e["ts"]), float(e["dur"])
        spans[kind].append((start, start + dur))
        args = e.get("args", {})
        per_stream.setdefault(str(args.get("stream", "?")), []).append((start, start + dur))
        if e["cat"] == "kernel":
            s.n_kernels += 1
            k = kernels.setdefault(str(e["name"]), [0, 0.0])
            k[0] += 1
            k[1] += dur
        else:
            s.n_memcpy += 1
            mib = float(args.get("bytes", 0)) / (1 << 20)
            if kind == "h2d":
                s.h2d_mib += mib
            elif kind == "d2d":
                s.d2d_mib += mib
    everything = union(iv for ivs in spans.values() for iv in ivs)
    if not everything:
        return s
    compute, h2d = union(spans["compute"]), union(spans["h2d"])
    s.wall_ms = (everything[-1][1] - everything[0][0]) / 1e3
    s.compute_ms = length(compute) / 1e3
    s.h2d_ms = length(h2d) / 1e3
    s.d2d_ms = length(union(spans["d2d"] + spans["copy"] + spans["prefetch"])) / 1e3
    s.h2d_under_compute_ms = intersection(h2d, compute) / 1e3
    copies = union(spans["copy"] + spans["prefetch"])
    s.copy_kernel_ms = length(copies) / 1e3
    s.copy_under_compute_ms = intersection(copies, compute) / 1e3
    prefetch, demand = union(spans["prefetch"]), union(spans["copy"])
    s.prefetch_copy_ms = length(prefetch) / 1e3
    s.prefetch_alone_ms = (length(prefetch) - intersection(prefetch, union(spans["compute"] + spans["copy"]))) / 1e3
    s.demand_copy_ms = length(demand) / 1e3
    s.compute_alone_ms = (length(compute) - intersection(compute, copies)) / 1e3
    s.idle_ms = s.wall_ms - length(everything) / 1e3
    s.streams = {k: round(length(union(v)) / 1e3, 3) for k, v in sorted(per_stream.items())}
    s.top_kernels = sorted(((n, int(c), t / 1e3) for n, (c, t) in kernels.items()), key=lambda x: -x[2])[:10]
    return s


class Tracer:
    """``with Tracer() as t: ...`` then ``t.summary``: the GPU activity of the block. Needs PyTorch with CUDA.
    ``Tracer(False)`` records nothing (its ``as_dict()`` is empty), so a caller needs no second code path."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.summary = TraceSummary()
        if not enabled:
            return
        try:
            import torch
            from torch.profiler import ProfilerActivity, profile
        except ImportError as e:
            raise RuntimeError("tracing needs PyTorch (its profiler reads CUPTI): pip install torch") from e
        if not torch.cuda.is_available():
            raise RuntimeError("tracing needs a CUDA device visible to PyTorch")
        self._profile = profile(activities=[ProfilerActivity.CUDA])

    def __enter__(self) -> Tracer:
        if self.enabled:
            self._profile.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.enabled:
            return
        self._profile.__exit__(*exc)
        fd, path = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        try:
            self._profile.export_chrome_trace(path)
            with open(path) as f:
                self.summary = summarize(json.load(f).get("traceEvents", []))
        finally:
            os.unlink(path)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self.summary) if self.enabled else {}
