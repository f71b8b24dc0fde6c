"""``python -m pyllama_moe synth``: the command line of the synthetic model writer."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from pyllama_moe.tools.synth.projector import family_of, write_projector
from pyllama_moe.tools.synth.shapes import (
    ARCHITECTURES,
    DENSE_TYPES,
    EXPERT_TYPES,
    PRESETS,
    SHAPE_FIELDS,
    Shape,
    resolve_shape,
)
from pyllama_moe.tools.synth.tensors import ROUTINGS, SCALE_SIGNS, Plan, plan
from pyllama_moe.tools.synth.vocab import VOCAB_ENV
from pyllama_moe.tools.synth.writer import write_model

# --------------------------------------------------------------------------------------------
# command line


def _parser() -> argparse.ArgumentParser:
    """The ``synth`` command's argument parser."""
    ap = argparse.ArgumentParser(
        prog="python -m pyllama_moe synth",
        description="Write a random-weight GGUF model of one of --arch's architectures with a real tokenizer.",
    )
    ap.add_argument("output", type=Path, help="the GGUF file to write")
    ap.add_argument("--preset", default="tiny", choices=sorted(PRESETS), help="base shape (default tiny)")
    ap.add_argument("--arch", choices=ARCHITECTURES, help="architecture (default: the preset's)")
    ap.add_argument("--expert-type", default="q4_0", choices=EXPERT_TYPES,
                    help="type of expert/FFN weights (default q4_0)")
    ap.add_argument("--dense-type", default="f16", choices=DENSE_TYPES,
                    help="type of attention/embedding/output (default f16)")
    ap.add_argument("--skew", type=float, default=0.0, help="router skew, 0 = uniform random routing (default 0)")
    ap.add_argument("--routing", default="auto", choices=ROUTINGS,
                    help="routing regime: realistic (calibrated to Qwen3-30B-A3B), dispersed (to Mixtral- and "
                         "shared-expert models; both qwen3moe), uniform, collapsed (onto a few experts) (default auto: "
                         "collapsed, or as --skew and --scale-signs say)")
    ap.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    ap.add_argument("--scale-signs", default="auto", choices=SCALE_SIGNS,
                    help="signs of the quantized blocks' scales (default auto: positive without skew, random with it)")
    ap.add_argument("--vocab", type=Path,
                    help=f"vocab-only GGUF to copy the tokenizer from (default: ${VOCAB_ENV} or the packaged "
                         "qwen2 one)")
    ap.add_argument("--threads", type=int, help="generator threads (default: CPU count, at most 16)")
    shape = ap.add_argument_group("shape overrides")
    for f in dataclasses.fields(Shape):
        if f.name == "arch":
            continue
        kind = float if f.type in ("float", float) else int
        shape.add_argument("--" + f.name.replace("_", "-"), dest=f.name, type=kind, metavar="N" if kind is int else "X")
    real = ap.add_argument_group("a MoE made from a real dense model (MoEfication, pyllama_moe.tools.moefy)")
    real.add_argument("--from-dense", type=Path, metavar="DENSE.gguf",
                      help="split this dense llama or qwen3 model's FFNs into experts (the other options are ignored)")
    real.add_argument("--experts", type=int, default=64, help="experts per layer (default 64)")
    real.add_argument("--used", type=int, default=8, help="experts each token uses (default 8)")
    ap.add_argument("--mmproj", type=Path, metavar="MMPROJ.gguf",
                    help="also write a random-weight vision projector for the model here (llama4)")
    ap.add_argument("--plan", action="store_true", help="print the tensors and sizes, write nothing")
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    return ap


def main(argv: list[str] | None = None) -> int:
    """The ``python -m pyllama_moe synth`` command; returns the exit status."""
    args = _parser().parse_args(argv)
    overrides = {name: getattr(args, name) for name in SHAPE_FIELDS if getattr(args, name) is not None}
    try:
        if args.from_dense is not None:
            from pyllama_moe.tools import moefy

            path = moefy.moefy(args.from_dense, args.output, args.experts, args.used, seed=args.seed,
                               progress=not args.quiet and sys.stderr.isatty())
        elif args.plan:
            p = plan(args.preset, arch=args.arch, expert_type=args.expert_type, dense_type=args.dense_type,
                     skew=args.skew, vocab_path=args.vocab, scale_signs=args.scale_signs, routing=args.routing,
                     **overrides)
            _print_plan(p)
            return 0
        else:
            shape = resolve_shape(args.preset, arch=args.arch, **overrides)
            family = family_of(shape.arch) if args.mmproj is not None else None
            path = write_model(
                args.output, args.preset, arch=args.arch, vocab_path=args.vocab, expert_type=args.expert_type,
                skew=args.skew, seed=args.seed, dense_type=args.dense_type, threads=args.threads,
                scale_signs=args.scale_signs, routing=args.routing,
                progress=not args.quiet and sys.stderr.isatty(), **overrides,
            )
            if family is not None:
                mmproj = write_projector(args.mmproj, shape.n_embd, family, seed=args.seed)
                print(f"{mmproj}\t{mmproj.stat().st_size} bytes ({family} projector)")
    except (ValueError, FileNotFoundError) as e:
        print(f"synth: error: {e}", file=sys.stderr)
        return 2
    size = path.stat().st_size
    print(f"{path}\t{size} bytes ({size / 2**20:.1f} MiB)")
    return 0


def _print_plan(p: Plan) -> None:
    """Print every tensor of ``p`` and the totals."""
    for t in p.tensors:
        print(f"{t.name:36s} {t.type.name:5s} {'x'.join(map(str, t.shape)):>20s} {t.nbytes:>14d}")
    print(f"{p.shape.arch}: {len(p.tensors)} tensors, {p.tensor_bytes} bytes ({p.tensor_bytes / 2**30:.3f} GiB), "
          f"experts {p.expert_bytes / 2**20:.0f} MiB")

