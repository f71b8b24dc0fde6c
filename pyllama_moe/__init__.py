"""pyllama-moe: llama-cpp-python's ``Llama`` over a patched llama.cpp, fast for MoE models with experts in host
memory."""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path
from typing import Any


def _version() -> str:
    """The installed distribution's version (e.g. ``0.1.0+b11549.p20.cu13``; pyproject.toml's in a source checkout)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pyllama-moe")
    except PackageNotFoundError:
        return "0+unknown"


__version__ = _version()

# what ``from pyllama_moe import *`` gives besides the names of ``_STAR`` and ``_SUBMODULES``: ``__all__`` itself is
# built on first use (module ``__getattr__``), since the low-level names are known only once the native library is
# loaded
_PUBLIC = [
    "AdaptiveDraft", "ClosedError", "ContextError", "DecodeError", "Llama", "LlamaCache", "LlamaDiskCache",
    "LlamaError", "LlamaGrammar", "LlamaRAMCache", "LlamaState", "LlamaTokenizer", "LogitsProcessorList",
    "ModelLoadError", "MoeCacheStats", "StoppingCriteriaList", "__version__", "bin_file", "data_file",
]

# llama-cpp-python's public names, imported on first use (``import pyllama_moe`` stays cheap and
# loads no native code)
_LAZY = {
    "AdaptiveDraft": "pyllama_moe.draft_adapt",
    "Llama": "pyllama_moe.llama",
    "LlamaGrammar": "pyllama_moe.grammar",
    "MoeCacheStats": "pyllama_moe.moe",
    "LlamaState": "pyllama_moe.llama_types",
    "LogitsProcessorList": "pyllama_moe.llama_types",
    "StoppingCriteriaList": "pyllama_moe.llama_types",
    "LlamaRAMCache": "pyllama_moe.cache",
    "LlamaCache": "pyllama_moe.cache",
    "LlamaDiskCache": "pyllama_moe.cache",
    "LlamaTokenizer": "pyllama_moe.vocab",
    "LlamaError": "pyllama_moe.errors",
    "ModelLoadError": "pyllama_moe.errors",
    "ContextError": "pyllama_moe.errors",
    "DecodeError": "pyllama_moe.errors",
    "ClosedError": "pyllama_moe.errors",
}


# the rest of what llama-cpp-python's ``from llama_cpp import *`` gives: its typed dicts (``llama_types``), the draft
# models and the low-level llama.h names (``llama_cpp``), looked up in that order
_STAR = ("pyllama_moe.llama_types", "pyllama_moe.llama_speculative", "pyllama_moe.llama_cpp")

# llama-cpp-python's submodules that ``import llama_cpp`` binds (its ``__init__`` imports them): attributes of the
# package on first use, as ``pyllama_moe.llama_cpp.llama_backend_init()`` is written
_SUBMODULES = ("llama", "llama_cache", "llama_chat_format", "llama_cpp", "llama_grammar", "llama_speculative",
               "llama_tokenizer", "llama_types", "mtmd_cpp")


def _own_names(mod: Any) -> list[str]:
    """The public names of a module without ``__all__``, less those it imports from outside the package (``Any``,
    ``np``)."""
    out = []
    for name, value in vars(mod).items():
        if name.startswith("_") or isinstance(value, type(sys)):
            continue
        home = sys.modules.get(getattr(value, "__module__", None) or "")
        if home is not None and home is not mod and not home.__name__.startswith("pyllama_moe") \
                and getattr(home, name, None) is value:
            continue
        out.append(name)
    return out


def _star_names() -> list[str]:
    """``__all__``: what ``from llama_cpp import *`` gives (its public names, the low-level ones included)."""
    import importlib

    names = dict.fromkeys([*_PUBLIC, *_SUBMODULES])
    for star in _STAR:
        mod = importlib.import_module(star)
        names.update(dict.fromkeys(getattr(mod, "__all__", None) or _own_names(mod)))
    return list(names)


def __getattr__(name: str) -> Any:
    import importlib
    import importlib.util

    module = _LAZY.get(name)
    if module is not None:
        return getattr(importlib.import_module(module), name)
    if name in _SUBMODULES:
        return importlib.import_module(f"pyllama_moe.{name}")  # the import binds it here too
    if name == "__all__":
        globals()["__all__"] = names = _star_names()
        return names
    if not name.startswith("_") and importlib.util.find_spec(f"pyllama_moe.{name}") is None:
        # (a submodule not imported yet is not looked for in _STAR: ``from pyllama_moe import backend`` then imports
        # it without loading the low-level module)
        for star in _STAR:
            mod = importlib.import_module(star)
            if hasattr(mod, name):
                globals()[name] = value = getattr(mod, name)  # found once: llama_decode in a loop stays cheap
                return value
    raise AttributeError(f"module 'pyllama_moe' has no attribute {name!r}")


def _use_installed_native_parts() -> None:
    """Let a source checkout find the compiled parts of the installed copy.

    ``python -m pyllama_moe`` run from the repository root imports this source folder (the current
    directory comes first on sys.path), which has no compiled module, libraries or data: those are
    then taken from the installed copy of the package, as an editable install would.
    """
    from pyllama_moe._resources import installed_copy

    copy = installed_copy()
    if copy is not None:
        __path__.append(str(copy))


_use_installed_native_parts()


def _preload_cxx_runtime() -> None:
    """Put libstdc++ in the process's global symbol scope before llama.cpp's libraries load.

    libggml-cuda.so (CUDA 13 build) defines its own copies of libstdc++ symbols. Python loads
    extensions with RTLD_LOCAL, so libllama bound some libstdc++ calls (std::ostream inserters) to
    those copies and crashed in llama_model::print_info. A C++ program has libstdc++ in its global
    scope, which every lookup searches first; this gives Python the same order.
    """
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libstdc++.so.6", mode=ctypes.RTLD_GLOBAL)
        except OSError:  # pragma: no cover - a toolchain without libstdc++ (clang + libc++)
            pass


# before any submodule can load the compiled module (pyllama_moe._cffi and its libraries)
_preload_cxx_runtime()


def data_file(name: str) -> Path:
    """A file installed under ``pyllama_moe/data`` (e.g. the qwen2 vocabulary)."""
    from pyllama_moe._resources import data_file as find

    return find(name)


def bin_file(name: str) -> Path:
    """A native program installed under ``pyllama_moe/bin`` (upstream's tools of this build)."""
    from pyllama_moe._resources import bin_file as find

    return find(name)
