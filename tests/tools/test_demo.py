"""The README's main job: python -m pyllama_moe demo, on a fresh cache folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_demo_runs_and_reports(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    res = subprocess.run([sys.executable, "-m", "pyllama_moe", "demo", "--tokens", "8"], capture_output=True,
                         text=True, env=env, timeout=300, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    out = res.stdout
    assert (tmp_path / "pyllama-moe" / "demo-tiny-qwen3moe.gguf").is_file()  # made once, cached
    assert "generated (8 tokens" in out
    assert "model buffer size" in out  # where the weights went
    assert "moe cache: " in out  # what the cache did, or that the CPU has none
    assert res.stderr == ""  # llama.cpp's log only with -v
    again = subprocess.run([sys.executable, "-m", "pyllama_moe", "demo", "--tokens", "8"], capture_output=True,
                           text=True, env=env, timeout=300, cwd=tmp_path)
    assert again.returncode == 0
    # greedy on the same cached model: the same text
    assert again.stdout.split("generated")[1].split(":", 1)[1] == out.split("generated")[1].split(":", 1)[1]


def test_cache_summary() -> None:
    from pyllama_moe import MoeCacheStats
    from pyllama_moe.tools.demo import cache_summary

    assert cache_summary(None).startswith("moe cache: none (CPU only")
    stats = MoeCacheStats(hits_large=2, misses_large=2, bytes_large=2**20, hits_device=4, n_copied=5, bytes_copied=9)
    assert cache_summary(stats) == "moe cache: 6 hits, 2 misses (75.0% hit), 1.0 MiB uploaded"
    assert "(0.0% hit)" in cache_summary(MoeCacheStats())
