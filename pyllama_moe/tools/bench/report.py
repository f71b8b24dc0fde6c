"""The bench's results: one :class:`Row` per measurement, the checks across switch settings (hashes that must not
differ, decisions that must equal upstream's) and the markdown tables (the measurements; --draft's generation)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from typing import Any

from pyllama_moe.tools.bench.matrix import PRISTINE, UPSTREAM, setup_named, upstream_switches


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
    label: str = ""  # the column, where it is not named by the token counts (--draft's generation: generate_label)
    trace: dict[str, Any] = dataclasses.field(default_factory=dict)  # --trace: gpu_trace.TraceSummary of the timed part
    ttft_s: float = 0.0  # a prompt's row: its time and one decoded token's (0: no token measured; --ttft's table)


def mismatches(rows: Iterable[Row]) -> list[str]:
    """Setups whose hashes differ between switch settings (results a kill switch must not change)."""
    seen: dict[tuple[str, str], dict[str, str]] = {}
    for r in rows:
        if r.digest:
            seen.setdefault((r.setup, column(r)), {})[switch_label(r.switches)] = r.digest
    return [f"MISMATCH {setup} {col}: " + ", ".join(f"{sw} -> {d}" for sw, d in by_sw.items())
            for (setup, col), by_sw in seen.items() if len(set(by_sw.values())) > 1]


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


def switch_label(switches: dict[str, str]) -> str:
    """How a switch setting is shown: ``-`` for none, ``upstream`` for every kill switch at 0, ``pristine`` for
    the tools of an unpatched build (--pristine)."""
    if switches and switches == upstream_switches():
        return UPSTREAM
    if switches == PRISTINE:
        return "pristine"
    return ",".join(f"{k}={v}" for k, v in sorted(switches.items())) or "-"


def column(r: Row) -> str:
    if r.label:
        return r.label
    if r.n_prompt and r.n_gen:  # --first: the tokens that continue the prompt
        return f"tg{r.n_gen} after pp{r.n_prompt}"
    return f"pp{r.n_prompt} ub{r.n_ubatch}" if r.n_prompt else f"tg{r.n_gen}"


def generate_label(n: int, prompt: str, draft: int = 0, drafted_by: str = "lookup") -> str:
    """The label of a --draft generation row: ``gen<n> <prompt>``, with a draft ``draft <size> <drafted by>``
    appended (``lookup``, ``forced``, ``wrong``, with ``-adapt``: :data:`.draft.RUNS`, :data:`.draft.BOUNDS`);
    :func:`generate_parts` reads it."""
    return f"gen{n} {prompt}" + (f" draft {draft} {drafted_by}" if draft else "")


def generate_parts(label: str) -> tuple[str, int, str]:
    """The prompt, draft size (0: none) and drafter of a :func:`generate_label`."""
    parts = label.split()
    return parts[1], int(parts[3]) if len(parts) > 3 else 0, parts[4] if len(parts) > 4 else "-"


HYBRID_HEAD = ("CPU experts/token", "CPU ms/token", "PCIe ms/token (est.)")


def hybrid_cells(tg: dict[str, float]) -> list[str]:
    """The hybrid decode's columns of a row's timed decode (``cache["tg"]``, :func:`.api.decode_hits`): the experts
    the CPU computed per token, its busy milliseconds per token, and PCIe's busy milliseconds per token, an estimate:
    the experts uploaded per token (the misses and the prediction's copies) times the upload time per expert that
    the context measured when it was made. ``-`` without the figures (no cache, a native row)."""
    if "host_per_token" not in tg:
        return ["-"] * len(HYBRID_HEAD)
    return [f"{tg['host_per_token']:.2f}", f"{tg['host_ms_per_token']:.3f}", f"{tg['pcie_ms_per_token']:.3f}"]


def _hybrid_ran(rows: Iterable[Row]) -> bool:
    """Whether a row asked for the hybrid decode (a ``-hybrid`` or ``-auto`` setup) or had it on: the table then
    has its columns, for every row (the cache alone beside it, for the PCIe time it costs)."""
    return any(((s := setup_named(r.setup)) is not None and s.hybrid is not None)
               or bool(r.cache.get("tg", {}).get("host_max")) for r in rows)


def table(rows: Iterable[Row]) -> str:
    """One line per setup and switch setting, one column per measurement, cache statistics last (--draft's
    generation rows have a table of their own: :func:`draft_table`); where the hybrid decode ran, its columns after
    them (:func:`hybrid_cells`)."""
    rows = [r for r in rows if "generate" not in r.cache]
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
        tg = r.cache.get("tg")
        if tg:  # the hit rate of the timed decode itself (the log's figures are the whole run's)
            pred = ""
            if tg.get("predicted"):  # the misses the prediction hid, the MiB it copied for nothing per token
                wasted = tg["wasted_mib"] / max(r.n_gen, 1)
                pred = f", {tg['hidden']:.1f}% of misses predicted, {wasted:.1f} MiB wasted/token"
            cell["cache"] = "; ".join(c for c in (f"tg {tg['hit_rate']:.1f}% hits{pred}", cell.get("cache")) if c)
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
        if tg and "host_per_token" in tg:
            cell.update(zip(HYBRID_HEAD, hybrid_cells(tg), strict=True))
    head = ["setup", "switches", "via", *cols, "cache (decode)", "prefetch staging", "prompt copies per ubatch"]
    first = any("first" in cell for cell in lines.values())
    if first:
        head.append("tokens after the prompt")
    hybrid = HYBRID_HEAD if _hybrid_ran(rows) else ()
    head += hybrid
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (setup, sw, via), cell in lines.items():
        extra = [cell.get("first", "-")] if first else []
        extra += [cell.get(h, "-") for h in hybrid]
        out.append("| " + " | ".join([setup, sw, via, *[cell.get(c, "-") for c in cols], cell.get("cache", "-"),
                                      cell.get("prefetch", "-"), cell.get("prompt", "-"), *extra]) + " |")
    return "\n".join(out)


DRAFT_HEAD = ("setup", "switches", "prompt", "draft", "drafted by", "tokens/s", "vs no draft", "tokens/decode",
              "accepted", "misses/decode", "misses/token", "host lookups", "same text")


def draft_table(rows: Iterable[Row]) -> str:
    """--draft's generation: one line per setup, switch setting, prompt and draft size (0: none); empty without such
    rows. Accepted: the share of the proposed draft tokens that the greedy verification kept, and how many were
    proposed; misses: the MoE cache's, of all lookups; host lookups: the experts looked up on the host (a verification
    ubatch past the device lookup's size); same text: the text of the run without a draft. Drafted by: prompt lookup,
    or (--draft-bounds) the text generated without a draft, teacher-forced (all accepted), or other tokens (all
    rejected)."""
    gen = [r for r in rows if "generate" in r.cache]
    if not gen:
        return ""
    plain = {(r.setup, switch_label(r.switches), generate_parts(r.label)[0]): r.tokens_per_s
             for r in gen if not generate_parts(r.label)[1]}

    def num(g: dict[str, float], key: str, fmt: str) -> str:
        return format(g[key], fmt) if key in g else "-"

    out = ["| " + " | ".join(DRAFT_HEAD) + " |", "|" + "---|" * len(DRAFT_HEAD)]
    for r in gen:
        g, sw = r.cache["generate"], switch_label(r.switches)
        prompt, draft, drafted_by = generate_parts(r.label)
        base = plain.get((r.setup, sw, prompt))
        vs = f"{r.tokens_per_s / base:.2f}x" if draft and base else "-"
        accepted = "-"
        if draft and g["proposed"]:
            accepted = f"{100 * g['accepted'] / g['proposed']:.0f}% of {g['proposed']:.0f}"
        elif draft:
            accepted = "none proposed"
        out.append("| " + " | ".join([r.setup, sw, prompt, str(draft), drafted_by, f"{r.tokens_per_s:.1f}", vs,
                                      f"{g['tokens_per_decode']:.2f}", accepted, num(g, "misses_per_decode", ".1f"),
                                      num(g, "misses_per_token", ".1f"), num(g, "host_lookups", ".0f"),
                                      "yes" if g["same_text"] else "NO"]) + " |")
    return "\n".join(out)
