"""``python -m pyllama_moe bench``: prompt and generation speed, setup by setup, side by side.

Runs a matrix of placements (all on the GPU, experts in host memory with mmap or pinned memory,
the MoE cache at fractions of the expert bytes; with ``--dense``, a dense model all on the GPU and
half in host memory), each with every kill switch given by ``--switch`` both unset (our behaviour)
and set to 0, and with ``--upstream`` all of them at 0 (upstream's behaviour), through the native tools of our patched
build (``llama-bench`` for prompt/generation, ``llama-batched-bench`` where the MoE cache is on, as
``llama-bench`` has no cache option) and through the Python API (``Llama.eval`` for the longest
prompt at the largest ubatch, greedy ``create_completion`` for generation), so the Python overhead
is visible. Prints one markdown table and writes the rows as JSON, with the cache's own statistics
and the host-to-device copy bandwidth measured in the same run.

The Python runs also hash the logits of the prompt's last token and the greedy tokens: a kill
switch must not change them, so every setup's hashes are compared across its switch settings and
a mismatch is printed loudly (and makes the exit status 1).

The table is the measurement: nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from pyllama_moe.gpu_trace import Tracer, TraceSummary

EXPERT_TENSOR = re.compile(r"\.ffn_(up|down|gate)(_up)?_(ch|)exps\.weight$")
CACHE_LINE = re.compile(
    r"llama_moe_cache: (?P<kind>ubatch\s+[<>]=?\s*\d+|device lookups): hits = (?P<hits>\d+), misses = (?P<misses>\d+), "
    r"hit rate = (?P<rate>[\d.]+)%, uploaded = (?P<mib>[\d.]+) MiB")
PROMPT_COPY_LINE = re.compile(r"llama_moe_cache: prefetch of large batches: (?P<calls>[\d.]+) copy calls, (?P<regions>[\d.]+) regions, "
                              r"(?P<cache>[\d.]+) MiB from the cache, (?P<host>[\d.]+) MiB uploaded per ubatch")
# what the load and the context decided, logged by upstream's code (-lv 4): the buffers and the MoE cache's slots
BUFFER_LINE = re.compile(r"^\w+: +(?P<buf>\S+) +(?P<what>model|KV|compute|output) buffer size = +(?P<mib>[\d.]+) MiB", re.M)
CACHE_SIZE_LINE = re.compile(r"^\w+: +(?P<buf>\S+) MoE cache size = +(?P<mib>[\d.]+) MiB", re.M)
SLOTS_LINE = re.compile(r"^\w+: +(?P<layers>\d+) layers, (?P<type>\w+): +(?P<slots>\d+) slots", re.M)
PREFETCH_LINE = re.compile(r"host weight prefetch, depth (?P<depth>\d+), staging (?P<mib>[\d.]+) MiB, "
                           r"(?P<n>\d+) of (?P<of>\d+) splits")


@dataclasses.dataclass(frozen=True)
class Setup:
    """One placement: how the tools are told about it."""

    name: str
    args: tuple[str, ...]          # common to both tools
    bench_args: tuple[str, ...]    # llama-bench only
    batched_args: tuple[str, ...]  # llama-batched-bench only
    cache_fraction: float = 0.0    # of the expert bytes; > 0 runs llama-batched-bench
    cache_mib_fixed: int = 0       # or a size in MiB (the cache-<N>mib setups)
    needs_gpu: bool = True
    llama_kwargs: tuple[tuple[str, Any], ...] = ()  # the same placement as Llama keyword arguments
    dense: bool = False            # runs on the --dense model; "{half}" and "{upper}" in the arguments are
                                   # half its layers and a pattern of the FFN weights of its upper half
    fit_gib: int = 0               # fit-<G>gib[-cache]: Python only, fit=True with a device target that leaves G GiB,
    cache_auto: bool = False       # without the cache or with moe_cache_mib="auto" (the fit chooses layers or cache)

    @property
    def has_cache(self) -> bool:
        return self.cache_fraction > 0 or self.cache_mib_fixed > 0

    def resolve(self, n_layer: int) -> Setup:
        """The setup with its placeholders filled in for a model of ``n_layer`` layers."""
        half = n_layer // 2
        upper = r"blk\.(" + "|".join(map(str, range(half, n_layer))) + r")\.ffn_(up|down|gate)\.weight"

        def fill(v: Any) -> Any:  # a keyword argument that is only "{half}" is the number
            return half if v == "{half}" else v.format(half=half, upper=upper) if isinstance(v, str) else v

        return dataclasses.replace(self, args=tuple(a.format(half=half, upper=upper) for a in self.args),
                                   llama_kwargs=tuple((k, fill(v)) for k, v in self.llama_kwargs))


_HOST = (("n_gpu_layers", -1), ("cpu_moe", True))
SETUPS: dict[str, Setup] = {
    "gpu": Setup("gpu", ("-ngl", "99"), (), (), llama_kwargs=(("n_gpu_layers", -1),)),
    "cpu_moe-mmap": Setup("cpu_moe-mmap", ("-ngl", "99", "-lm", "mmap"), ("-ncmoe", "99"), ("--cpu-moe",),
                          needs_gpu=False, llama_kwargs=(*_HOST, ("load_mode", "mmap"))),
    "cpu_moe-none": Setup("cpu_moe-none", ("-ngl", "99", "-lm", "none"), ("-ncmoe", "99"), ("--cpu-moe",),
                          needs_gpu=False, llama_kwargs=(*_HOST, ("load_mode", "none"))),
    "cache-25": Setup("cache-25", ("-ngl", "99", "-lm", "none"), (), ("--cpu-moe",), cache_fraction=0.25,
                      llama_kwargs=(*_HOST, ("load_mode", "none"))),
    "cache-50": Setup("cache-50", ("-ngl", "99", "-lm", "none"), (), ("--cpu-moe",), cache_fraction=0.50,
                      llama_kwargs=(*_HOST, ("load_mode", "none"))),
    "cache-80": Setup("cache-80", ("-ngl", "99", "-lm", "none"), (), ("--cpu-moe",), cache_fraction=0.80,
                      llama_kwargs=(*_HOST, ("load_mode", "none"))),
    # a dense model (--dense) with half of it in pinned host memory: its upper layers (-ngl, their KV cache
    # and attention on the CPU too), or only their FFN weights (-ot, everything else on the GPU)
    "dense-gpu": Setup("dense-gpu", ("-ngl", "99"), (), (), dense=True, llama_kwargs=(("n_gpu_layers", -1),)),
    "dense-ngl-half": Setup("dense-ngl-half", ("-ngl", "{half}", "-lm", "none"), (), (), needs_gpu=False, dense=True,
                            llama_kwargs=(("n_gpu_layers", "{half}"), ("load_mode", "none"))),
    "dense-ffn-half": Setup("dense-ffn-half", ("-ngl", "99", "-lm", "none", "-ot", "{upper}=CPU"), (), (),
                            needs_gpu=False, dense=True,
                            llama_kwargs=(("n_gpu_layers", -1), ("load_mode", "none"), ("override_tensor", "{upper}=CPU"))),
}
DENSE_SETUPS = tuple(n for n, s in SETUPS.items() if s.dense)
CACHE_MIB_SETUP = re.compile(r"cache-(\d+)mib")
MMAP_SUFFIX = "-mmap"


FIT_SETUP = re.compile(r"fit-(\d+)gib(-cache)?")


def setup_named(name: str) -> Setup | None:
    """A setup of SETUPS, ``cache-<N>mib`` (the cache setups with a cache of N MiB), ``fit-<G>gib`` and
    ``fit-<G>gib-cache`` (``fit=True`` with G GiB of the first GPU, without the cache and with ``"auto"``), or a
    cache setup with ``-mmap`` appended: its experts loaded with mmap (llama.cpp's default load) instead of in
    pinned memory, where a host lookup uploads its misses from page-cache pages."""
    if name in SETUPS:  # cpu_moe-mmap is a setup of its own
        return SETUPS[name]
    if name.endswith(MMAP_SUFFIX):
        base = setup_named(name[:-len(MMAP_SUFFIX)])
        if base is None or not base.has_cache:
            return None
        args = list(base.args)
        args[args.index("-lm") + 1] = "mmap"  # the load mode's value, not any other "none"
        return dataclasses.replace(base, name=name, args=tuple(args),
                                   llama_kwargs=tuple((k, "mmap" if k == "load_mode" else v)
                                                      for k, v in base.llama_kwargs))
    m = CACHE_MIB_SETUP.fullmatch(name)
    if m and int(m.group(1)) > 0:
        return dataclasses.replace(SETUPS["cache-25"], name=name, cache_fraction=0.0, cache_mib_fixed=int(m.group(1)))
    m = FIT_SETUP.fullmatch(name)
    if m and int(m.group(1)) > 0:
        return Setup(name, (), (), (), fit_gib=int(m.group(1)), cache_auto=bool(m.group(2)))
    return None

# every kill switch of the patch series: all of them at 0 is upstream's behaviour (--upstream)
KILL_SWITCHES = ("GGML_SCHED_ASYNC_INPUTS", "GGML_SCHED_PREFETCH", "LLAMA_MOE_CACHE_DEVICE", "LLAMA_MOE_CACHE_PREFETCH",
                 "LLAMA_MOE_CACHE_SEED")
UPSTREAM = "upstream"
# the switch setting of the rows of --pristine: upstream's own tools, run with no switch set
PRISTINE = {"(pristine build)": "1"}
# --dense with --preset 30b-a3b: about 8 GiB at q4_0, a Qwen3-8B-like shape
DENSE_SHAPE: dict[str, Any] = {"n_layer": 36, "n_embd": 4096, "n_head": 32, "n_head_kv": 8, "n_ff": 12288}


def write_model(path: Path, preset: str, dense: bool = False, progress: bool = False,
                routing: str = "realistic") -> None:
    """The bench's model of ``preset`` (with ``dense``: the preset as a dense qwen3, of DENSE_SHAPE for 30b-a3b), its
    routing regime ``routing`` (see ``synth``)."""
    from pyllama_moe import synth

    if dense:
        synth.write_model(path, preset, arch="qwen3", progress=progress, **(DENSE_SHAPE if preset == "30b-a3b" else {}))
    else:
        synth.write_model(path, preset, progress=progress, routing=routing)


def routing_regime(model: Path) -> str:
    """The routing regime a synthetic model was written with (``pyllama_moe.synth.routing``; files from before
    the key: ``collapsed`` with positive scales, else ``uniform`` or ``skew``), ``-`` for other models."""
    from pyllama_moe import moe, synth
    from pyllama_moe.ffi import ffi, lib

    def get(key: str) -> str | None:
        k = lib.gguf_find_key(ctx, key.encode())
        return None if k < 0 else ffi.string(lib.gguf_get_val_str(ctx, k)).decode()

    with moe.gguf_header(str(model).encode()) as ctx:
        routing, signs = get(synth.META_PREFIX + "routing"), get(synth.META_PREFIX + "scale_signs")
        if routing is None and signs is None:
            return "-"  # not a synthetic model
        k = lib.gguf_find_key(ctx, (synth.META_PREFIX + "skew").encode())
        skew = lib.gguf_get_val_f32(ctx, k) if k >= 0 else 0.0
    return synth.regime_of(routing or "", skew, signs or "")


@dataclasses.dataclass
class Row:
    setup: str
    switches: dict[str, str]
    tool: str
    n_prompt: int
    n_ubatch: int
    n_gen: int
    tokens_per_s: float
    stddev: float = 0.0
    cache: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    digest: str = ""  # Python runs: hash of the prompt's last logits (pp) or of the greedy tokens (tg)
    trace: dict[str, Any] = dataclasses.field(default_factory=dict)  # --trace: trace.TraceSummary of the timed part


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


def upstream_differences(rows: Iterable[Row]) -> list[str]:
    """Where the rows of every kill switch at 0 (--upstream) differ from upstream's own tools (--pristine) in what
    was decided: buffer sizes, cache slots, and the cache's hits, misses and MiB uploaded. Both must be equal."""
    by: dict[tuple[str, str, str], dict[str, dict[str, dict[str, float]]]] = {}
    for r in rows:
        sw = switch_label(r.switches)
        if r.tool != "python" and sw in ("upstream", "pristine") and r.cache:
            by.setdefault((r.setup, column(r), r.tool), {})[sw] = r.cache
    out = []
    for (setup, col, _), got in by.items():
        if len(got) < 2:
            continue
        ours, theirs = got["upstream"], got["pristine"]
        for kind, values in theirs.items():
            if kind == "decisions" or kind.startswith("ubatch"):
                keys = sorted(values) if kind == "decisions" else ["hits", "misses", "uploaded_mib"]
                for k in keys:
                    a, b = ours.get(kind, {}).get(k), values.get(k)
                    if a != b:
                        out.append(f"DIFFERS {setup} {col} {kind} {k}: upstream {a} vs pristine {b}")
    return out


def expert_bytes(model: Path) -> int:
    """Bytes of the expert tensors of a GGUF (read through ggml's gguf reader, no data loaded)."""
    from pyllama_moe import moe
    from pyllama_moe.ffi import ffi, lib

    with moe.gguf_header(str(model).encode()) as ctx:
        return sum(lib.gguf_get_tensor_size(ctx, i) for i in range(lib.gguf_get_n_tensors(ctx))
                   if EXPERT_TENSOR.search(ffi.string(lib.gguf_get_tensor_name(ctx, i)).decode()))


def block_count(model: Path) -> int:
    """The GGUF's ``{architecture}.block_count``."""
    from pyllama_moe import moe

    return moe.block_count(str(model).encode())


# ---------------------------------------------------------------- running the tools


def tool_path(name: str, tools: Path | None = None) -> Path:
    """A native tool of our build (the package's bin folder), or of the build folder ``tools``."""
    import pyllama_moe

    if tools is not None:
        for p in (tools / name, tools / "bin" / name):
            if p.is_file():
                return p
        raise FileNotFoundError(f"{name} is not in {tools} nor in {tools / 'bin'}")
    for d in pyllama_moe.__path__:
        p = Path(d) / "bin" / name
        if p.is_file():
            return p
    raise FileNotFoundError(f"{name} is not installed (build with -DPYLLAMA_MOE_TOOLS=ON, the default)")


Runner = Callable[[list[str], dict[str, str]], str]


def run_tool(cmd: list[str], env: dict[str, str]) -> str:
    res = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env})
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stderr[-3000:]}")
    return res.stdout + "\n" + res.stderr


def measure(model: Path, setup: Setup, switches: dict[str, str], pp: Sequence[int], ub: Sequence[int], tg: int,
            reps: int, run: Runner = run_tool, tools: Path | None = None) -> list[Row]:
    """The native tools on ``setup`` with ``switches`` in their environment; ``tools``: a build folder whose
    tools run instead of ours, with no switch set (upstream's own, unpatched: the rows of ``switches`` PRISTINE)."""
    rows: list[Row] = []
    if setup.fit_gib:  # our fit is Python's: no native run
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
        return rows
    mib = cache_mib(model, setup)
    for p, u in ((p, u) for p in pp for u in ub if u <= p):
        # -lv 4: llama's info lines, among them the cache statistics logged when the context is freed
        cmd = [str(tool_path("llama-batched-bench", tools)), "-m", str(model), *setup.args, *setup.batched_args,
               "--moe-cache-mib", str(mib), "-fa", "on", "-c", str(p + tg + 16), "-b", str(p), "-ub", str(u),
               "-npp", str(p), "-ntg", str(tg), "-npl", "1", "--output-format", "jsonl", "-lv", "4"]
        text = run(cmd, env)
        cache = parse_cache_stats(text)
        for r in parse_jsonl(text):
            rows.append(Row(setup.name, switches, "llama-batched-bench", r["pp"], u, 0, float(r["speed_pp"]), cache=cache))
            rows.append(Row(setup.name, switches, "llama-batched-bench", 0, u, r["tg"], float(r["speed_tg"]), cache=cache))
    return rows


def cache_mib(model: Path, setup: Setup) -> int:
    if setup.cache_mib_fixed:
        return setup.cache_mib_fixed
    return max(1, int(expert_bytes(model) * setup.cache_fraction) >> 20) if setup.cache_fraction else 0


def api_measure(model: Path, setup: Setup, switches: dict[str, str], n_prompt: int, n_ubatch: int, tg: int,
                run: Runner = run_tool, warm: int = 0, first: int = 0, trace: bool = False,
                warmup: int = -1, batch: int = 0) -> list[Row]:
    """Prompt and generation speed through ``Llama``, in a child process (the switches are its environment);
    with ``warm``, that many tokens are generated first, so a MoE cache is warm for the timed prompt; with
    ``first``, that many greedy tokens continue the timed prompt (a row of their own: their speed, and the MoE
    cache's hit rate in those decode steps); with ``trace``, the GPU's activity in the timed prompt and those
    tokens (``gpu_trace.Tracer``, started before the timing: the speeds include what recording costs while the
    work runs). ``warmup``: the tokens of the prompt evaluated once before it (at most a ubatch, -1: a whole
    one, as llama-bench warms up with the prompt; 0: none), to build graphs and load kernels outside the timing.
    ``batch``: the prompt is evaluated in batches of that many tokens, only the last one with an output, as
    llama-server does with its ``-b`` (0: one batch)."""
    kwargs = {**dict(setup.llama_kwargs), "moe_cache_mib": cache_mib(model, setup)}
    if setup.fit_gib:
        kwargs.update(fit_kwargs(setup))
    spec = {"model": str(model), "n_prompt": n_prompt, "n_ubatch": n_ubatch, "tg": tg, "warm": warm, "first": first,
            "trace": trace, "warmup": warmup, "batch": batch, "kwargs": kwargs}
    out = run([sys.executable, "-m", "pyllama_moe.bench", "--api-worker", json.dumps(spec)], switches)
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
    rows = [Row(setup.name, switches, "python", n_prompt, n_ubatch, 0, res["pp_ts"], cache=stats,
                digest=res["pp_digest"] if same else "", trace=res.get("pp_trace", {})),
            Row(setup.name, switches, "python", 0, n_ubatch, res["n_gen"], res["tg_ts"],
                cache={**stats, "tg": res["tg"]} if res.get("tg") else stats, digest=res["tg_digest"] if same else "")]
    if "first" in res:
        f = res["first"]
        rows.append(Row(setup.name, switches, "python", n_prompt, n_ubatch, f["n"], f["ts"],
                        cache={"first": {k: v for k, v in f.items() if k not in ("digest", "trace")}},
                        digest=f["digest"] if same else "", trace=f.get("trace", {})))
    return rows


def fit_kwargs(setup: Setup) -> dict[str, Any]:
    """``Llama`` arguments of a fit setup: a fit target that leaves ``fit_gib`` GiB of the first GPU's free memory."""
    from pyllama_moe import backend

    gpu = next(d for d in backend.devices() if d.type == "gpu")
    target = max(0, gpu.memory_free - (setup.fit_gib << 30)) >> 20
    return {"fit": True, "fit_target_mib": target, "n_gpu_layers": -1, "load_mode": "none",
            "moe_cache_mib": "auto" if setup.cache_auto else 0}


def bench_text(vocab_tokenize: Callable[[bytes], list[int]]) -> tuple[list[int], list[int]]:
    """The bench's real text as tokens: the documentation of standard-library modules (the prompts, and the
    tokens after them) and their source code (decoding from an empty context, and a cache's warm-up): two topics."""
    from pyllama_moe.routing import stdlib_text

    text = stdlib_text(120_000, source_share=0.25)
    split = int(len(text) * 0.75)  # stdlib_text: the documentation, then the source code
    return vocab_tokenize(text[:split].encode()), vocab_tokenize(text[split:].encode())


def api_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """One model load: a prompt of real text evaluated (timed after a warm-up), then decoding real text from an
    empty context, one token per step (teacher-forced: the speed of generation whose tokens are text, whatever
    the model would pick; the hash is of its greedy picks)."""
    import hashlib

    from pyllama_moe.ffi import lib
    from pyllama_moe.llama import Llama
    from pyllama_moe.params import physical_cores

    n_prompt, n_ubatch, tg = spec["n_prompt"], spec["n_ubatch"], spec["tg"]
    # verbose: the native log (cache statistics, prefetch staging) goes to stderr, which api_measure reads;
    # the threads of llama-bench: one per physical core, for batches too
    threads = physical_cores()
    n_first = spec.get("first", 0)
    n_ctx = max(n_prompt + max(tg, n_first), spec.get("warm", 0) + 1) + 16
    n_batch = spec.get("batch") or n_prompt
    with Llama(spec["model"], n_ctx=n_ctx, n_batch=n_batch, n_ubatch=min(n_ubatch, n_batch), flash_attn=True,
               n_threads=threads, n_threads_batch=threads, verbose=True, **spec["kwargs"]) as llm:
        docs, code = bench_text(lambda b: llm.tokenize(b, add_bos=False))
        need = max(n_prompt + n_first, 1)
        if len(docs) < need or len(code) < max(tg, spec.get("warm", 0)):
            raise ValueError(f"the bench text has {len(docs)} + {len(code)} tokens, too few for this run")
        tokens = [llm.token_bos(), *docs[: n_prompt - 1]]

        def decode(toks: list[int]) -> tuple[float, str]:
            """``toks`` one per decode step; the seconds and the hash of the greedy pick after each."""
            picks = []
            t0 = time.perf_counter()
            for tok in toks:
                llm.eval([tok])
                picks.append(int(llm._ctx.logits_ith(-1).argmax()))
            lib.llama_synchronize(llm._ctx.ptr)
            return time.perf_counter() - t0, hashlib.sha256(repr(picks).encode()).hexdigest()[:16]

        warmup = spec.get("warmup", -1)
        n_warmup = n_ubatch if warmup < 0 else min(n_ubatch, warmup)
        if n_warmup:  # graphs, CUDA kernels (loaded on first use), the cache's first uploads
            llm.eval(tokens[:n_warmup])
            llm.reset()
        if spec.get("warm"):  # a MoE cache warmed by another text: decode of source code before the timed prompt
            decode([llm.token_bos(), *code[: spec["warm"] - 1]])
            llm.reset()
        traced = Tracer(spec.get("trace", False))
        stats_before = llm.moe_cache_stats()
        with traced:  # the profiler's start and stop (seconds) outside the timing
            t0 = time.perf_counter()
            llm.eval(tokens)
            lib.llama_synchronize(llm._ctx.ptr)  # llama_decode returns before the device is done
            t_pp = time.perf_counter() - t0
        pp_digest = hashlib.sha256(llm._ctx.logits_ith(-1).tobytes()).hexdigest()[:16]
        stats_after = llm.moe_cache_stats()
        copies = prompt_copies(stats_before, stats_after)
        seeds = prompt_seeds(stats_before, stats_after)
        first = {}
        if n_first:  # the text continuing the prompt: the first decode steps find what the prompt left in the cache
            traced_first = Tracer(spec.get("trace", False))
            with traced_first:
                t_first, digest = decode(docs[n_prompt - 1: n_prompt - 1 + n_first])
            first = {"n": n_first, "ts": n_first / t_first, "s_with_prompt": t_pp + t_first, "digest": digest,
                     "trace": traced_first.as_dict(), **decode_hits(stats_after, llm.moe_cache_stats())}
        # decoding from an empty context, as llama-bench's tg: a few steps warm up, then the timed ones
        llm.reset()
        decode([llm.token_bos(), *code[:3]])
        llm.reset()
        before = llm.moe_cache_stats()
        t_tg, tg_digest = decode([llm.token_bos(), *code[: tg - 1]])
        out = {"pp_ts": n_prompt / t_pp, "pp_digest": pp_digest, "n_gen": tg, "tg_ts": tg / t_tg,
               "tg_digest": tg_digest, "placement": llm.placement, "pp_trace": traced.as_dict(),
               "tg": decode_hits(before, llm.moe_cache_stats())}
        if first:
            out["first"] = first
        if copies:
            out["prompt_copies"] = copies
        if seeds:
            out["prompt_seeds"] = seeds
        return out


def decode_hits(before: dict[str, dict[str, float]] | None, after: dict[str, dict[str, float]] | None
                ) -> dict[str, float]:
    """The MoE cache's hits, misses and hit rate between two ``moe_cache_stats()`` in decode steps (looked up on the
    device, or on the host for ubatches of <= 8); empty without a cache."""
    if not before or not after:
        return {}
    hits = sum(after[p]["hits"] - before[p]["hits"] for p in ("device", "small"))
    misses = sum(after[p]["misses"] - before[p]["misses"] for p in ("device", "small"))
    return {"hits": hits, "misses": misses, "hit_rate": 100.0 * hits / max(hits + misses, 1)}


def prompt_copies(before: dict[str, dict[str, float]] | None, after: dict[str, dict[str, float]] | None
                  ) -> dict[str, float] | None:
    """What the prefetch through the MoE cache copied for the large ubatches between two ``moe_cache_stats()``, per
    ubatch: batched copy calls, regions, MiB copied from the cache (device to device) and MiB uploaded (PCIe); None
    without a cache, a large ubatch or a copy through the cache."""
    if not before or not after:
        return None
    b, a = before["prefetch"], after["prefetch"]
    n = a["ubatches"] - b["ubatches"]
    if n <= 0 or a["calls"] == b["calls"]:
        return None
    return {"ubatches": n, "calls": (a["calls"] - b["calls"]) / n, "regions": (a["regions"] - b["regions"]) / n,
            "cache": (a["bytes_cache"] - b["bytes_cache"]) / n / 2**20,
            "host": (a["bytes_host"] - b["bytes_host"]) / n / 2**20}


def prompt_seeds(before: dict[str, dict[str, float]] | None, after: dict[str, dict[str, float]] | None
                 ) -> dict[str, float] | None:
    """The seeds of the MoE cache between two ``moe_cache_stats()``: seeding ubatches and the experts admitted;
    None without a cache or a seed."""
    if not before or not after or after["seed"]["ubatches"] == before["seed"]["ubatches"]:
        return None
    return {k: after["seed"][k] - before["seed"][k] for k in ("ubatches", "experts")}


def mismatches(rows: Iterable[Row]) -> list[str]:
    """Setups whose hashes differ between switch settings (results a kill switch must not change)."""
    seen: dict[tuple[str, str], dict[str, str]] = {}
    for r in rows:
        if r.digest:
            seen.setdefault((r.setup, column(r)), {})[switch_label(r.switches)] = r.digest
    return [f"MISMATCH {setup} {col}: " + ", ".join(f"{sw} -> {d}" for sw, d in by_sw.items())
            for (setup, col), by_sw in seen.items() if len(set(by_sw.values())) > 1]


def h2d_bandwidth(n_bytes: int = 1 << 30, mapped: Path | None = None) -> dict[str, float]:
    """Host-to-device copy bandwidth (GB/s) to the first GPU, pinned and pageable, and from ``mapped`` (the
    model: its pages in the page cache, as the mmap setups upload them) mapped read-only ({} without a GPU)."""
    from pyllama_moe import backend

    gpus = backend.gpus()
    return backend.h2d_bandwidth(gpus[0], n_bytes, mapped=mapped) if gpus else {}


# ---------------------------------------------------------------- Python overhead per token


TYPICAL = {"temperature": 0.8, "top_p": 0.95, "top_k": 40, "repeat_penalty": 1.1, "seed": 42}


def overhead(model: Path, n: int = 128, n_gpu_layers: int = 0, reps: int = 3) -> list[dict[str, Any]]:
    """``create_completion`` against a bare decode loop on the same context, in microseconds per token.

    The bare loop is what generation cannot do without: one ``llama_decode`` and one greedy
    ``llama_sampler_sample`` (argmax in C) per token, driven from Python through cffi. The prompt's
    own evaluation is timed apart and subtracted. Best of ``reps`` runs each.
    """
    from pyllama_moe.ffi import ffi, lib
    from pyllama_moe.llama import Llama

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


# ---------------------------------------------------------------- the table


def upstream_switches() -> dict[str, str]:
    return {k: "0" for k in KILL_SWITCHES}


def switch_label(switches: dict[str, str]) -> str:
    """How a switch setting is shown: ``-`` for none, ``upstream`` for every kill switch at 0, ``pristine`` for
    the tools of an unpatched build (--pristine)."""
    if switches and switches == upstream_switches():
        return UPSTREAM
    if switches == PRISTINE:
        return "pristine"
    return ",".join(f"{k}={v}" for k, v in sorted(switches.items())) or "-"


def column(r: Row) -> str:
    if r.n_prompt and r.n_gen:  # --first: the tokens that continue the prompt
        return f"tg{r.n_gen} after pp{r.n_prompt}"
    return f"pp{r.n_prompt} ub{r.n_ubatch}" if r.n_prompt else f"tg{r.n_gen}"


def table(rows: Iterable[Row]) -> str:
    """One line per setup and switch setting, one column per measurement, cache statistics last."""
    rows = list(rows)
    cols: list[str] = []
    for r in rows:
        if column(r) not in cols:
            cols.append(column(r))
    cols.sort(key=lambda c: (c.startswith("tg"), [int(x) for x in re.findall(r"\d+", c)]))
    lines: dict[tuple[str, str, str], dict[str, str]] = {}
    for r in rows:
        sw = switch_label(r.switches)
        cell = lines.setdefault((r.setup, sw, "python" if r.tool == "python" else "native"), {})
        cell[column(r)] = f"{r.tokens_per_s:.1f}" + (f" ± {r.stddev:.1f}" if r.stddev else "")
        small = r.cache.get("device lookups") or r.cache.get("ubatch <= 8")  # decode: looked up on the GPU or the host
        if small:
            cell["cache"] = f"{small['hit_rate']:.1f}% hits, {small['uploaded_mib']:.0f} MiB up"
        if r.cache.get("tg"):  # the hit rate of the timed decode itself (the log's figures are the whole run's)
            cell["cache"] = f"tg {r.cache['tg']['hit_rate']:.1f}% hits; " + cell.get("cache", "")
        pf = r.cache.get("prefetch")
        if pf:
            cell["prefetch"] = f"{pf['staging_mib']:.0f} MiB x{pf['depth']}"
        pc = r.cache.get("prompt copies")
        if pc:
            cell["prompt"] = f"{pc['calls']:.0f} calls, {pc['cache']:.0f} MiB cached, {pc['host']:.0f} MiB up"
        ps = r.cache.get("prompt seeds")
        if ps:  # the seeds of the timed prompt
            cell["prompt"] = cell.get("prompt", "-") + f"; {ps['ubatches']:.0f} seeds, {ps['experts']:.0f} experts"
        ft = r.cache.get("first")
        if ft:
            hits = f"{ft['hit_rate']:.1f}% hits, " if "hit_rate" in ft else ""
            cell["first"] = f"{hits}{ft['s_with_prompt']:.2f} s with the prompt"
    head = ["setup", "switches", "via", *cols, "cache (decode)", "prefetch staging", "prompt copies per ubatch"]
    first = any("first" in cell for cell in lines.values())
    if first:
        head.append("tokens after the prompt")
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (setup, sw, via), cell in lines.items():
        extra = [cell.get("first", "-")] if first else []
        out.append("| " + " | ".join([setup, sw, via, *[cell.get(c, "-") for c in cols], cell.get("cache", "-"),
                                      cell.get("prefetch", "-"), cell.get("prompt", "-"), *extra]) + " |")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--api-worker"] and len(argv) == 2:  # the child process of api_measure
        print(json.dumps(api_worker(json.loads(argv[1]))), flush=True)
        return 0
    ap = argparse.ArgumentParser(prog="python -m pyllama_moe bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path, help="GGUF model; with --preset, written there first if absent")
    ap.add_argument("--preset", help="make the model with pyllama_moe.synth if the file does not exist")
    ap.add_argument("--routing", default="realistic", choices=("realistic", "collapsed", "uniform"),
                    help="with --preset: the routing regime of the model written (default realistic, like a trained "
                         "MoE's; collapsed and uniform are the bounds)")
    ap.add_argument("--setups", help=f"comma list of {', '.join(SETUPS)} (default: all; the dense ones with --dense), "
                                     "cache-<N>mib (a cache of N MiB), fit-<G>gib and fit-<G>gib-cache (fit=True "
                                     "with G GiB of the GPU, without the cache and with moe_cache_mib='auto'); a cache "
                                     "setup with -mmap appended loads the experts with mmap (e.g. cache-25-mmap)")
    ap.add_argument("--dense", type=Path, help="a dense GGUF model for the dense-* setups (with --preset, written there "
                                               "first if absent: the preset's shape as a dense qwen3)")
    ap.add_argument("--upstream", action="store_true",
                    help=f"also run every setup with all kill switches at 0 ({', '.join(KILL_SWITCHES)})")
    ap.add_argument("--pristine", type=Path, metavar="DIR",
                    help="also run the native tools of DIR, a build of the pinned upstream tree without our patches "
                         "(ci/gpu.sh pristine makes one), on every setup: the 'pristine' rows, to put beside "
                         "--upstream's")
    ap.add_argument("--switch", action="append", default=[], metavar="ENV[=VALUE]",
                    help="a switch: each setup runs with ENV unset and with ENV=VALUE (default 0: a kill switch; "
                         "e.g. LLAMA_MOE_CACHE_DEVICE=1 for an opt-in feature) (repeatable)")
    ap.add_argument("--pp", default="512,2048", help="prompt lengths (default 512,2048)")
    ap.add_argument("--ub", default="512,2048", help="ubatch sizes (default 512,2048)")
    ap.add_argument("--tg", type=int, default=128, help="tokens generated (default 128)")
    ap.add_argument("--reps", type=int, default=2, help="llama-bench repetitions (default 2)")
    ap.add_argument("--json", type=Path, help="write the rows here")
    ap.add_argument("--overhead", action="store_true",
                    help="only the Python overhead per token: create_completion vs a bare decode loop")
    ap.add_argument("-ngl", "--n-gpu-layers", type=int, default=-1, help="--overhead: layers on the GPU (default all)")
    ap.add_argument("--no-api", action="store_true", help="only the native tools, not the Python API")
    ap.add_argument("--no-native", action="store_true", help="only the Python API, not the native tools")
    ap.add_argument("--warm", type=int, default=0, metavar="N",
                    help="Python API: generate N tokens before the timed prompt, so the MoE cache is warm "
                         "(the prompt path copies cached experts from it)")
    ap.add_argument("--warmup", type=int, default=-1, metavar="N",
                    help="Python API: evaluate the first N tokens of the prompt (at most a ubatch) once before timing "
                         "it (default: a whole ubatch, as llama-bench warms up with the prompt; 0: none)")
    ap.add_argument("--first", type=int, default=0, metavar="N",
                    help="Python API: N greedy tokens continue the timed prompt: their speed, the MoE cache's hit "
                         "rate in those decode steps and the time with the prompt (what the seed of the cache changes)")
    ap.add_argument("--trace", action="store_true",
                    help="Python API: record what the GPU did in the timed prompt and the --first tokens (PyTorch's "
                         "profiler: kernels and copies per stream, copy time under compute) and print a summary")
    ap.add_argument("--batch", type=int, default=0, metavar="N",
                    help="Python API: evaluate the prompt in batches of N tokens, only the last one with an output, as "
                         "llama-server's -b (default: the whole prompt in one batch)")
    ap.add_argument("--api-every-ub", action="store_true",
                    help="run the Python API at every ubatch size of --ub, not only the largest (the logits hash "
                         "is then compared across the switches at each)")
    args = ap.parse_args(argv)

    for path, dense in ((args.model, False), (args.dense, True)):
        if path is None or path.exists():
            continue
        if not args.preset:
            ap.error(f"{path} does not exist (give --preset to make it)")
        print(f"writing {'a dense ' if dense else ''}{args.preset} to {path} ...", file=sys.stderr, flush=True)
        write_model(path, args.preset, dense, progress=sys.stderr.isatty(), routing=args.routing)
    if args.overhead:
        rows_o = overhead(args.model, n=args.tg, n_gpu_layers=args.n_gpu_layers, reps=args.reps)
        print(overhead_table(rows_o))
        if args.json:
            args.json.write_text(json.dumps({"model": str(args.model), "overhead": rows_o}, indent=1))
        return 0
    if args.setups is None:
        names = [n for n in SETUPS if args.dense or n not in DENSE_SETUPS]
    else:
        names = [s.strip() for s in args.setups.split(",") if s.strip()]
    unknown = [n for n in names if setup_named(n) is None]
    if unknown:
        ap.error(f"unknown setup {unknown[0]!r}; known: {', '.join(SETUPS)}, cache-<N>mib, fit-<G>gib[-cache], "
                 f"a cache setup + {MMAP_SUFFIX}")
    if args.no_api and args.no_native:
        ap.error("--no-api and --no-native leave nothing to run")
    if not args.dense and any(n in DENSE_SETUPS for n in names):
        ap.error("the dense-* setups need --dense MODEL")
    if args.trace and (args.no_api or importlib.util.find_spec("torch") is None):
        ap.error("--trace traces the Python API runs through PyTorch's profiler: it needs PyTorch, and not --no-api")
    from pyllama_moe import backend

    gpu = backend.gpu_available()
    pp = [int(x) for x in args.pp.split(",")]
    ub = sorted(int(x) for x in args.ub.split(","))
    settings: list[dict[str, str]] = [{}]
    settings += [dict([sw.split("=", 1) if "=" in sw else (sw, "0")]) for sw in args.switch]
    if args.upstream:
        settings.append(upstream_switches())
    if args.pristine:
        if args.no_native:
            ap.error("--pristine runs native tools: not with --no-native")
        for name in ("llama-bench", "llama-batched-bench"):
            try:
                tool_path(name, args.pristine)
            except FileNotFoundError as e:
                ap.error(f"--pristine: {e}")
        settings.append(PRISTINE)
    rows: list[Row] = []
    skipped: list[str] = []
    failed: list[str] = []
    bw: dict[str, float] = {}
    regime = routing_regime(args.model)

    def save() -> None:  # after every run, so an interrupted matrix keeps what it measured
        if args.json:
            args.json.write_text(json.dumps({"model": str(args.model), "routing": regime, "dense": str(args.dense or ""),
                                             "h2d_gbps": bw, "mismatches": mismatches(rows) + upstream_differences(rows),
                                             "failed": failed, "rows": [dataclasses.asdict(r) for r in rows]},
                                            indent=1))

    for name in names:
        setup = setup_named(name)
        assert setup is not None
        if (setup.needs_gpu or setup.has_cache) and not gpu:
            skipped.append(name)
            continue
        if setup.fit_gib and args.no_api:
            skipped.append(f"{name} (Python only, --no-api)")
            continue
        model = args.dense if setup.dense else args.model
        if setup.dense:
            setup = setup.resolve(block_count(model))
        for sw in settings:
            print(f"bench: {name} {switch_label(sw)}", file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            try:
                pristine = sw == PRISTINE
                if not args.no_native:
                    rows += measure(model, setup, sw, pp, ub, args.tg, args.reps, tools=args.pristine if pristine else None)
                if not args.no_api and not pristine:  # the Python API runs our library only
                    api_ub = [u for u in ub if u <= max(pp)]
                    for u in (api_ub if args.api_every_ub else api_ub[-1:]):
                        rows += api_measure(model, setup, sw, max(pp), u, args.tg, warm=args.warm, first=args.first,
                                            trace=args.trace, warmup=args.warmup, batch=args.batch)
            except RuntimeError as e:  # a failing run is reported, the others still run
                failed.append(f"{name} {switch_label(sw)}: {str(e)[-1500:]}")
                print(f"bench: FAILED {failed[-1]}", file=sys.stderr, flush=True)
            print(f"bench: {name} took {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
            save()
    bw = h2d_bandwidth(mapped=args.model) if gpu else {}
    print(f"{args.model.name}: {regime} routing; prompts and decoded tokens are real text (bench_text)\n")
    print(table(rows))
    placed = {r.setup: r.cache["placement"] for r in rows if r.setup.startswith("fit-") and "placement" in r.cache}
    for name, pl in placed.items():  # where the fit put the weights
        print(f"\n{name}: " + ", ".join(f"{k}={v}" for k, v in pl.items()))
    bad = mismatches(rows) + upstream_differences(rows)
    traced = [r for r in rows if r.trace]
    if traced:
        print("\nGPU activity of the timed part (--trace; these runs' speeds include what recording costs):")
    for r in traced:
        what = f"pp{r.n_prompt} ub{r.n_ubatch}" + (f" + {r.n_gen} tokens after it" if r.n_gen else "")
        print(f"- {r.setup} {switch_label(r.switches)} {what}: {TraceSummary(**r.trace).line()}")
    for line in bad:
        print(f"\n!!! {line}")
    if bw:
        labels = {"mapped": "the model's mapped pages (load mode mmap)"}
        print("\nhost-to-device copy: " + ", ".join(f"{labels.get(k, k)} {v:.1f} GB/s" for k, v in bw.items()))
    if skipped:
        print(f"\nnot run (no GPU, or Python-only with --no-api): {', '.join(skipped)}")
    for f in failed:
        print(f"\n!!! FAILED {f}")
    save()
    return 1 if bad or failed else 0


if __name__ == "__main__":
    sys.exit(main())
