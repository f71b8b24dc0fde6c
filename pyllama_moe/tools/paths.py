"""Where the tools keep what they make once and reuse: the user's cache folder."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/pyllama-moe`` (default ``~/.cache/pyllama-moe``), made if absent."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    d = Path(base) / "pyllama-moe"
    d.mkdir(parents=True, exist_ok=True)
    return d
