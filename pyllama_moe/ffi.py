"""The only importer of the compiled cffi module: ``from pyllama_moe.ffi import ffi, lib``.

``lib`` holds every function of the patched ``llama.h`` under its C name, plus the ggml functions
the bindings need (see ``_ffi_build.py``); ``ffi`` is its cffi FFI object.
"""

from __future__ import annotations

# pyllama_moe/__init__.py has put libstdc++ in the global symbol scope before this loads
try:
    from pyllama_moe._cffi import ffi, lib
# a source checkout that was never built, a CUDA wheel without its libraries
except ImportError as e:  # pragma: no cover
    if "libcudart" in str(e) or "libcublas" in str(e):
        hint = ("this is a CUDA build: install the CUDA runtime and cuBLAS of its CUDA version (a CUDA wheel depends "
                "on them: `pip install nvidia-cuda-runtime nvidia-cublas` for CUDA 13) or put a CUDA toolkit's "
                "libraries on the loader's path")
    else:
        hint = "build and install the package with `pip install .` from the repository (see README.md)"
    raise ImportError(f"pyllama_moe's native part (pyllama_moe._cffi over libllama) cannot be loaded: {e}; "
                      f"{hint}") from e

__all__ = ["ffi", "lib"]
