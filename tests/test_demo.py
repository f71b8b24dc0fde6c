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
    assert res.stderr == ""  # llama.cpp's log only with -v
    again = subprocess.run([sys.executable, "-m", "pyllama_moe", "demo", "--tokens", "8"], capture_output=True,
                           text=True, env=env, timeout=300, cwd=tmp_path)
    assert again.returncode == 0
    # greedy on the same cached model: the same text
    assert again.stdout.split("generated")[1].split(":", 1)[1] == out.split("generated")[1].split(":", 1)[1]
