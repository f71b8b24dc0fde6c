"""Synthetic models for the Python API tests, written once per test session (about 43 MiB each)."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

_dir: Path | None = None
_cache: dict[tuple[str, float, int], Path] = {}


def model_path(arch: str = "qwen3moe", skew: float = 0.0, seed: int = 0) -> Path:
    """The tiny preset of ``arch``; the same file for the same arguments during the session."""
    global _dir
    key = (arch, skew, seed)
    if key not in _cache:
        from pyllama_moe import synth

        if _dir is None:
            _dir = Path(tempfile.mkdtemp(prefix="pyllama-moe-tests-"))
            atexit.register(shutil.rmtree, _dir, True)
        _cache[key] = synth.write_model(_dir / f"tiny-{arch}-{skew}-{seed}.gguf", "tiny", arch=arch, skew=skew,
                                        seed=seed)
    return _cache[key]
