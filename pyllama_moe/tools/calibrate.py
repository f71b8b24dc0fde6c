"""How often a MoE model's layers select each expert on a text, written as the MoE cache's warm-start file (#46).

    python -m pyllama_moe calibrate MODEL.gguf --out STATE.json [--text FILE] [--tokens 4096] [--ngl 0]

The text (by default :mod:`.text`'s, the routing report's) is evaluated and every MoE layer's selections are recorded
(:mod:`.capture`, as the routing report records them); each layer's experts are counted over the tokens and the counts
written as a :class:`pyllama_moe.moe_state.MoeCacheState` (``source`` ``"calibrate"``), keyed by the model's
fingerprint and shape. See docs/calibrate.md.

Public API: :func:`calibrate`, :func:`expert_counts`, :func:`top_share`, :func:`main`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from pyllama_moe import moe_state
from pyllama_moe.tools.capture import Recording, record
from pyllama_moe.tools.text import stdlib_text

__all__ = ["DEFAULT_TOKENS", "TOP_SHARE", "calibrate", "expert_counts", "main", "top_share"]

DEFAULT_TOKENS = 4096
TOP_SHARE = 0.25  # the summary: the share of the selections the most selected quarter of each layer's experts takes


def expert_counts(rec: Recording, n_layer: int) -> npt.NDArray[np.uint64]:
    """``[n_layer, n_expert]``: how often each layer selected each expert in ``rec`` (zeros for the layers it did not
    record: dense ones)."""
    out = np.zeros((n_layer, rec.n_expert), dtype=np.uint64)
    for il in rec.layers:
        if not 0 <= il < n_layer:
            raise ValueError(f"the recording has a MoE layer {il}, the model {n_layer} layers")
        out[il] = np.bincount(rec.topk[il].ravel(), minlength=rec.n_expert)
    return out


def top_share(counts: npt.NDArray[np.integer], share: float = TOP_SHARE) -> float:
    """The share of a layer's selections that its most selected ``share`` of experts take (at least one expert), the
    mean over the layers that selected any (0.0 when none did)."""
    n_top = max(1, int(round(share * counts.shape[1])))
    rows = [r for r in counts.astype(np.float64) if r.sum() > 0]
    if not rows:
        return 0.0
    return float(np.mean([np.sort(r)[::-1][:n_top].sum() / r.sum() for r in rows]))


def calibrate(model: str | os.PathLike[str], text: str, n_tokens: int = DEFAULT_TOKENS, n_gpu_layers: int = 0,
              threads: int | None = None) -> moe_state.MoeCacheState:
    """Count each MoE layer's selected experts over the first ``n_tokens`` tokens of ``text`` (a BOS first)."""
    from pyllama_moe import backend
    from pyllama_moe.model import Model
    from pyllama_moe.params import ModelParams

    if n_tokens < 1:
        raise ValueError(f"n_tokens must be at least 1, got {n_tokens}")
    # the key is the loaded model's (as a Llama's), read before the recording loads it once more
    m = Model(model, ModelParams(), verbose=False)
    try:
        model_id, n_layer, n_expert = m.fingerprint(), m.n_layer(), m.n_expert()
        tokens = m.vocab.tokenize(text.encode("utf-8"), add_special=True)[:n_tokens]
    finally:
        m.close()
    if n_expert < 1:
        raise ValueError(f"{model}: not a MoE model (no expert_count in its metadata)")
    if not tokens:
        raise ValueError("the text has no tokens")
    with backend.verbosity(False):  # llama.cpp's log of the second load, as the first (errors still reach exceptions)
        rec = record(model, tokens, n_gpu_layers=n_gpu_layers, router_inputs=False, threads=threads)
    if rec.n_expert != n_expert:
        raise ValueError(f"{model}: the routers rank {rec.n_expert} experts, the metadata says {n_expert}")
    return moe_state.MoeCacheState(model_id, n_layer, n_expert, expert_counts(rec, n_layer), len(tokens),
                                   "calibrate")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pyllama_moe calibrate", description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--out", type=Path, required=True, help="the state file to write (JSON, see docs/calibrate.md)")
    ap.add_argument("--text", type=Path,
                    help="a UTF-8 text file (default: Python's standard-library documentation and code)")
    ap.add_argument("--tokens", type=int, default=DEFAULT_TOKENS,
                    help=f"tokens of the text to count (default {DEFAULT_TOKENS})")
    ap.add_argument("--ngl", type=int, default=0, help="layers on the GPU (default 0: the CPU)")
    ap.add_argument("--threads", type=int, help="CPU threads (default: llama.cpp's)")
    args = ap.parse_args(argv)
    if args.tokens < 1:
        ap.error("--tokens must be at least 1")
    try:
        text = args.text.read_text(encoding="utf-8") if args.text else stdlib_text()
        state = calibrate(args.model, text, args.tokens, args.ngl, args.threads)
        moe_state.save(state, args.out)
    except (OSError, ValueError, RuntimeError) as e:  # a missing file, not a MoE model, a load that failed
        print(f"calibrate: error: {e}", file=sys.stderr)
        return 1
    n_moe = int((state.counts.sum(axis=1) > 0).sum())
    print(f"{state.n_tokens} tokens, {n_moe} MoE layers of {state.n_layer}, {state.n_expert} experts each: the most "
          f"selected {TOP_SHARE:.0%} of a layer's experts take {top_share(state.counts):.1%} of its selections "
          f"(mean over the layers); wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
