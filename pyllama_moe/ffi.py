"""The only importer of the compiled cffi module: ``from pyllama_moe.ffi import ffi, lib``.

``lib`` holds every function of the patched ``llama.h`` under its C name, plus the ggml functions
the bindings need (see ``_ffi_build.py``); ``ffi`` is its cffi FFI object.
"""

from __future__ import annotations

# pyllama_moe/__init__.py has put libstdc++ in the global symbol scope before this loads
try:
    from pyllama_moe._cffi import ffi, lib
except ImportError as e:  # pragma: no cover - a source checkout that was never built
    raise ImportError(
        f"pyllama_moe's native part (pyllama_moe._cffi over libllama) cannot be loaded: {e}; build and "
        "install the package with `pip install .` from the repository (see README.md)"
    ) from e

__all__ = ["ffi", "lib"]
