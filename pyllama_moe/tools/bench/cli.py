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

With ``--ttft`` a second table gives each prompt of ``--pp`` at each ubatch of ``--ub`` and llama.cpp's default
(512): its time to first token, its tokens/s and its PCIe bound, the time the experts not on the GPU take to upload
once per ubatch (:mod:`.ttft`).

The table is the measurement: nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from pyllama_moe.gguf_info import GGUFInfo
from pyllama_moe.tools.bench.api import api_measure
from pyllama_moe.tools.bench.gpu_trace import TraceSummary
from pyllama_moe.tools.bench.matrix import (
    DENSE_SETUPS,
    HYBRID_SUFFIXES,
    KILL_SWITCHES,
    MMAP_SUFFIX,
    PRISTINE,
    SETUPS,
    setup_named,
    upstream_switches,
)
from pyllama_moe.tools.bench.models import routing_regime, write_model
from pyllama_moe.tools.bench.native import h2d_bandwidth, measure, tool_path
from pyllama_moe.tools.bench.overhead import overhead, overhead_table
from pyllama_moe.tools.bench.report import Row, draft_table, mismatches, switch_label, table, upstream_differences
from pyllama_moe.tools.bench.ttft import DEFAULT_H2D_GBPS, DEFAULT_UBATCH, TtftRow, ttft_rows, ttft_table


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m pyllama_moe bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path, help="GGUF model; with --preset, written there first if absent")
    ap.add_argument("--preset", help="make the model with pyllama_moe.tools.synth if the file does not exist")
    ap.add_argument("--routing", default="realistic", choices=("realistic", "dispersed", "uniform", "collapsed"),
                    help="with --preset: the routing regime of the model written (default realistic, calibrated to "
                         "Qwen3-30B-A3B; dispersed to Mixtral- and shared-expert models; uniform and collapsed are "
                         "the bounds)")
    ap.add_argument("--setups", help=f"comma list of {', '.join(SETUPS)} (default: all; the dense ones with --dense), "
                                     "cache-<N>mib (a cache of N MiB), fit-<G>gib and fit-<G>gib-cache (fit=True "
                                     "with G GiB of the GPU, without the cache and with moe_cache_mib='auto'); a cache "
                                     "setup with -mmap appended loads the experts with mmap (e.g. cache-25-mmap), with "
                                     "-hybrid or -auto appended adds moe_hybrid=True or 'auto', the CPU computing a "
                                     "share of the cache's misses (e.g. cache-25-hybrid; Python only)")
    ap.add_argument("--dense", type=Path, help="a dense GGUF model for the dense-* setups (with --preset, written "
                                               "there first if absent: the preset's shape as a dense qwen3)")
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
    ap.add_argument("--draft", default="", metavar="N[,N...]",
                    help="Python API: also generate --tg greedy tokens after a prompt that quotes source code to edit "
                         "and after one of prose, without a draft and with prompt-lookup speculative decoding "
                         "(LlamaPromptLookupDecoding) proposing up to each N tokens: tokens/s, tokens per decode, the "
                         "share of draft tokens accepted and the MoE cache's misses per decode and per token, in a "
                         "table of their own")
    ap.add_argument("--draft-bounds", action="store_true",
                    help="with --draft: each draft size also with the text generated without a draft decoded "
                         "teacher-forced, size + 1 tokens a decode (every proposal accepted) and with a draft "
                         "proposing other tokens (every one rejected; also with draft_adapt's rule): what drafts "
                         "of that size cost and gain at best and at worst, on any model (a random-weight one copies "
                         "nothing of its prompt, so prompt lookup proposes almost nothing there)")
    ap.add_argument("--batch", type=int, default=0, metavar="N",
                    help="Python API: evaluate the prompt in batches of N tokens, only the last one with an output, as "
                         "llama-server's -b (default: the whole prompt in one batch)")
    ap.add_argument("--api-every-ub", action="store_true",
                    help="run the Python API at every ubatch size of --ub, not only the largest (the logits hash "
                         "is then compared across the switches at each)")
    ap.add_argument("--ttft", action="store_true",
                    help=f"long prompts: each prompt of --pp at each ubatch of --ub and at {DEFAULT_UBATCH} (the "
                         "default), in a table of its own: the time to first token (the prompt and one decoded "
                         "token), the prompt's tokens/s and its PCIe bound (the experts not on the GPU uploaded once "
                         "per ubatch; the Python API runs every prompt, with --first 1 at least)")
    ap.add_argument("--h2d-gbps", type=float, metavar="GBPS",
                    help="--ttft: the host-to-device GB/s of the PCIe bound (default: a pinned copy measured at the "
                         f"start; {DEFAULT_H2D_GBPS:g}, an H100's, where there is no GPU)")
    return ap


@dataclasses.dataclass
class Params:
    """The options, checked: what to run (the setups, each under every switch setting) and how."""

    args: argparse.Namespace
    names: list[str]
    settings: list[dict[str, str]]
    pp: list[int]
    ub: list[int]
    drafts: list[int] = dataclasses.field(default_factory=list)

    def api_runs(self) -> list[tuple[int, int]]:
        """The Python API's (prompt, ubatch) runs: the longest prompt (with --ttft every one) at the largest ubatch
        within it (with --api-every-ub every one)."""
        runs = []
        for p in (self.pp if self.args.ttft else [max(self.pp)]):
            ubs = [u for u in self.ub if u <= p]
            runs += [(p, u) for u in (ubs if self.args.api_every_ub else ubs[-1:])]
        return runs


def draft_sizes(text: str) -> list[int]:
    """--draft's comma list: the draft sizes, each a positive integer, in the order given, once each; ValueError
    otherwise."""
    sizes: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if not part.isdigit() or int(part) < 1:
            raise ValueError(f"--draft takes positive integers separated by commas, got {part!r}")
        if int(part) not in sizes:
            sizes.append(int(part))
    return sizes


def _params(ap: argparse.ArgumentParser, args: argparse.Namespace) -> Params:
    """The setups and switch settings the options ask for; ``ap.error`` (exit 2) for what cannot run."""
    if args.setups is None:
        names = [n for n in SETUPS if args.dense or n not in DENSE_SETUPS]
    else:
        names = [s.strip() for s in args.setups.split(",") if s.strip()]
    unknown = [n for n in names if setup_named(n) is None]
    if unknown:
        ap.error(f"unknown setup {unknown[0]!r}; known: {', '.join(SETUPS)}, cache-<N>mib, fit-<G>gib[-cache], "
                 f"a cache setup + {MMAP_SUFFIX}, + {' or '.join(HYBRID_SUFFIXES)}")
    if args.no_api and args.no_native:
        ap.error("--no-api and --no-native leave nothing to run")
    if not args.dense and any(n in DENSE_SETUPS for n in names):
        ap.error("the dense-* setups need --dense MODEL")
    if args.trace and (args.no_api or importlib.util.find_spec("torch") is None):
        ap.error("--trace traces the Python API runs through PyTorch's profiler: it needs PyTorch, and not --no-api")
    try:
        drafts = draft_sizes(args.draft)
    except ValueError as e:
        ap.error(str(e))
    if args.draft_bounds and not drafts:
        ap.error("--draft-bounds goes with --draft")
    if drafts and args.no_api:
        ap.error("--draft generates through the Python API: not with --no-api")
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
    try:
        pp = [int(x) for x in args.pp.split(",")]
        ub = sorted(int(x) for x in args.ub.split(","))
    except ValueError:
        ap.error("--pp and --ub take comma-separated token counts")
    if min(pp + ub) < 1:
        ap.error("--pp and --ub take positive token counts")
    if args.h2d_gbps is not None and not args.ttft:
        ap.error("--h2d-gbps is the bandwidth of --ttft's PCIe bound: it goes with --ttft")
    if args.h2d_gbps is not None and not args.h2d_gbps > 0:
        ap.error(f"--h2d-gbps takes a positive bandwidth in GB/s, got {args.h2d_gbps:g}")
    if args.ttft and args.tg < 1:
        ap.error("--ttft times the prompt and one decoded token: --tg must be at least 1")
    if args.ttft and DEFAULT_UBATCH not in ub:  # the defaults' row beside the ubatches asked for
        ub = sorted([*ub, DEFAULT_UBATCH])
    if args.no_native and ub[0] > max(pp):  # the Python API runs the ubatch sizes within the longest prompt only
        ap.error(f"--ub {args.ub}: no ubatch size within the prompt (--pp {args.pp}), so nothing would run")
    return Params(args, names, settings, pp, ub, drafts)


@dataclasses.dataclass
class Result:
    """What a matrix run measured; ``save`` writes it as JSON after every run, so an interrupted matrix keeps it."""

    model: Path
    regime: str
    dense: Path | None
    rows: list[Row] = dataclasses.field(default_factory=list)
    skipped: list[str] = dataclasses.field(default_factory=list)
    failed: list[str] = dataclasses.field(default_factory=list)
    bw: dict[str, float] = dataclasses.field(default_factory=dict)
    bound_gbps: float = 0.0  # --ttft: the bandwidth of the PCIe bound (0: no --ttft), and where it came from
    bound_gbps_from: str = ""

    def ttft(self) -> list[TtftRow]:
        """--ttft's rows (none without it)."""
        if not self.bound_gbps:
            return []
        return ttft_rows(self.rows, GGUFInfo.read(self.model).expert_bytes, self.bound_gbps)

    def save(self, path: Path | None) -> None:
        if path:
            data = {"model": str(self.model), "routing": self.regime, "dense": str(self.dense or ""),
                    "h2d_gbps": self.bw, "mismatches": mismatches(self.rows) + upstream_differences(self.rows),
                    "failed": self.failed, "rows": [dataclasses.asdict(r) for r in self.rows]}
            if self.bound_gbps:
                data["ttft"] = {"h2d_gbps": self.bound_gbps, "h2d_gbps_from": self.bound_gbps_from,
                                "rows": [dataclasses.asdict(t) for t in self.ttft()]}
            path.write_text(json.dumps(data, indent=1))


def _run(p: Params) -> Result:
    """Every setup under every switch setting: the native tools' runs and the Python API's."""
    from pyllama_moe import backend, moe

    args = p.args
    gpu = backend.gpu_available()
    cache = gpu or moe.cache_on_cpu()  # PYLLAMA_MOE_CACHE_CPU=1: the cache's setups run on the CPU (a dry run)
    res = Result(args.model, routing_regime(args.model), args.dense)
    if args.ttft:  # the bound's bandwidth, measured before the runs where it is not given
        if args.h2d_gbps is None and gpu:
            res.bw = h2d_bandwidth(mapped=args.model)
        if args.h2d_gbps is not None:
            res.bound_gbps, res.bound_gbps_from = args.h2d_gbps, "--h2d-gbps"
        elif "pinned" in res.bw:
            res.bound_gbps, res.bound_gbps_from = res.bw["pinned"], "measured"
        else:
            res.bound_gbps, res.bound_gbps_from = DEFAULT_H2D_GBPS, "default"
    for name in p.names:
        setup = setup_named(name)
        assert setup is not None
        runs_here = cache if setup.has_cache else (gpu or not setup.needs_gpu)
        if not runs_here:
            res.skipped.append(name)
            continue
        if setup.python_only and args.no_api:
            res.skipped.append(f"{name} (Python only, --no-api)")
            continue
        model = args.dense if setup.dense else args.model
        if setup.dense:
            setup = setup.resolve(GGUFInfo.read(model).require_block_count())
        for sw in p.settings:
            print(f"bench: {name} {switch_label(sw)}", file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            try:
                pristine = sw == PRISTINE
                if not args.no_native:
                    res.rows += measure(model, setup, sw, p.pp, p.ub, args.tg, args.reps,
                                        tools=args.pristine if pristine else None, per_ubatch=args.ttft)
                if not args.no_api and not pristine:  # the Python API runs our library only
                    first = max(args.first, 1) if args.ttft else args.first  # --ttft: a token after the prompt
                    for n_prompt, u in p.api_runs():
                        res.rows += api_measure(model, setup, sw, n_prompt, u, args.tg, warm=args.warm,
                                                first=first, trace=args.trace, warmup=args.warmup,
                                                batch=args.batch, draft=p.drafts,
                                                draft_bounds=args.draft_bounds, warm_token=args.ttft)
            except RuntimeError as e:  # a failing run is reported, the others still run
                res.failed.append(f"{name} {switch_label(sw)}: {str(e)[-1500:]}")
                print(f"bench: FAILED {res.failed[-1]}", file=sys.stderr, flush=True)
            print(f"bench: {name} took {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
            res.save(args.json)
    if not res.bw and gpu:
        res.bw = h2d_bandwidth(mapped=args.model)
    return res


def _report(res: Result) -> list[str]:
    """Prints the table and what goes with it; returns the mismatches found."""
    rows = res.rows
    print(f"{res.model.name}: {res.regime} routing; prompts and decoded tokens are real text (bench_text)\n")
    print(table(rows))
    trows = res.ttft()
    if trows:
        print(f"\nlong prompts (--ttft; TTFT: the prompt and one decoded token; the PCIe bound: the experts not on the "
              f"GPU uploaded once per ubatch at {res.bound_gbps:.1f} GB/s, {res.bound_gbps_from}):\n")
        print(ttft_table(trows))
    drafts = draft_table(rows)
    if drafts:
        print("\ngeneration with a draft (--draft; tokens/decode: llama_decode calls, misses: the MoE cache's):\n")
        print(drafts)
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
    if res.bw:
        labels = {"mapped": "the model's mapped pages (load mode mmap)"}
        print("\nhost-to-device copy: " + ", ".join(f"{labels.get(k, k)} {v:.1f} GB/s" for k, v in res.bw.items()))
    if res.skipped:
        print(f"\nnot run (no GPU, or Python-only with --no-api): {', '.join(res.skipped)}")
    for f in res.failed:
        print(f"\n!!! FAILED {f}")
    return bad


def main(argv: Sequence[str] | None = None) -> int:
    """The ``python -m pyllama_moe bench`` command: options, the matrix run setup by setup, the table; returns the
    exit status (1 if a hash mismatched, a decision differed from upstream's or a run failed)."""
    ap = _parser()
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
    res = _run(_params(ap, args))
    bad = _report(res)
    res.save(args.json)
    return 1 if bad or res.failed else 0


if __name__ == "__main__":
    sys.exit(main())
