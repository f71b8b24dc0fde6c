"""What trained MoE models measure on real text: the figures the calibrated routing regimes of ``synth`` are fitted to,
with their sources, and the comparison ``python -m pyllama_moe routing --compare`` prints.

Each regime stands for a family of models (``realistic``: Qwen3-30B-A3B; ``dispersed``: Mixtral-8x7B, Qwen2-57B-A14B
and the shared-expert models) and has a band per measure: the range the published figures of that family span at
the 30b-a3b expert topology (48 layers, 8 of 128 experts), interpolated where a paper measured other cache sizes.
"Cache" is a fraction of all routed experts; hit rates are of one LRU over every layer's experts, looked up token by
token (on a real Qwen3-30B-A3B trace global and per-layer LRU differ by 1-2 points, so the two compare directly).
"recall_k d=N" is the stale gate N layers ahead (layer l+N's router on layer l's router input, top-K recall): for the
Qwen3 family the engineering rule measured on Qwen3-class models (3.5 to 4 points less per further layer) applied to
the next layer's 88.6%; for the dispersed family, which no one has measured that far ahead, the same rule applied to
its next-layer band (a floor on how fast recall falls: spread routing is the less predictable).

Public API: :class:`Band`, :data:`REFERENCES`, :data:`SOURCES`, :func:`compare`, :func:`format_compare`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class Band:
    """One measure of a model family: its range and where the figures come from (keys of :data:`SOURCES`)."""

    measure: str  # a key of compare()'s figures: "lru 25%", "overlap", "cover90", "recall_k", "recall_k d=2"
    low: float
    high: float
    sources: tuple[str, ...]

    def holds(self, value: float) -> bool:
        return self.low <= value <= self.high


SOURCES: dict[str, str] = {
    "liang": "Liang et al., 'Not All Models Suit Expert Offloading: On Local Routing Consistency of MoE Models', "
             "arXiv 2505.16056 (per-layer LRU on 512-token samples of 11 sources; Qwen3-30B-A3B at "
             "6.25/12.5/18.75/25%: 47/65/75/about 83%, Belady 64/80/88/92%; Mixtral-8x7B 37/61/83% at 25/50/75%; "
             "Qwen2-57B-A14B 37/62% at 25/50%)",
    "imp": "the imp engine's Qwen3-30B-A3B decode traces (github kekzl/imp pulls 1359, 1360, 1374: 45% next-token "
           "reuse, median reuse distance 2 tokens; per-layer LRU 74% at 19%, 89% at 38%, 96% at 63.5%)",
    "bigmoe": "BigMoeOnEdge's replay of a real Qwen3-30B-A3B decode trace (github Helldez/BigMoeOnEdge: global LRU "
              "80% at 22%, 92% at 33%, 96% at 45%; stale-gate recall of the next layer's top-k 88.6%)",
    "handbook": "gpu-container's 'routing de-risk' handbook (Qwen3-30B-A3B: 51% of the experts cover 90% of a layer's "
                "selections on 1k tokens of mixed text, 45% on 8k tokens of Python)",
    "fate": "FATE, arXiv 2502.12224 (cross-layer recall of DeepSeek-class models about 79% training-free, about 97% "
            "with a wider candidate set)",
    "route-ahead": "BigMoeOnEdge's stale gate N layers back (github Helldez/BigMoeOnEdge docs/route-ahead.md, pull "
                   "142: Qwen3-class models about 85% one layer ahead and 3.5 to 4 points less per further layer; "
                   "Qwen3-30B-A3B 88.6% one layer ahead, pull 101, so by that rule about 84-85% two layers ahead and "
                   "about 81% three)",
    "colibri": "colibri 866 (OLMoE-1B-7B, a trained linear probe: 84.5% of the next layer's experts, 81.9% two "
               "layers ahead)",
}

REFERENCES: dict[str, tuple[str, tuple[Band, ...]]] = {
    "realistic": ("Qwen3-30B-A3B (48 layers, 8 of 128, no shared expert)", (
        Band("lru 10%", 0.55, 0.60, ("liang", "imp")),
        Band("lru 25%", 0.81, 0.86, ("liang", "imp", "bigmoe")),
        Band("lru 50%", 0.93, 0.97, ("imp", "bigmoe")),
        Band("lru 80%", 0.985, 0.997, ("imp",)),
        Band("overlap", 0.42, 0.47, ("imp", "bigmoe")),
        Band("cover90", 0.45, 0.51, ("handbook",)),
        Band("recall_k", 0.84, 0.90, ("bigmoe", "fate")),
        Band("recall_k d=2", 0.84, 0.86, ("route-ahead", "colibri")),
        Band("recall_k d=3", 0.80, 0.83, ("route-ahead",)),
    )),
    "dispersed": ("Mixtral-8x7B, Qwen2-57B-A14B (routing spread over the experts, shared experts)", (
        Band("lru 25%", 0.34, 0.40, ("liang",)),
        Band("lru 50%", 0.58, 0.64, ("liang",)),
        Band("lru 80%", 0.83, 0.88, ("liang",)),
        Band("recall_k", 0.75, 0.82, ("fate",)),
        # the next layer's band less 3.5 to 4 points per further layer
        Band("recall_k d=2", 0.71, 0.785, ("fate", "route-ahead")),
        Band("recall_k d=3", 0.67, 0.75, ("fate", "route-ahead")),
    )),
}


def figures(report: Mapping[str, Any]) -> dict[str, float]:
    """The measures of a routing report (:func:`pyllama_moe.tools.routing.report`) that the bands name."""
    o = report["overall"]
    out = {f"lru {k}": float(v) for k, v in o["lru"].items()}
    for key in ("overlap", "cover90", "recall_k", "recall_2k"):
        if key in o:
            out[key] = float(o[key])
    # the stale gate further ahead (the next layer's is recall_k)
    out.update({f"recall_k d={d}": float(v) for d, v in o.get("recall_by_distance", {}).items() if d != "1"})
    return out


def compare(report: Mapping[str, Any], regime: str) -> list[tuple[Band, float | None]]:
    """Each band of the family ``regime`` stands for, with the report's figure (None where it has none)."""
    got = figures(report)
    return [(b, got.get(b.measure)) for b in REFERENCES[regime][1]]


def format_compare(report: Mapping[str, Any], regimes: tuple[str, ...] = tuple(REFERENCES)) -> str:
    """Markdown tables: for each regime, its family's measured bands beside this report's figures."""
    lines = []
    for regime in regimes:
        family, _ = REFERENCES[regime]
        lines += ["", f"against {family}, the family the `{regime}` regime stands for:", "",
                  "| measure | measured (band) | this model | in the band | sources |", "|---|---|---|---|---|"]
        for band, value in compare(report, regime):
            ours = "-" if value is None else f"{value:.1%}"
            inside = "-" if value is None else ("yes" if band.holds(value) else "NO")
            lines.append(f"| {band.measure} | {band.low:.1%} - {band.high:.1%} | {ours} | {inside} | "
                         f"{', '.join(band.sources)} |")
    used = sorted({s for r in regimes for b in REFERENCES[r][1] for s in b.sources})
    lines += ["", "sources:"] + [f"- {s}: {SOURCES[s]}" for s in used]
    return "\n".join(lines).lstrip("\n")
