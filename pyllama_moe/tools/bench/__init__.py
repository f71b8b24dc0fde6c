"""``python -m pyllama_moe bench``: prompt and generation speed, setup by setup, side by side (see :mod:`.cli`).

Read as the steps of llama.cpp's ``llama-bench``: :mod:`.cli` (the options, the run of the matrix), :mod:`.matrix`
(the setups and switch settings), :mod:`.models` (the models and what their headers say), :mod:`.native` (the
native tools and their output), :mod:`.api` (the Python API's runs, each one a :mod:`.worker` process),
:mod:`.overhead` (the Python overhead per token), :mod:`.report` (rows, checks, the table), :mod:`.ttft` (long
prompts beside their PCIe bound, ``--ttft``), :mod:`.gpu_trace` (what the GPU did, ``--trace``).
"""

from __future__ import annotations

from pyllama_moe.tools.bench.api import api_measure, decode_hits, prompt_copies, prompt_seeds
from pyllama_moe.tools.bench.cli import main
from pyllama_moe.tools.bench.matrix import (
    KILL_SWITCHES,
    PRISTINE,
    SETUPS,
    Setup,
    cache_mib,
    cache_mib_of,
    fit_kwargs,
    setup_named,
    upstream_switches,
)
from pyllama_moe.tools.bench.models import DENSE_PRESETS, routing_regime, write_model
from pyllama_moe.tools.bench.native import (
    h2d_bandwidth,
    h2d_bandwidth_to,
    measure,
    parse_cache_stats,
    parse_decisions,
    parse_jsonl,
    run_tool,
    tool_path,
)
from pyllama_moe.tools.bench.overhead import overhead, overhead_table
from pyllama_moe.tools.bench.report import Row, column, mismatches, switch_label, table, upstream_differences
from pyllama_moe.tools.bench.ttft import (
    DEFAULT_H2D_GBPS,
    DEFAULT_UBATCH,
    TtftRow,
    pcie_bound_s,
    ttft_rows,
    ttft_table,
    upload_bytes,
)

__all__ = [
    "DEFAULT_H2D_GBPS",
    "DEFAULT_UBATCH",
    "DENSE_PRESETS",
    "KILL_SWITCHES",
    "PRISTINE",
    "SETUPS",
    "Row",
    "Setup",
    "TtftRow",
    "api_measure",
    "cache_mib",
    "cache_mib_of",
    "column",
    "decode_hits",
    "fit_kwargs",
    "h2d_bandwidth",
    "h2d_bandwidth_to",
    "main",
    "measure",
    "mismatches",
    "overhead",
    "overhead_table",
    "parse_cache_stats",
    "parse_decisions",
    "parse_jsonl",
    "pcie_bound_s",
    "prompt_copies",
    "prompt_seeds",
    "routing_regime",
    "run_tool",
    "setup_named",
    "switch_label",
    "table",
    "tool_path",
    "ttft_rows",
    "ttft_table",
    "upstream_differences",
    "upload_bytes",
    "upstream_switches",
    "write_model",
]
