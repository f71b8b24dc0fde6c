"""The one lookup of the package's files: its compiled parts, ``data/`` (vocabularies), ``bin/`` (native programs).

A source checkout run with ``python -m`` from the repository root has no compiled parts: they are then taken
from the installed copy of the package, which ``pyllama_moe.__init__`` appends to the package's ``__path__``.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


@functools.cache
def installed_copy() -> Path | None:
    """The installed copy of the package when this folder is a source checkout without compiled parts."""
    if any(HERE.glob("_cffi.*")):
        return None
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        installed = Path(str(distribution("pyllama-moe").locate_file("pyllama_moe"))).resolve()
    except (PackageNotFoundError, OSError):
        return None
    return installed if installed != HERE and installed.is_dir() else None


def package_dirs() -> list[Path]:
    """The folders the package's files are looked up in, in order: the package's ``__path__`` (this folder, and the
    installed copy that ``__init__`` appends to a source checkout's)."""
    return [Path(d) for d in sys.modules["pyllama_moe"].__path__]


def package_file(*parts: str) -> Path | None:
    """The first ``pyllama_moe/<parts>`` that is a file in the package's folders, None if there is none."""
    for d in package_dirs():
        p = d.joinpath(*parts)
        if p.is_file():
            return p
    return None


def data_file(name: str) -> Path:
    """A file installed under ``pyllama_moe/data`` (e.g. the qwen2 vocabulary)."""
    p = package_file("data", name)
    if p is None:
        raise FileNotFoundError(f"pyllama_moe/data/{name} is not installed; build and install the package (README.md)")
    return p


def bin_file(name: str) -> Path:
    """A native program installed under ``pyllama_moe/bin`` (upstream's tools of this build)."""
    p = package_file("bin", name)
    if p is None:
        raise FileNotFoundError(f"{name} is not installed (build with -DPYLLAMA_MOE_TOOLS=ON, the default)")
    return p
