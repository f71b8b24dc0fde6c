"""The native tools of our build (``llama-bench``, ``llama-batched-bench``): finding them, running them on a setup
and reading what they print (their JSON lines and llama.cpp's log); the host-to-device copy bandwidth."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyllama_moe.tools.bench.matrix import Setup, cache_mib
from pyllama_moe.tools.bench.report import Row

if TYPE_CHECKING:
    from pyllama_moe.backend import Device

CACHE_LINE = re.compile(
    r"llama_moe_cache: (?P<kind>ubatch\s+[<>]=?\s*\d+|device lookups): hits = (?P<hits>\d+), misses = (?P<misses>\d+), "
    r"hit rate = (?P<rate>[\d.]+)%, uploaded = (?P<mib>[\d.]+) MiB")
PROMPT_COPY_LINE = re.compile(r"llama_moe_cache: prefetch of large batches: (?P<calls>[\d.]+) copy calls, "
                              r"(?P<regions>[\d.]+) regions, (?P<cache>[\d.]+) MiB from the cache, "
                              r"(?P<host>[\d.]+) MiB uploaded per ubatch")
# what the load and the context decided, logged by upstream's code (-lv 4): the buffers and the MoE cache's slots
BUFFER_LINE = re.compile(r"^\w+: +(?P<buf>\S+) +(?P<what>model|KV|compute|output) buffer size = +(?P<mib>[\d.]+) MiB",
                         re.M)
CACHE_SIZE_LINE = re.compile(r"^\w+: +(?P<buf>\S+) MoE cache size = +(?P<mib>[\d.]+) MiB", re.M)
SLOTS_LINE = re.compile(r"^\w+: +(?P<layers>\d+) layers, (?P<type>\w+): +(?P<slots>\d+) slots", re.M)


# ---------------------------------------------------------------- parsing tool output


def parse_jsonl(text: str) -> list[dict[str, Any]]:
    """The JSON objects printed one per line (other lines are the tools' logs)."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def parse_cache_stats(text: str) -> dict[str, dict[str, float]]:
    """upstream's ``llama_moe_cache: ubatch <= 8: hits = ..`` lines, by ubatch class."""
    stats = {}
    for m in CACHE_LINE.finditer(text):
        stats[" ".join(m.group("kind").split())] = {"hits": int(m.group("hits")), "misses": int(m.group("misses")),
                                  "hit_rate": float(m.group("rate")), "uploaded_mib": float(m.group("mib"))}
    for m in PROMPT_COPY_LINE.finditer(text):  # the prefetch of large ubatches through the cache, per ubatch
        stats["prompt copies"] = {k: float(v) for k, v in m.groupdict().items()}
    decisions = parse_decisions(text)
    if decisions:
        stats["decisions"] = decisions
    return stats


def parse_decisions(text: str) -> dict[str, float]:
    """The buffer sizes (MiB) and the MoE cache's slots that a run logged, by name (the last of each kind: a
    context reserves its compute buffers more than once)."""
    out: dict[str, float] = {}
    for m in BUFFER_LINE.finditer(text):
        out[f"{m.group('buf')} {m.group('what')} MiB"] = float(m.group("mib"))
    for m in CACHE_SIZE_LINE.finditer(text):
        out[f"{m.group('buf')} MoE cache MiB"] = float(m.group("mib"))
    for m in SLOTS_LINE.finditer(text):
        out[f"slots of {m.group('layers')} {m.group('type')} layers"] = float(m.group("slots"))
    return out


# ---------------------------------------------------------------- running the tools


def tool_path(name: str, tools: Path | None = None) -> Path:
    """A native tool of our build (the package's bin folder), or of the build folder ``tools``."""
    import pyllama_moe

    if tools is not None:
        for p in (tools / name, tools / "bin" / name):
            if p.is_file():
                return p
        raise FileNotFoundError(f"{name} is not in {tools} nor in {tools / 'bin'}")
    return pyllama_moe.bin_file(name)


Runner = Callable[[list[str], dict[str, str]], str]


def run_tool(cmd: list[str], env: dict[str, str]) -> str:
    res = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env})
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stderr[-3000:]}")
    return res.stdout + "\n" + res.stderr


def measure(model: Path, setup: Setup, switches: dict[str, str], pp: Sequence[int], ub: Sequence[int], tg: int,
            reps: int, run: Runner = run_tool, tools: Path | None = None, per_ubatch: bool = False) -> list[Row]:
    """The native tools on ``setup`` with ``switches`` in their environment; ``tools``: a build folder whose
    tools run instead of ours, with no switch set (upstream's own, unpatched: the rows of ``switches`` PRISTINE).
    A prompt's row carries its time to first token (``Row.ttft_s``): the prompt's time and one decoded token's,
    llama-batched-bench's decoded after the prompt, llama-bench's from an empty context (its tg test).
    ``per_ubatch``: llama-batched-bench runs once per ubatch size with every prompt at least that long (one model
    load each, the prompts in turn in one context; its log's cache figures are then those of the whole run), instead
    of once per prompt and ubatch."""
    rows: list[Row] = []
    if setup.python_only:  # our fit is Python's, and the tools have no option for the hybrid: no native run
        return rows
    env = switches if tools is None else {}
    if not setup.has_cache:
        cmd = [str(tool_path("llama-bench", tools)), "-m", str(model), *setup.args, *setup.bench_args, "-fa", "1",
               "-r", str(reps), "-o", "jsonl", "-p", ",".join(map(str, pp)), "-ub", ",".join(map(str, ub)),
               "-b", str(max([*ub, *pp])), "-n", str(tg)]
        for r in parse_jsonl(run(cmd, env)):
            if r["n_prompt"] and r["n_ubatch"] > r["n_prompt"]:
                continue  # a ubatch larger than the prompt measures nothing new
            if r["n_gen"] and r["n_ubatch"] != ub[0]:
                continue  # generation does not depend on the ubatch: llama-bench repeats it per ubatch
            rows.append(Row(setup.name, switches, "llama-bench", r["n_prompt"], r["n_ubatch"], r["n_gen"],
                            float(r["avg_ts"]), float(r["stddev_ts"])))
        decode_s = [1 / row.tokens_per_s for row in rows if row.n_gen and row.tokens_per_s > 0]
        for row in rows:
            if row.n_prompt and decode_s and row.tokens_per_s > 0:
                row.ttft_s = row.n_prompt / row.tokens_per_s + decode_s[0]
        return rows
    mib = cache_mib(model, setup)
    runs = ([([p for p in pp if p >= u], u) for u in ub] if per_ubatch
            else [([p], u) for p in pp for u in ub if u <= p])
    for prompts, u in ((ps, u) for ps, u in runs if ps):
        # -lv 4: llama's info lines, among them the cache statistics logged when the context is freed
        cmd = [str(tool_path("llama-batched-bench", tools)), "-m", str(model), *setup.args, *setup.batched_args,
               "--moe-cache-mib", str(mib), "-fa", "on", "-c", str(max(prompts) + tg + 16), "-b", str(max(prompts)),
               "-ub", str(u), "-npp", ",".join(map(str, prompts)), "-ntg", str(tg), "-npl", "1",
               "--output-format", "jsonl", "-lv", "4"]
        text = run(cmd, env)
        cache = parse_cache_stats(text)
        for r in parse_jsonl(text):
            token_s = float(r["t_tg"]) / r["tg"] if r["tg"] else 0.0  # a token decoded after the prompt
            rows.append(Row(setup.name, switches, "llama-batched-bench", r["pp"], u, 0, float(r["speed_pp"]),
                            cache=cache, ttft_s=float(r["t_pp"]) + token_s if token_s else 0.0))
            rows.append(Row(setup.name, switches, "llama-batched-bench", 0, u, r["tg"], float(r["speed_tg"]),
                            cache=cache))
    return rows


def h2d_bandwidth(n_bytes: int = 1 << 30, mapped: Path | None = None) -> dict[str, float]:
    """Host-to-device copy bandwidth (GB/s) to the first GPU, pinned and pageable, and from ``mapped`` (the
    model: its pages in the page cache, as the mmap setups upload them) mapped read-only ({} without a GPU)."""
    from pyllama_moe import backend

    gpus = backend.gpus()
    return h2d_bandwidth_to(gpus[0], n_bytes, mapped=mapped) if gpus else {}


def h2d_bandwidth_to(device: Device, n_bytes: int = 1 << 30, reps: int = 3,
                  mapped: str | os.PathLike[str] | None = None) -> dict[str, float]:
    """Host-to-device copy bandwidth to ``device`` in GB/s, from pinned (``pinned``; absent if the device has
    no pinned host buffer type) and pageable (``pageable``) memory, copied as llama.cpp uploads weights; with
    ``mapped`` (a file, e.g. the model), also from that file's first ``n_bytes`` mapped read-only (``mapped``:
    page-cache pages, as load mode mmap uploads them; absent where files cannot be mapped)."""
    from pyllama_moe import backend
    from pyllama_moe.errors import LlamaError, check_true, native_mark
    from pyllama_moe.llama_cpp import ffi, lib

    backend.init()
    pinned, pageable, from_file = ffi.new("double *"), ffi.new("double *"), ffi.new("double *")
    path = ffi.new("char[]", os.fsencode(mapped)) if mapped is not None else ffi.NULL
    mark = native_mark()
    rc = lib.pyllama_moe_h2d_bandwidth(device.index, n_bytes, reps, path, pinned, pageable, from_file)
    check_true(rc == 0, LlamaError, f"cannot measure the copy bandwidth to {device.name}", mark)
    out = {"pinned": pinned[0] / 1e9} if pinned[0] > 0 else {}
    out["pageable"] = pageable[0] / 1e9
    if from_file[0] > 0:
        out["mapped"] = from_file[0] / 1e9
    return out


