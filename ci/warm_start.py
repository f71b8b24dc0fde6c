"""The warm start's figures (#46): the same 32 and 128 tokens of text decoded, one token a step, from a cold cache, from
a cache warmed by the text before them in the same run, and from a fresh load that restored the state file the warm
run wrote at its close (``Llama(moe_cache_state=FILE)``); per cache size, the device lookups' hit rates, the experts
restored, the time the restore added to the load, and whether the restored run's logits are the cold run's byte for
byte. ``ci/gpu.sh warm-start`` runs it.

    python ci/warm_start.py MODEL.gguf [--fractions 0.25,0.5] [--warm-tokens 512] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from pyllama_moe.gguf_info import GGUFInfo
from pyllama_moe.llama import Llama
from pyllama_moe.tools.text import prose_text, stdlib_text

CHECKPOINTS = (32, 128)


def decode(llm: Llama, tokens: list[int]) -> tuple[dict[int, float], np.ndarray]:
    """Teacher-forced decode of ``tokens`` one a step: the device lookups' hit rate over the first 32 and 128, and
    the logits of every step."""
    before = llm.moe_cache_stats()
    rates: dict[int, float] = {}
    logits = []
    for i, t in enumerate(tokens, 1):
        llm.eval([t])
        logits.append(np.array(llm.scores[llm.n_tokens - 1]))
        if i in CHECKPOINTS:
            now = llm.moe_cache_stats()
            assert before is not None and now is not None
            hits, misses = (now - before).hits("small", "large", "device")
            rates[i] = hits / max(1, hits + misses)
    return rates, np.stack(logits)


def load(model: str, mib: int, state: Path | None) -> tuple[Llama, float]:
    t0 = time.perf_counter()
    llm = Llama(model, n_ctx=4096, n_batch=512, n_gpu_layers=-1, cpu_moe=True, moe_cache_mib=mib,
                moe_cache_state=state, logits_all=True, verbose=False)
    return llm, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--fractions", default="0.25,0.5")
    ap.add_argument("--warm-tokens", type=int, default=512)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    info = GGUFInfo.read(args.model)
    with Llama(args.model, vocab_only=True, verbose=False) as tok:
        before = tok.tokenize(stdlib_text().encode(), add_bos=True)[: args.warm_tokens]
        after = tok.tokenize(prose_text().encode(), add_bos=False)[: max(CHECKPOINTS)]
    rows: list[dict[str, object]] = []
    ok = True
    for frac in (float(f) for f in args.fractions.split(",")):
        mib = int(info.expert_bytes * frac) >> 20
        state = Path(tempfile.mkdtemp()) / "state.json"
        llm, t_cold = load(args.model, mib, None)
        with llm:
            cold, cold_logits = decode(llm, after)
        llm, _ = load(args.model, mib, state)  # the last run: the text before, then the same tokens warm
        with llm:
            llm.eval(before)
            warm, _ = decode(llm, after)
        llm, t_restored = load(args.model, mib, state)  # the restart
        with llm:
            restored_n = llm.moe_cache_restored
            restore_s = llm.moe_cache_restore_s
            restored, restored_logits = decode(llm, after)
        row = {"fraction": frac, "cache_mib": mib, "cold": cold, "warm": warm, "restored": restored,
               "experts_restored": restored_n, "load_s_cold": round(t_cold, 2), "load_s_restored": round(t_restored, 2),
               "restore_s": round(restore_s, 3),
               "identical": bool(restored_logits.tobytes() == cold_logits.tobytes())}
        rows.append(row)
        ok = ok and bool(row["identical"]) and restored_n > 0
        print(f"cache {frac:.0%} ({mib} MiB): first 32 / 128 tokens hit "
              f"cold {cold[32]:.1%} / {cold[128]:.1%}, warm {warm[32]:.1%} / {warm[128]:.1%}, "
              f"restored {restored[32]:.1%} / {restored[128]:.1%} ({restored_n} experts); load "
              f"{t_cold:.1f} s cold, {t_restored:.1f} s restored, of which the restore {restore_s:.3f} s; "
              f"logits identical to cold: {row['identical']}",
              flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
