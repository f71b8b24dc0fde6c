"""Hybrid decode (#41) on one model and cache size: the same tokens decoded teacher-forced, one token a step, with the
hybrid off, on and auto; per run the decode speed, the device lookups' hit rate, the experts the CPU computed per token,
the CPU's busy time per token, the rates the share followed from, and against the run with the hybrid off: the top-1
agreement, the largest logit difference and the median over positions of each position's largest difference (a router's
pick flipped at a near tie moves a few positions far; a wrong part moves every one). Two reference rows without the
cache give the size of an honest difference: ``gpu`` (every expert on the GPU: the cache alone should equal it) and
``cpu_moe`` (the CPU computes every expert, upstream's path: the rounding gap between the CPU's kernels and the GPU's,
which the hybrid's CPU part has too). ``ci/gpu_session.steps`` runs it.

    python ci/hybrid_check.py MODEL.gguf [--fraction 0.25] [--tokens 128] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from pyllama_moe.gguf_info import GGUFInfo
from pyllama_moe.llama import Llama
from pyllama_moe.tools.text import prose_text

RATES = ("host_expert_us", "upload_expert_us", "handoff_us", "host_max")  # the split, chosen at creation

# name, environment, whether the cache is on, whether the experts live in host memory (cpu_moe)
Run = tuple[str, dict[str, str], bool, bool]
RUNS: tuple[Run, ...] = (
    ("off", {"LLAMA_MOE_HYBRID": "0"}, True, True),
    ("on", {"LLAMA_MOE_HYBRID": "1"}, True, True),
    ("auto", {"LLAMA_MOE_HYBRID": "2"}, True, True),
)
REFERENCES: tuple[Run, ...] = (("gpu", {}, False, False), ("cpu_moe", {}, False, True))


def run(model: str, mib: int, tokens: list[int], env: dict[str, str], threads: int, cpu_moe: bool) -> dict[str, object]:
    os.environ.pop("LLAMA_MOE_HYBRID", None)
    os.environ.update(env)
    with Llama(model, n_ctx=2048, n_batch=512, n_gpu_layers=-1, cpu_moe=cpu_moe, moe_cache_mib=mib, logits_all=True,
               n_threads=threads, verbose=False) as llm:
        warm = tokens[:16]  # the cache filled and the graphs captured before the timed part
        for t in warm:
            llm.eval([t])
        before = llm.moe_cache_stats()
        logits = []
        t0 = time.perf_counter()
        for t in tokens[16:]:
            llm.eval([t])
            logits.append(np.array(llm.scores[llm.n_tokens - 1]))
        dt = time.perf_counter() - t0
        after = llm.moe_cache_stats()
        n = len(tokens) - 16
        if not mib:  # a reference without the cache
            return {"tps": n / dt, "hit_rate": 0.0, "misses_per_token": 0.0, "host_per_token": 0.0,
                    "host_busy_ms_per_token": 0.0, "rates": {}, "logits": np.stack(logits)}
        assert before is not None and after is not None  # a MoE cache: moe_cache_mib > 0
        d = after - before  # the counts between the readings, the split as chosen
        hits, misses = d.hits("small", "large", "device")
        per_token = d.per_token(n)
        return {"tps": n / dt, "hit_rate": hits / max(1, hits + misses), "misses_per_token": misses / n,
                "host_per_token": per_token["host"], "host_busy_ms_per_token": per_token["host_ms"],
                "rates": {k: getattr(d, k) for k in RATES}, "logits": np.stack(logits)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--fraction", type=float, default=0.25)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    ap.add_argument("--json")
    ap.add_argument("--references", action="store_true",
                    help="also the runs without the cache: all on the GPU, and cpu_moe (the CPU computes every expert)")
    args = ap.parse_args(argv)
    info = GGUFInfo.read(args.model)
    mib = int(info.expert_bytes * args.fraction) >> 20
    with Llama(args.model, vocab_only=True, verbose=False) as tok:
        tokens = tok.tokenize(prose_text().encode(), add_bos=True)[: args.tokens + 16]
    rows = {}
    for name, env, cached, cpu_moe in RUNS + (REFERENCES if args.references else ()):
        rows[name] = run(args.model, mib if cached else 0, tokens, env, args.threads, cpu_moe)
    ref = rows["off"]["logits"]
    assert isinstance(ref, np.ndarray)
    out = []
    for name, r in rows.items():
        lg = r.pop("logits")
        assert isinstance(lg, np.ndarray)
        r["top1_agreement"] = float(np.mean(lg.argmax(axis=1) == ref.argmax(axis=1)))
        r["max_abs_logit_diff"] = float(np.abs(lg - ref).max())
        # each position's largest difference in its spread, the median over positions
        r["median_position_diff"] = float(np.median(np.abs(lg - ref).max(axis=1) / ref.std(axis=1)))
        r["logit_scale"] = float(np.abs(ref).max())
        r["identical"] = bool(lg.tobytes() == ref.tobytes())
        out.append({"run": name, **r})
        print(f"{args.fraction:.0%} cache ({mib} MiB) {name:9s}: {r['tps']:7.1f} t/s, hits {r['hit_rate']:.1%}, "
              f"misses/token {r['misses_per_token']:.1f}, CPU experts/token {r['host_per_token']:.1f}, CPU busy "
              f"{r['host_busy_ms_per_token']:.2f} ms/token, rates {r['rates']}, top-1 {r['top1_agreement']:.3f}, "
              f"max |dlogit| {r['max_abs_logit_diff']:.3g} (scale {r['logit_scale']:.3g}), median position "
              f"{r['median_position_diff']:.3g} of the spread", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
