"""The parallel slots' host time per step, llama_decode excluded (issue #43), on the CPU tiny model.

The time between the end of a decode of N generating slots and the start of the next one (the step's sampling,
chunks, hand-offs and batch), median over the steady steps; and in server mode the CPU per step of each thread.

  .venv/bin/python ci/slots_overhead.py api N [greedy|sampled|logprobs]   # create_completions of N prompts
  .venv/bin/python ci/slots_overhead.py server N [greedy|sampled]         # --n_parallel N, N streaming clients
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from pyllama_moe import context as context_mod

DEC_CPU = [0.0]
REC: list[tuple[float, float, int, int]] = []  # start, end, n_tokens, n_outputs
_orig = context_mod.Context.decode


def decode(self, batch):  # type: ignore[no-untyped-def]
    n = batch.value.n_tokens
    outs = sum(1 for i in range(n) if batch.value.logits[i])
    t0 = time.perf_counter()
    c0 = time.thread_time()
    _orig(self, batch)
    DEC_CPU[0] += time.thread_time() - c0
    REC.append((t0, time.perf_counter(), n, outs))


context_mod.Context.decode = decode  # type: ignore[method-assign]

MODEL = Path(os.environ.get("TMPDIR", "/tmp")) / "pyllama_moe-slots-overhead-tiny.gguf"
if not MODEL.exists():
    from pyllama_moe.tools import synth

    synth.write_model(MODEL, "tiny", seed=5)

SAMPLING: dict[str, dict[str, Any]] = {
    "greedy": {"temperature": 0},
    "sampled": {"temperature": 0.8, "top_p": 0.95, "top_k": 40, "repeat_penalty": 1.1, "seed": 42},
    "logprobs": {"temperature": 0, "logprobs": 2},
}


def thread_cpu() -> dict[tuple[int, str], float]:
    tick = os.sysconf("SC_CLK_TCK")
    names = {t.native_id: t.name for t in threading.enumerate()}
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            f = open(f"/proc/self/task/{tid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        name = names.get(int(tid), "native")
        name = name.split("_")[0] if name.startswith("pyllama_moe-request") else name
        name = "uvicorn/loop" if name.startswith("Thread-") else name
        out[(int(tid), name)] = (int(f[11]) + int(f[12])) / tick
    return out


def report(n: int) -> None:
    # gaps between a decode of n generating tokens (n outputs, n tokens) and the next such decode
    gaps, decs = [], []
    for a, b in zip(REC[:-1], REC[1:], strict=True):
        if a[2] == n and a[3] == n and b[2] == n and b[3] == n:
            gaps.append(b[0] - a[1])
            decs.append(a[1] - a[0])
    if not gaps:
        print("no steady steps", REC[:5])
        return
    gaps = gaps[len(gaps) // 10:]  # skip warm-up
    print(f"slots={n} steady steps={len(gaps)} host ms/step: median {1e3 * statistics.median(gaps):.3f} "
          f"mean {1e3 * statistics.fmean(gaps):.3f}  decode ms/step median {1e3 * statistics.median(decs):.3f}")


def api(n: int, mode: str) -> None:
    from pyllama_moe import Llama

    with Llama(str(MODEL), n_ctx=512 * max(n, 1), n_batch=64, n_ubatch=64, n_seq_max=max(n, 1),
               verbose=False) as llm:
        prompts = [f"Request number {i}: the" for i in range(n)]
        llm.create_completions(prompts, max_tokens=8, **SAMPLING[mode])  # warm
        REC.clear()
        llm.create_completions(prompts, max_tokens=96, **SAMPLING[mode])
        report(n)


def server(n: int, mode: str) -> None:
    from pyllama_moe.server import ModelSettings, ServerSettings, create_app

    from fixtures.server import Running  # type: ignore[import-not-found]

    kw: dict[str, Any] = {"n_ctx": 512 * n, "n_batch": 64, "n_ubatch": 64, "verbose": False, "n_parallel": n,
                          "max_queue": 64}
    r = Running(create_app(ServerSettings(), [ModelSettings(model=str(MODEL), model_alias="tiny", **kw)]))
    try:
        temp = SAMPLING[mode].get("temperature", 0)
        cmd = [sys.executable, "-m", "pyllama_moe", "loadtest", r.url, "--clients", str(n), "--requests", "2",
               "--max-tokens", "96", "--temperature", str(temp)]
        REC.clear()
        cpu0 = thread_cpu()
        DEC_CPU[0] = 0.0
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        print(out.strip().splitlines()[-1])
        report(n)
        cpu1 = thread_cpu()
        steps = len(REC)
        by: dict[str, float] = {}
        for k, v in cpu1.items():
            name = k[1]
            by[name] = by.get(name, 0.0) + v - cpu0.get(k, 0.0)
        by["slots-thread minus decode"] = by.get("pyllama_moe-slots", 0.0) - DEC_CPU[0]
        print("CPU ms per step by thread:", {k: round(1e3 * v / steps, 3) for k, v in sorted(by.items())})
    finally:
        r.stop()


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    kind, n, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "greedy"
    (api if kind == "api" else server)(n, mode)
