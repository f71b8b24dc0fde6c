"""``python -m pyllama_moe demo``: the README's main job on an embedded default.

Makes (once, cached under the user's cache folder) a small synthetic MoE model, loads it with the
experts in host memory (and, on a GPU machine, everything else on the GPU plus the MoE cache), runs
a short greedy generation and prints tokens/s, where the weights sit and the cache statistics (on the CPU:
that there is no cache).
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from pyllama_moe.tools.paths import cache_dir

if TYPE_CHECKING:
    from pyllama_moe import MoeCacheStats

SHOWN = ("model buffer size", "llama_moe_cache", "KV buffer size", "compute buffer size")


def demo_model() -> Path:
    """The demo's model: the synthetic writer's tiny qwen3moe preset with skewed routing, made once."""
    from pyllama_moe.tools import synth

    path = cache_dir() / "demo-tiny-qwen3moe.gguf"
    if not path.exists():
        tmp = path.with_suffix(".tmp")
        synth.write_model(tmp, "tiny", skew=1.0, seed=0)
        os.replace(tmp, path)
    return path


class _Collect(logging.Handler):
    """Keeps the log lines that say where buffers sit and what the cache did."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if any(s in msg for s in SHOWN):
            self.lines.append(msg.strip())


def main(args: argparse.Namespace) -> int:
    # llama.cpp's log goes to the collecting handler (and, with -v, to stderr through the root logger)
    log = logging.getLogger("pyllama_moe")
    collect = _Collect()
    log.addHandler(collect)
    level, propagate = log.level, log.propagate
    log.setLevel(logging.INFO)
    log.propagate = args.verbose
    if args.verbose:
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        return _run(args, collect)
    finally:
        log.removeHandler(collect)
        log.setLevel(level)
        log.propagate = propagate


def _run(args: argparse.Namespace, collect: _Collect) -> int:
    from pyllama_moe import Llama, backend

    path = demo_model()
    gpu = backend.gpu_available() and not args.cpu
    print(f"model: {path} ({path.stat().st_size / 2**20:.1f} MiB)")
    print(f"device: {'GPU' if gpu else 'CPU only'}")
    # --cpu-moe: the experts stay in host memory (pinned: load mode none); on a GPU everything
    # else goes there and the MoE cache keeps the hot experts on the device
    kwargs = {"n_gpu_layers": -1, "cpu_moe": True, "load_mode": "none", "moe_cache_mib": 16} if gpu else {}
    with Llama(str(path), n_ctx=512, seed=0, **kwargs) as llm:
        t0 = time.perf_counter()
        llm.eval(llm.tokenize(args.prompt.encode()))
        t1 = time.perf_counter()
        n_prompt = llm.n_tokens
        out = llm.create_completion(llm.tokenize(args.prompt.encode()), max_tokens=args.tokens, temperature=0)
        t2 = time.perf_counter()
        stats = llm.moe_cache_stats()
    n_gen = out["usage"]["completion_tokens"]
    print(f"prompt: {args.prompt!r} ({n_prompt} tokens, {n_prompt / (t1 - t0):.1f} tokens/s)")
    print(f"generated ({n_gen} tokens, {n_gen / (t2 - t1):.1f} tokens/s, random weights): "
          f"{out['choices'][0]['text']!r}")
    for line in collect.lines:
        print("  " + line)
    print(cache_summary(stats))
    return 0


def cache_summary(stats: MoeCacheStats | None) -> str:
    """One line on what the MoE cache did; on the CPU there is none: the experts are computed where they are."""
    if stats is None:
        return "moe cache: none (CPU only: the experts are computed in host memory, nothing is uploaded)"
    hits, misses = stats.hits("small", "large", "device")
    uploaded = (stats.bytes_small + stats.bytes_large + stats.bytes_device) / 2**20
    rate = 100 * hits / (hits + misses) if hits + misses else 0.0
    return f"moe cache: {hits:.0f} hits, {misses:.0f} misses ({rate:.1f}% hit), {uploaded:.1f} MiB uploaded"
