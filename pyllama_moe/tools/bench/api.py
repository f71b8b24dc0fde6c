"""The Python API's runs: one setup under one switch setting in a child process (:mod:`.worker`, so that the
switches are its environment and each run loads the model afresh), its JSON result and log read into rows; the MoE
cache's counts between two ``moe_cache_stats()`` that a run reports."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from pyllama_moe.moe import MoeCacheStats
from pyllama_moe.tools.bench.matrix import Setup, cache_mib, fit_kwargs
from pyllama_moe.tools.bench.native import Runner, parse_cache_stats, parse_jsonl, run_tool
from pyllama_moe.tools.bench.report import Row, generate_label

PREFETCH_LINE = re.compile(r"host weight prefetch, depth (?P<depth>\d+), staging (?P<mib>[\d.]+) MiB, "
                           r"(?P<n>\d+) of (?P<of>\d+) splits")


def api_measure(model: Path, setup: Setup, switches: dict[str, str], n_prompt: int, n_ubatch: int, tg: int,
                run: Runner = run_tool, warm: int = 0, first: int = 0, trace: bool = False,
                warmup: int = -1, batch: int = 0, draft: Sequence[int] = (), draft_bounds: bool = False,
                warm_token: bool = False) -> list[Row]:
    """Prompt and generation speed through ``Llama``, in a child process (the switches are its environment);
    with ``warm``, that many tokens are generated first, so a MoE cache is warm for the timed prompt; with
    ``first``, that many greedy tokens continue the timed prompt (a row of their own: their speed, and the MoE
    cache's hit rate in those decode steps); with ``trace``, the GPU's activity in the timed prompt and those
    tokens (``gpu_trace.Tracer`` in the worker, started before the timing: the speeds include what recording costs
    while the work runs). ``warmup``: the tokens of the prompt evaluated once before it (at most a ubatch, -1: a whole
    one, as llama-bench warms up with the prompt; 0: none), to build graphs and load kernels outside the timing;
    ``warm_token``: one decoded token after them too (a decode step's graphs and kernels, where the first token after
    the prompt is timed: --ttft).
    ``batch``: the prompt is evaluated in batches of that many tokens, only the last one with an output, as
    llama-server does with its ``-b`` (0: one batch). ``draft``: ``tg`` greedy tokens are also generated after a
    prompt quoting source code to edit and after one of prose, without a draft and with prompt lookup proposing up to
    each of these sizes (:mod:`.draft`; a row each, labelled as :func:`.report.generate_label` says, whose
    ``cache["generate"]`` holds tokens per decode, acceptance and the MoE cache's misses); with ``draft_bounds``, also
    with the drafts whose proposals are all accepted and all rejected. The prompt's row carries its time to first
    token (``Row.ttft_s``): the prompt's time and one decoded token's (the mean of ``first``'s, else of the decode
    from an empty context)."""
    kwargs = {**dict(setup.llama_kwargs), "moe_cache_mib": cache_mib(model, setup)}
    if setup.fit_gib:
        kwargs.update(fit_kwargs(setup))
    spec = {"model": str(model), "n_prompt": n_prompt, "n_ubatch": n_ubatch, "tg": tg, "warm": warm, "first": first,
            "trace": trace, "warmup": warmup, "warm_token": warm_token, "batch": batch, "draft": list(draft),
            "draft_bounds": draft_bounds, "kwargs": kwargs}
    out = run([sys.executable, "-m", "pyllama_moe.tools.bench.worker", json.dumps(spec)], switches)
    res = parse_jsonl(out)[-1]
    stats = parse_cache_stats(out)
    if "placement" in res:
        stats["placement"] = res["placement"]
    if "prompt_copies" in res:  # those of the timed prompt, not the mean over the run that the log gives
        stats["prompt copies"] = res["prompt_copies"]
    if "prompt_seeds" in res:
        stats["prompt seeds"] = res["prompt_seeds"]
    prefetch = [m.groupdict() for m in PREFETCH_LINE.finditer(out)]
    if prefetch:  # the scheduler's staging, as logged when its graph was reserved (the largest)
        best = max(prefetch, key=lambda d: float(d["mib"]))
        stats["prefetch"] = {"depth": int(best["depth"]), "staging_mib": float(best["mib"]),
                             "splits": int(best["n"]), "of": int(best["of"])}
    # a fit setup is fitted again under each switch setting, whose memory differs: its placement, hence its
    # results, may differ too, so its hashes are not compared
    same = not setup.fit_gib
    # the time to first token: the prompt's and a decoded token's, one of those continuing it (--first) or else one
    # from an empty context
    token_ts = res["first"]["ts"] if "first" in res else res["tg_ts"]
    ttft = n_prompt / res["pp_ts"] + 1 / token_ts if token_ts > 0 else 0.0
    rows = [Row(setup.name, switches, "python", n_prompt, n_ubatch, 0, res["pp_ts"], cache=stats,
                digest=res["pp_digest"] if same else "", trace=res.get("pp_trace", {}), ttft_s=ttft),
            Row(setup.name, switches, "python", 0, n_ubatch, res["n_gen"], res["tg_ts"],
                cache={**stats, "tg": res["tg"]} if res.get("tg") else stats, digest=res["tg_digest"] if same else "")]
    for g in res.get("generate", []):  # --draft: generation after each prompt, without and with each draft size
        rows.append(Row(setup.name, switches, "python", g["n_prompt"], n_ubatch, g["n"], g["ts"],
                        label=generate_label(g["n"], g["prompt"], g["draft"], g["drafted_by"]),
                        cache={"generate": {k: v for k, v in g.items()
                                            if k not in ("prompt", "drafted_by", "digest", "n", "n_prompt", "ts")}},
                        digest=g["digest"] if same else ""))
    if "first" in res:
        f = res["first"]
        rows.append(Row(setup.name, switches, "python", n_prompt, n_ubatch, f["n"], f["ts"],
                        cache={"first": {k: v for k, v in f.items() if k not in ("digest", "trace")}},
                        digest=f["digest"] if same else "", trace=f.get("trace", {})))
    return rows


Stats = MoeCacheStats | None  # what Llama.moe_cache_stats() returns


def _delta(before: Stats, after: Stats) -> MoeCacheStats | None:
    """The counts between two ``moe_cache_stats()``, None without a cache."""
    if before is None or after is None:
        return None
    return after - before


def decode_hits(before: Stats, after: Stats, tokens: int = 0) -> dict[str, float]:
    """The MoE cache's hits, misses and hit rate between two ``moe_cache_stats()`` in decode steps (looked up on the
    device, or on the host for ubatches of <= 8); empty without a cache. With ``tokens`` (those decoded between the
    two), the hybrid decode's figures too: its split (``host_max``, 0 where it is off, and the rates it follows:
    ``host_expert_us``, ``upload_expert_us``, ``handoff_us``), the experts the CPU computed (``host_experts``), its
    busy time (``host_busy_us``) and the experts uploaded (misses and the prediction's copies), and per token
    (``MoeCacheStats.per_token``): ``host_per_token``, ``host_ms_per_token``, ``uploaded_per_token`` and
    ``pcie_ms_per_token``, an estimate (the uploads times ``upload_expert_us``, not a measured busy time)."""
    d = _delta(before, after)
    if d is None:
        return {}
    hits, misses = d.hits("device", "small")
    res = {"hits": hits, "misses": misses, "hit_rate": 100.0 * hits / max(hits + misses, 1)}
    if tokens > 0:
        res.update(host_max=d.host_max, host_expert_us=d.host_expert_us, upload_expert_us=d.upload_expert_us,
                   handoff_us=d.handoff_us, host_experts=d.n_host, host_busy_us=d.host_busy_us, uploaded=d.uploaded())
        res.update({f"{k}_per_token": v for k, v in d.per_token(tokens).items()})
    if d.n_predicted:  # LLAMA_MOE_CACHE_PREDICT=N: the misses its prefetches turned into hits, the bytes for nothing
        expert_mib = d.bytes_predicted / d.n_predicted / 2**20
        res.update(predicted=d.n_predicted, predicted_used=d.n_predicted_used,
                   hidden=100.0 * d.n_predicted_used / max(d.n_predicted_used + misses, 1),
                   wasted_mib=d.n_predicted_wasted * expert_mib)
    return res


def prompt_copies(before: Stats, after: Stats) -> dict[str, float] | None:
    """What the prefetch through the MoE cache copied for the large ubatches between two ``moe_cache_stats()``, per
    ubatch: batched copy calls, regions, MiB copied from the cache (device to device) and MiB uploaded (PCIe); None
    without a cache, a large ubatch or a copy through the cache."""
    d = _delta(before, after)
    if d is None or d.n_ubatch_large <= 0 or d.n_prefetch_calls == 0:
        return None
    n = d.n_ubatch_large
    return {"ubatches": n, "calls": d.n_prefetch_calls / n, "regions": d.n_prefetch_regions / n,
            "cache": d.bytes_prefetch_cache / n / 2**20, "host": d.bytes_prefetch_host / n / 2**20}


def prompt_seeds(before: Stats, after: Stats) -> dict[str, float] | None:
    """The seeds of the MoE cache between two ``moe_cache_stats()``: seeding ubatches and the experts admitted;
    None without a cache or a seed."""
    d = _delta(before, after)
    if d is None or d.n_seed_ubatch == 0:
        return None
    return {"ubatches": d.n_seed_ubatch, "experts": d.n_seeded}
