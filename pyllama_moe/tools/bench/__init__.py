"""``python -m pyllama_moe bench``: prompt and generation speed, setup by setup, side by side (see :mod:`.cli`).

Read as the steps of llama.cpp's ``llama-bench``: :mod:`.cli` (the options, the run of the matrix), :mod:`.matrix`
(the setups and switch settings), :mod:`.models` (the models and what their headers say), :mod:`.native` (the
native tools and their output), :mod:`.api` (the Python API's runs, each one a :mod:`.worker` process),
:mod:`.overhead` (the Python overhead per token), :mod:`.report` (rows, checks, the table), :mod:`.gpu_trace`
(what the GPU did, ``--trace``).
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

__all__ = [
    "DENSE_PRESETS",
    "KILL_SWITCHES",
    "PRISTINE",
    "SETUPS",
    "Row",
    "Setup",
    "api_measure",
    "cache_mib",
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
    "prompt_copies",
    "prompt_seeds",
    "routing_regime",
    "run_tool",
    "setup_named",
    "switch_label",
    "table",
    "tool_path",
    "upstream_differences",
    "upstream_switches",
    "write_model",
]
