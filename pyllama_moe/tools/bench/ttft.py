"""``--ttft``: long prompts, each row's time to first token and prompt speed beside its PCIe bound.

A prompt of P tokens runs in ceil(P / U) ubatches of U tokens, and each ubatch uploads, over PCIe, the experts not
on the GPU: all of them with ``cpu_moe``, (1 - f) of them with a MoE cache of a fraction f (the cached ones come
device to device), none with everything on the GPU. The bound is the time those uploads take at the host-to-device
bandwidth: ``ceil(P / U) * upload bytes / bandwidth``; a prompt cannot run faster while its uploads are not hidden
by anything (upstream uploads only the experts a ubatch selects, so a ubatch that leaves some unused uploads less,
and its ratio can fall below 1). The ratio measured / bound is the prompt's time over the bound: 1.0 is a prompt
that PCIe alone paces.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable

from pyllama_moe.tools.bench.matrix import Setup, cache_mib_of, setup_named
from pyllama_moe.tools.bench.report import Row, switch_label

# llama.cpp's default ubatch (llama_context_default_params' n_ubatch; Llama's and llama-bench's default): --ttft
# runs it beside the ubatches of --ub
DEFAULT_UBATCH = 512
# the bound's host-to-device GB/s where no GPU is there to measure one: pinned copies on the H100s of
# docs/performance.md measured 54.3-55.4
DEFAULT_H2D_GBPS = 55.0


def upload_bytes(setup: Setup, expert_bytes: int) -> int | None:
    """The bytes a ubatch of ``setup`` uploads at most, on a model with ``expert_bytes`` bytes of experts: those
    not on the GPU (all with the experts in host memory, those beyond the MoE cache with one, none with everything
    on the GPU); None where the setup does not say (a dense model, a fit's placement)."""
    if setup.dense or setup.fit_gib:
        return None
    if not dict(setup.llama_kwargs).get("cpu_moe"):
        return 0
    return max(0, expert_bytes - (cache_mib_of(expert_bytes, setup) << 20))


def pcie_bound_s(n_prompt: int, n_ubatch: int, bytes_per_ubatch: int, gbps: float) -> float:
    """Seconds the uploads of a prompt of ``n_prompt`` tokens take in ubatches of ``n_ubatch`` tokens, each
    uploading ``bytes_per_ubatch`` bytes at ``gbps`` GB/s (10^9 bytes a second)."""
    return math.ceil(n_prompt / n_ubatch) * bytes_per_ubatch / (gbps * 1e9)


@dataclasses.dataclass
class TtftRow:
    """One prompt of one setup, switch setting and tool at one ubatch: its times beside its bound."""

    setup: str
    switches: str      # switch_label's
    via: str           # native or python
    tool: str
    n_prompt: int
    n_ubatch: int
    prompt_ts: float   # prompt tokens per second
    prompt_s: float
    ttft_s: float      # the prompt's time and one decoded token's (0: not measured)
    upload_mib: float | None  # per ubatch (None: the setup does not say)
    bound_s: float | None
    ratio: float | None       # prompt_s / bound_s (None: no bound, or nothing uploaded)


def ttft_rows(rows: Iterable[Row], expert_bytes: int, gbps: float) -> list[TtftRow]:
    """The prompt rows of ``rows`` (not the decode's, --first's or --draft's), with their bounds at ``gbps`` on a
    model with ``expert_bytes`` bytes of experts; by setup, switch setting and tool in their order, then by prompt
    and ubatch."""
    out: list[TtftRow] = []
    for r in rows:
        setup = setup_named(r.setup)
        if not r.n_prompt or r.n_gen or r.label or setup is None or r.tokens_per_s <= 0:
            continue
        up = upload_bytes(setup, expert_bytes)
        bound = None if up is None else pcie_bound_s(r.n_prompt, r.n_ubatch, up, gbps)
        prompt_s = r.n_prompt / r.tokens_per_s
        out.append(TtftRow(r.setup, switch_label(r.switches), "python" if r.tool == "python" else "native", r.tool,
                           r.n_prompt, r.n_ubatch, r.tokens_per_s, prompt_s, r.ttft_s,
                           None if up is None else up / 2**20, bound, prompt_s / bound if bound else None))
    order: dict[tuple[str, str, str], int] = {}
    for t in out:
        order.setdefault((t.setup, t.switches, t.via), len(order))
    return sorted(out, key=lambda t: (order[t.setup, t.switches, t.via], t.n_prompt, t.n_ubatch))


TTFT_HEAD = ("setup", "switches", "via", "prompt", "ubatch", "TTFT s", "prompt t/s", "upload MiB/ubatch",
             "PCIe bound s", "bound t/s", "measured / bound")


def ttft_table(trows: Iterable[TtftRow]) -> str:
    """One line per row of :func:`ttft_rows`; ``-`` where a figure does not apply (no bound: a dense or fit setup;
    no ratio: nothing uploaded)."""
    out = ["| " + " | ".join(TTFT_HEAD) + " |", "|" + "---|" * len(TTFT_HEAD)]
    for t in trows:
        bound_ts = t.n_prompt / t.bound_s if t.bound_s else None
        cells = [t.setup, t.switches, t.via, str(t.n_prompt), str(t.n_ubatch),
                 f"{t.ttft_s:.4g}" if t.ttft_s else "-", f"{t.prompt_ts:.1f}",
                 "-" if t.upload_mib is None else f"{t.upload_mib:.1f}",
                 "-" if t.bound_s is None else f"{t.bound_s:.4g}",
                 "-" if bound_ts is None else f"{bound_ts:.1f}",
                 "-" if t.ratio is None else f"{t.ratio:.2f}"]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)
