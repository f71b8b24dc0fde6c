"""What a MoE model's routers select on real text, and what an expert cache would make of it.

    python -m pyllama_moe routing MODEL.gguf [--text FILE] [--tokens 4096] [--json OUT]

The experts each layer selects for every token are recorded through llama.cpp's eval callback (the
``ffn_moe_argsort``/``ffn_moe_topk`` tensors of upstream's graph), together with each layer's router input
(``ffn_norm``). Without ``--text`` the text is Python's own: the documentation of standard-library modules
(``pydoc``) and their source code, which every machine with Python has. The report gives, per layer and overall:

- coverage: the share of a layer's experts that covers 50% / 90% of its selections;
- locality: the share of a token's experts that the token before it selected too, and the reuse distance (tokens
  since the layer last selected the expert);
- an LRU cache of 10 / 25 / 50 / 80% of all experts (one cache for every layer, looked up token by token as a decode
  step looks it up): its hit rate;
- prediction: the recall of layer l+1's experts by layer l+1's router applied to layer l's router input (top-K, and
  within the top 2K), the figure a prefetch of the next layer's experts is built on; and by distance, layer l+d's
  router on layer l's input for d = 1, 2, 3, 4, 6 (top-K), what a prefetch further ahead could count on;
- the MoE cache's device lookup (its CLOCK, :mod:`.cachesim`) of 10 / 25 / 50 / 80% of all experts replayed on the
  recording without and with that prefetch (as ``LLAMA_MOE_CACHE_PREDICT=2`` makes it: :data:`PREDICT_BUDGET`
  copies per layer at most): hit rates, the share of the misses the prefetch copied ahead, and the experts it copies
  per token, in all and for nothing;
- the headroom of a better policy: at the same sizes, the hit rates of LRU, the device lookup's CLOCK, the
  recency-frequency classes upstream moved to after our pin and Belady's optimum, which knows the future;
- with ``--victims``: the victim rules the device lookup could have (CLOCK, a use counter, upstream's classes, LRU)
  replayed without the prediction and with it one to three layers ahead (:func:`victim_table`), beside Belady's
  optimum: hit rates, and the experts copied and copied for nothing per token;
- with ``--compare``: the figures trained MoE models measure (:mod:`.routing_refs`, with their sources) beside this
  model's, for the family its regime stands for (a synthetic model's) or for every family.

The recording is :mod:`.capture`'s, the default text :mod:`.text`'s.

Public API: :func:`report`, :func:`format_report`, :func:`policies`, :func:`cache_hit_rates`,
:func:`prediction_recall`, :func:`recall_by_distance`, :func:`victim_table`, :func:`format_victims`; :func:`record`,
:class:`Recording` and :func:`stdlib_text` from the modules they live in.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from pyllama_moe.tools.capture import Recording, record
from pyllama_moe.tools.text import stdlib_text

__all__ = ["CACHE_FRACTIONS", "RECALL_DISTANCES", "Recording", "cache_hit_rates", "format_report", "policies",
           "prediction_recall", "recall_by_distance", "record", "report", "stdlib_text", "victim_table",
           "format_victims"]

CACHE_FRACTIONS = (0.10, 0.25, 0.50, 0.80)
# the prediction replayed as the device makes it with LLAMA_MOE_CACHE_PREDICT=2: at most 2 copies per layer and token
PREDICT_BUDGET = 2
# the distances (in layers) the report gives the stale gate's recall for: layer l+d's router on layer l's input
RECALL_DISTANCES = (1, 2, 3, 4, 6)
# --victims: the device lookup's victim rules replayed without the prediction (depth 0) and with it 1..3 layers ahead
# (PREDICT_BUDGET copies per layer), and those of VICTIM_SOFT also with the softer protection of what was predicted
# (docs/routing.md, "Victim rules and the prediction ahead")
VICTIM_RULES = ("clock", "freq2", "classes", "lru")
VICTIM_SOFT = ("clock", "classes")
VICTIM_DEPTHS = (0, 1, 2, 3)


# ---------------------------------------------------------------- statistics (numpy only)


def coverage(sel: npt.NDArray[np.int32], n_expert: int, share: float) -> float:
    """The share of the experts that covers ``share`` of the selections (the most selected first)."""
    counts = np.sort(np.bincount(sel.ravel(), minlength=n_expert))[::-1]
    need = share * counts.sum()
    return float((np.searchsorted(np.cumsum(counts), need) + 1) / n_expert)


def consecutive_overlap(sel: npt.NDArray[np.int32]) -> float:
    """The mean share of a token's experts that the token before it selected too."""
    if len(sel) < 2:
        return 0.0
    k = sel.shape[1]
    same = [len(set(a) & set(b)) / k for a, b in zip(sel[1:].tolist(), sel[:-1].tolist(), strict=True)]
    return float(np.mean(same))


def reuse_distance(sel: npt.NDArray[np.int32]) -> float:
    """The median number of tokens since the layer last selected the expert (first uses not counted)."""
    last: dict[int, int] = {}
    dist = []
    for t, row in enumerate(sel.tolist()):
        for e in row:
            if e in last:
                dist.append(t - last[e])
            last[e] = t
    return float(np.median(dist)) if dist else float("nan")


def lru_hit_rate(rec: Recording, fraction: float) -> float:
    """Hits / lookups of one LRU cache over every layer's experts holding ``fraction`` of them, looked up token by
    token and layer by layer (the distinct experts of a token in a layer, as a decode step)."""
    capacity = max(1, int(round(fraction * rec.n_expert * len(rec.layers))))
    cache: OrderedDict[tuple[int, int], None] = OrderedDict()
    hits = lookups = 0
    n_tokens = len(next(iter(rec.topk.values())))
    for t in range(n_tokens):
        for il in rec.layers:
            for e in set(rec.topk[il][t].tolist()):
                key = (il, e)
                lookups += 1
                if key in cache:
                    hits += 1
                    cache.move_to_end(key)
                else:
                    cache[key] = None
                    if len(cache) > capacity:
                        cache.popitem(last=False)
    return hits / lookups if lookups else 0.0


def prediction_recall(rec: Recording, routers: dict[int, npt.NDArray[np.float32]], distance: int = 1
                      ) -> dict[int, tuple[float, float]]:
    """Per layer l+d (``d``: ``distance``): the recall of its selected experts by the top-K and the top-2K of its
    router applied to layer l's router input (``routers[il]``: ``[n_expert, n_embd]``), the stale gate of a prefetch
    ``d`` layers ahead."""
    if distance < 1:
        raise ValueError(f"distance must be at least 1, got {distance}")
    out = {}
    for a in rec.layers:
        b = a + distance
        if b not in rec.topk or a not in rec.router_in or b not in routers:
            continue
        k = rec.topk[b].shape[1]
        logits = rec.router_in[a] @ routers[b].T  # [n_tokens, n_expert]
        order = np.argsort(-logits, axis=1)
        truth = rec.topk[b]
        r1 = np.mean([len(set(p[:k]) & set(tr)) / k for p, tr in zip(order.tolist(), truth.tolist(), strict=False)])
        r2 = np.mean([len(set(p[:2 * k]) & set(tr)) / k
                      for p, tr in zip(order.tolist(), truth.tolist(), strict=False)])
        out[b] = (float(r1), float(r2))
    return out


def recall_by_distance(rec: Recording, routers: dict[int, npt.NDArray[np.float32]],
                       distances: Sequence[int] = RECALL_DISTANCES) -> dict[str, float]:
    """Per distance ``d`` (as a string, the report's JSON key): the top-K recall of :func:`prediction_recall`
    averaged over the layers l+d it has; distances the model has no pair of layers for are left out."""
    out = {}
    for d in distances:
        per_layer = prediction_recall(rec, routers, d)
        if per_layer:
            out[str(d)] = float(np.mean([r[0] for r in per_layer.values()]))
    return out


def tensor_values(t: Any) -> npt.NDArray[np.float32]:
    """The values of a tensor of a ``gguf.GGUFReader`` (any type gguf-py dequantizes), in numpy order."""
    import gguf

    return np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(
        [int(d) for d in reversed(t.shape)])


def router_weights(model: str | Path) -> dict[int, npt.NDArray[np.float32]]:
    """Each layer's router (``ffn_gate_inp``) as ``[n_expert, n_embd]`` floats."""
    import gguf

    out = {}
    for t in gguf.GGUFReader(model).tensors:
        m = re.fullmatch(r"blk\.(\d+)\.ffn_gate_inp\.weight", t.name)
        if m:
            out[int(m.group(1))] = tensor_values(t)
    return out


def clock_with_prediction(rec: Recording, routers: dict[int, npt.NDArray[np.float32]],
                          fractions: Sequence[float] = CACHE_FRACTIONS) -> dict[str, dict[str, float]]:
    """Per cache size: the device lookup's hit rate replayed without and with the prediction, the share of the
    misses it copied ahead, the experts it copied per token and those it copied for nothing (:mod:`.cachesim`)."""
    from pyllama_moe.tools import cachesim

    predicted = cachesim.predicted_topk(rec.topk, rec.router_in, routers)
    out = {}
    for f in fractions:
        off = cachesim.simulate(rec.topk, rec.n_expert, f)
        on = cachesim.simulate(rec.topk, rec.n_expert, f, predicted, budget=PREDICT_BUDGET)
        n = max(on.n_tokens, 1)
        out[f"{int(f * 100)}%"] = {"hit_rate": off.hit_rate, "hit_rate_predicted": on.hit_rate,
                                   "misses_predicted": on.misses_predicted, "predicted_per_token": on.predicted / n,
                                   "wasted_per_token": on.wasted / n}
    return out


def policies(rec: Recording, fractions: Sequence[float] = CACHE_FRACTIONS) -> dict[str, dict[str, float]]:
    """Per cache size: the hit rates of LRU, the device lookup's CLOCK, upstream's recency-frequency classes and
    Belady's optimum (:mod:`.cachesim`) on the same lookups."""
    from pyllama_moe.tools import cachesim

    others = cachesim.policies(rec.topk, rec.n_expert, fractions)
    return {k: {"lru": lru_hit_rate(rec, f), **others[k]} for f, k in zip(fractions, others, strict=True)}


def victim_table(rec: Recording, routers: dict[int, npt.NDArray[np.float32]],
                 fractions: Sequence[float] = CACHE_FRACTIONS) -> dict[str, dict[str, dict[str, float]]]:
    """Per cache size, per setting of :data:`VICTIM_RULES` by :data:`VICTIM_DEPTHS` (and :data:`VICTIM_SOFT` with the
    ``pin+ref`` protection): the hit rate, the experts copied and copied for nothing per token
    (:func:`.cachesim.victims`), beside Belady's optimum."""
    from pyllama_moe.tools import cachesim

    ahead = cachesim.predicted_ahead(rec.topk, rec.router_in, routers, max(VICTIM_DEPTHS))
    settings = [cachesim.Setting(v, d, PREDICT_BUDGET) for d in VICTIM_DEPTHS for v in VICTIM_RULES]
    settings += [cachesim.Setting(v, d, PREDICT_BUDGET, "pin+ref") for v in VICTIM_SOFT for d in VICTIM_DEPTHS if d]
    return cachesim.victims(rec.topk, rec.n_expert, fractions, settings, ahead)


def format_victims(table: dict[str, dict[str, dict[str, float]]]) -> str:
    """:func:`victim_table` as a table: a row per setting, a column per cache size (hit rate / copies / wasted)."""
    sizes = list(table)
    names = list(next(iter(table.values()))) if table else []
    lines = ["| victim rule, prediction | " + " | ".join(f"{k}: hit rate / copies / wasted a token" for k in sizes)
             + " |", "|---" * (len(sizes) + 1) + "|"]
    for name in names:
        cells = []
        for k in sizes:
            v = table[k][name]
            extra = f" / {v['copies']:.1f} / {v['wasted']:.1f}" if "copies" in v else ""
            cells.append(f"{v['hit_rate']:.1%}{extra}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report(rec: Recording, routers: dict[int, npt.NDArray[np.float32]] | None = None) -> dict[str, Any]:
    """The statistics of the module docstring, per layer and overall (means over the layers)."""
    per_layer = {}
    for il in rec.layers:
        sel = rec.topk[il]
        per_layer[il] = {"cover50": coverage(sel, rec.n_expert, 0.5), "cover90": coverage(sel, rec.n_expert, 0.9),
                         "overlap": consecutive_overlap(sel), "reuse": reuse_distance(sel)}
    pred = prediction_recall(rec, routers) if routers else {}
    for il, (r1, r2) in pred.items():
        per_layer[il]["recall_k"], per_layer[il]["recall_2k"] = r1, r2
    overall: dict[str, Any] = {k: float(np.nanmean([v[k] for v in per_layer.values()]))
                               for k in ("cover50", "cover90", "overlap", "reuse")}
    if pred:
        overall["recall_k"] = float(np.mean([r[0] for r in pred.values()]))
        overall["recall_2k"] = float(np.mean([r[1] for r in pred.values()]))
        overall["recall_by_distance"] = recall_by_distance(rec, routers or {})
    overall["policies"] = policies(rec)
    overall["lru"] = {k: v["lru"] for k, v in overall["policies"].items()}
    if routers:
        overall["clock"] = clock_with_prediction(rec, routers)
    n_tokens = len(next(iter(rec.topk.values()))) if rec.topk else 0
    k = next(iter(rec.topk.values())).shape[1] if rec.topk else 0
    return {"n_tokens": n_tokens, "n_layers": len(rec.layers), "n_expert": rec.n_expert, "n_expert_used": k,
            "overall": overall, "layers": per_layer}


def cache_hit_rates(model: str | Path, tokens: Sequence[int], fractions: Sequence[float] = CACHE_FRACTIONS
                    ) -> dict[str, dict[str, float]]:
    """The MoE cache's own hit rates (GPU) on ``tokens`` decoded one at a time, experts in pinned host memory and a
    cache of each fraction of them: the device lookup (CLOCK) and the host LRU
    (``LLAMA_MOE_CACHE_DEVICE=0``). Counted after the first 32 tokens (the cache fills). Empty without a GPU."""
    from pyllama_moe import Llama, backend
    from pyllama_moe.gguf_info import GGUFInfo

    if not backend.gpu_available():
        return {}
    mib = GGUFInfo.read(model).expert_bytes >> 20
    out: dict[str, dict[str, float]] = {}
    for f in fractions:
        row = {}
        for path, device in (("device", "1"), ("host", "0")):
            old = os.environ.get("LLAMA_MOE_CACHE_DEVICE")
            os.environ["LLAMA_MOE_CACHE_DEVICE"] = device  # read when the context makes its cache
            try:
                with Llama(str(model), n_ctx=len(tokens) + 8, n_gpu_layers=-1, cpu_moe=True, load_mode="none",
                           moe_cache_mib=max(1, int(f * mib)), verbose=False) as llm:
                    kind = "device" if device == "1" else "small"
                    for i, t in enumerate(tokens):
                        if i == 32:
                            before = llm.moe_cache_stats()
                        llm.eval([t])
                    after = llm.moe_cache_stats()
            finally:
                if old is None:
                    os.environ.pop("LLAMA_MOE_CACHE_DEVICE", None)
                else:
                    os.environ["LLAMA_MOE_CACHE_DEVICE"] = old
            assert before is not None and after is not None
            hits, misses = (after - before).hits(kind)
            row[path] = hits / (hits + misses) if hits + misses else 0.0
        out[f"{int(f * 100)}%"] = row
    return out


def format_report(rep: dict[str, Any]) -> str:
    o = rep["overall"]
    lines = [f"routing of {rep['n_tokens']} tokens, {rep['n_layers']} MoE layers, {rep['n_expert_used']} of "
             f"{rep['n_expert']} experts", "",
             "| layer | experts for 50% | experts for 90% | overlap with the token before | median reuse distance "
             "| recall of the next layer (top-K / top-2K) |", "|---|---|---|---|---|---|"]

    def row(name: str, v: dict[str, Any]) -> str:
        rec = f"{v['recall_k']:.1%} / {v['recall_2k']:.1%}" if "recall_k" in v else "-"
        return (f"| {name} | {v['cover50']:.1%} | {v['cover90']:.1%} | {v['overlap']:.1%} | {v['reuse']:.1f} tokens "
                f"| {rec} |")

    for il, v in rep["layers"].items():
        lines.append(row(str(il), v))
    lines.append(row("all (mean)", o))
    if o.get("recall_by_distance"):
        lines += ["", "layer l+d's router on layer l's input (a prediction d layers ahead), top-K recall: " +
                  ", ".join(f"d = {d} {v:.1%}" for d, v in o["recall_by_distance"].items())]
    lines += ["", "LRU cache of all layers' experts, hit rate: " +
              ", ".join(f"{k} of the experts {v:.1%}" for k, v in o["lru"].items())]
    if o.get("policies"):
        lines += ["", "| cache | LRU | CLOCK (the device lookup) | recency-frequency classes (upstream) "
                  "| Belady's optimum |",
                  "|---|---|---|---|---|"]
        lines += [f"| {k} | {v['lru']:.1%} | {v['clock']:.1%} | {v['class_lru']:.1%} | {v['belady']:.1%} |"
                  for k, v in o["policies"].items()]
        lines.append("")
    if o.get("clock"):
        lines.append("the device lookup replayed (CLOCK), hit rate without / with the prediction, misses predicted, "
                     "experts prefetched / wasted per token: " +
                     ", ".join(f"{k} {v['hit_rate']:.1%} / {v['hit_rate_predicted']:.1%}, {v['misses_predicted']:.1%}, "
                               f"{v['predicted_per_token']:.1f} / {v['wasted_per_token']:.1f}"
                               for k, v in o["clock"].items()))
    if rep.get("cache"):
        lines.append("the MoE cache itself (GPU, after 32 tokens), hit rate device lookup / host LRU: " +
                     ", ".join(f"{k} {v['device']:.1%} / {v['host']:.1%}" for k, v in rep["cache"].items()))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pyllama_moe routing", description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--text", type=Path, help="a text file (default: Python's standard-library documentation and code)")
    ap.add_argument("--tokens", type=int, default=4096, help="tokens of the text to evaluate (default 4096)")
    ap.add_argument("--ngl", type=int, default=0, help="layers on the GPU (default 0: the CPU)")
    ap.add_argument("--json", type=Path, help="write the report as JSON too")
    ap.add_argument("--cache", action="store_true",
                    help="also decode the tokens through the MoE cache of each size (GPU): its own hit rates")
    ap.add_argument("--victims", action="store_true",
                    help="also replay the device lookup's victim rules with the prediction 0-3 layers ahead (slow: "
                         "minutes per thousand tokens)")
    ap.add_argument("--compare", action="store_true",
                    help="print what trained MoE models measure beside this model's figures (the family of its "
                         "calibrated regime, or every family)")
    args = ap.parse_args(argv)

    from pyllama_moe import Llama

    text = args.text.read_text() if args.text else stdlib_text()
    with Llama(str(args.model), vocab_only=True, verbose=False) as tok:
        tokens = tok.tokenize(text.encode(), add_bos=True)[: args.tokens]
    rec = record(args.model, tokens, n_gpu_layers=args.ngl)
    rep = report(rec, router_weights(args.model))
    if args.cache:
        rep["cache"] = cache_hit_rates(args.model, tokens)
    print(format_report(rep))
    if args.victims:
        rep["victims"] = victim_table(rec, router_weights(args.model))
        print()
        print(format_victims(rep["victims"]))
    if args.compare:
        from pyllama_moe.gguf_info import GGUFInfo
        from pyllama_moe.tools import routing_refs

        regime = GGUFInfo.read(args.model).meta.get("pyllama_moe.synth.routing", "")
        print()
        print(routing_refs.format_compare(rep, (regime,) if regime in routing_refs.REFERENCES
                                          else tuple(routing_refs.REFERENCES)))
    if args.json:
        args.json.write_text(json.dumps(rep, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
