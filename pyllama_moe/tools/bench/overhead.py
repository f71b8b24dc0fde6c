"""``bench --overhead``: the Python overhead per generated token, ``create_completion`` against a bare decode loop
on the same context."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

TYPICAL = {"temperature": 0.8, "top_p": 0.95, "top_k": 40, "repeat_penalty": 1.1, "seed": 42}


def overhead(model: Path, n: int = 128, n_gpu_layers: int = 0, reps: int = 3) -> list[dict[str, Any]]:
    """``create_completion`` against a bare decode loop on the same context, in microseconds per token.

    The bare loop is what generation cannot do without: one ``llama_decode`` and one greedy
    ``llama_sampler_sample`` (argmax in C) per token, driven from Python through cffi. The prompt's
    own evaluation is timed apart and subtracted. Best of ``reps`` runs each.
    """
    from pyllama_moe import Llama
    from pyllama_moe.llama_cpp import ffi, lib

    prompt = "The quick brown fox"
    with Llama(str(model), n_ctx=n + 64, n_batch=64, n_ubatch=64, n_gpu_layers=n_gpu_layers, verbose=False) as llm:
        tokens = llm.tokenize(prompt.encode())
        ctx = llm.ctx
        greedy = lib.llama_sampler_init_greedy()
        arr, one = ffi.new("llama_token[]", tokens), ffi.new("llama_token[1]")

        def bare() -> tuple[float, float, int]:
            lib.llama_memory_clear(lib.llama_get_memory(ctx), True)
            t0 = time.perf_counter()
            if lib.llama_decode(ctx, lib.llama_batch_get_one(arr, len(tokens))) != 0:
                raise RuntimeError("llama_decode failed")
            lib.llama_synchronize(ctx)  # the prompt's compute belongs to the prompt, not to the first token
            t1 = time.perf_counter()
            for _ in range(n):
                one[0] = lib.llama_sampler_sample(greedy, ctx, -1)
                if lib.llama_decode(ctx, lib.llama_batch_get_one(one, 1)) != 0:
                    raise RuntimeError("llama_decode failed")
            return t1 - t0, time.perf_counter() - t1, n

        def api(**kw: Any) -> tuple[float, int]:
            lib.llama_memory_clear(lib.llama_get_memory(ctx), True)  # what the bare loop left there
            llm.reset()
            t0 = time.perf_counter()
            res = llm.create_completion(tokens, max_tokens=n, **kw)
            return time.perf_counter() - t0, res["usage"]["completion_tokens"]

        try:
            bare()  # warm-up
            runs = [bare() for _ in range(reps)]
            t_prompt = min(r[0] for r in runs)
            per_bare = min(r[1] for r in runs) / n
            rows = [{"path": "bare decode loop", "tokens": n, "us_per_token": per_bare * 1e6, "overhead_us": 0.0}]
            for name, kw in (("create_completion greedy", {"temperature": 0.0}),
                             ("create_completion typical", TYPICAL)):
                best = min((api(**kw) for _ in range(reps)), key=lambda r: r[0] / max(r[1], 1))
                per = (best[0] - t_prompt) / max(best[1], 1)
                rows.append({"path": name, "tokens": best[1], "us_per_token": per * 1e6,
                             "overhead_us": (per - per_bare) * 1e6})
            return rows
        finally:
            lib.llama_sampler_free(greedy)


def overhead_table(rows: list[dict[str, Any]]) -> str:
    out = ["| path | tokens | us/token | overhead us/token |", "|---|---|---|---|"]
    out += [f"| {r['path']} | {r['tokens']} | {r['us_per_token']:.0f} | {r['overhead_us']:.0f} |" for r in rows]
    return "\n".join(out)

