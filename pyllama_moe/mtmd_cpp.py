"""libmtmd's C API under its ``mtmd.h`` / ``mtmd-helper.h`` names, for users of ``llama_cpp.mtmd_cpp``.

libmtmd (llama.cpp's ``tools/mtmd``: image and audio projectors) is built with the package and bound in the same
compiled module as ``llama.h`` (:mod:`pyllama_moe.ffi`). Every ``mtmd_*`` function and ``MTMD_*`` constant of the
pinned headers is an attribute of this module, taken from ``dir(lib)`` at import, and called as
llama-cpp-python 0.3.36's ``llama_cpp.mtmd_cpp`` is called: the same table converts the arguments and results as
for :mod:`pyllama_moe.llama_cpp` (:mod:`pyllama_moe._llama_cpp_calls`)::

    import pyllama_moe as llama_cpp
    from pyllama_moe import mtmd_cpp

    params = mtmd_cpp.mtmd_context_params_default()
    params.use_gpu = False
    ctx = mtmd_cpp.mtmd_init_from_file(b"mmproj.gguf", llm.model, params)  # None if it fails
    bitmap = mtmd_cpp.mtmd_helper_bitmap_init_from_buf(ctx, data, len(data), False,
                                                       mtmd_cpp.mtmd_helper_init_opt_default()).bitmap
    chunks = mtmd_cpp.mtmd_input_chunks_init()
    text = mtmd_cpp.mtmd_input_text(text=b"<__media__> what is this?", text_len=..., add_special=True,
                                    parse_special=True)
    bitmaps = (mtmd_cpp.mtmd_bitmap_p * 1)(bitmap)   # or ffi.new("mtmd_bitmap *[]", [bitmap])
    mtmd_cpp.mtmd_tokenize(ctx, chunks, mtmd_cpp.byref(text), bitmaps, 1)

Differences from llama-cpp-python's module, besides those of :mod:`pyllama_moe.llama_cpp` (cffi handles and structs,
positional arguments only):

- ``mtmd_*_p`` names are not ctypes types: ``mtmd_bitmap_p * n`` makes a cffi array of ``n`` bitmap pointers (what
  ``mtmd_tokenize`` takes); the handles themselves are the cffi pointers the functions return, ``None`` for NULL.
- The functions are those of this llama.cpp (b11549); llama-cpp-python's ``mtmd_get_audio_bitrate`` (a Python
  alias of ``mtmd_get_audio_sample_rate``) is kept as such.
- The owner objects that free each handle once are in :mod:`pyllama_moe.mtmd` (``MtmdContext``, ``Bitmap``,
  ``InputChunks``); this module frees nothing by itself, as in C.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyllama_moe import _llama_cpp_calls as _calls
from pyllama_moe import backend
from pyllama_moe.ffi import ffi, lib
from pyllama_moe.llama_cpp import byref

__all__ = [
    "byref",
    "ffi",
    "lib",
    "mtmd_bitmap_lazy_callback",
    "mtmd_bitmap_p",
    "mtmd_get_audio_bitrate",
    "mtmd_helper_post_decode_callback",
    "mtmd_progress_callback",
]

_PREFIXES = ("mtmd_", "MTMD_")
_HELPER_FUNCTIONS = "mtmd_helper_"


def _export() -> list[str]:
    """Every ``mtmd_*`` function of ``lib`` (wrapped by ``_calls.wrap``) and ``MTMD_*`` constant, in this module."""
    names = []
    g = globals()
    for name in dir(lib):
        if name.startswith(_PREFIXES) and name not in g:
            value = getattr(lib, name)
            header = "mtmd-helper.h" if name.startswith(_HELPER_FUNCTIONS) else "mtmd.h"
            g[name] = _calls.wrap(name, value, header) if callable(value) else value
            names.append(name)
    return names


def _export_structs() -> list[str]:
    """A constructor for every ``mtmd_*`` struct whose layout is public (not the opaque handles)."""
    names = []
    for name in ffi.list_types()[1]:
        if not name.startswith("mtmd_") or name in globals():
            continue
        try:
            ffi.sizeof("struct " + name)
        except ffi.error:  # opaque: mtmd_context, mtmd_bitmap, ...
            continue
        globals()[name] = _calls.StructType(name, "mtmd_cpp")
        names.append(name)
    return names


__all__.extend(_export())
__all__.extend(_export_structs())


class _PointerType:
    """``mtmd_bitmap_p * n``: a cffi array of ``n`` ``mtmd_bitmap *`` (the bitmaps ``mtmd_tokenize`` takes)."""

    def __init__(self, cname: str) -> None:
        self.cname = cname
        self.__name__ = cname.replace(" *", "_p")

    def __mul__(self, n: int) -> Callable[..., Any]:
        if not isinstance(n, int) or n < 0:
            raise TypeError(f"{self.__name__} * n needs a count n >= 0, got {n!r}")

        def array(*items: Any) -> Any:
            if len(items) > n:
                raise IndexError(f"{len(items)} items for an array of {n}")
            return ffi.new(f"{self.cname}[{n}]", [ffi.NULL if i is None else i for i in items])

        return array

    def __repr__(self) -> str:
        return f"<mtmd_cpp pointer type {self.__name__}>"


mtmd_bitmap_p = _PointerType("mtmd_bitmap *")


def _callback(ctype: str) -> Callable[[Callable[..., Any]], Any]:
    def make(fn: Callable[..., Any]) -> Any:
        return _calls.callback(ctype, fn)

    make.__name__ = ctype
    make.__doc__ = (f"Wrap a Python function as a C ``{ctype}`` (usable as a decorator), as a ctypes callback is; "
                    "keep the result alive while C may call it.")
    return make


mtmd_progress_callback = _callback("mtmd_progress_callback")
mtmd_bitmap_lazy_callback = _callback("mtmd_bitmap_lazy_callback")
mtmd_helper_post_decode_callback = _callback("mtmd_helper_post_decode_callback")


def mtmd_get_audio_bitrate(ctx: Any, /) -> int:
    """llama-cpp-python's name of ``mtmd_get_audio_sample_rate`` (Hz; -1 without audio)."""
    return int(globals()["mtmd_get_audio_sample_rate"](ctx))


def mtmd_log_set(log_callback: Any, user_data: Any = None, /) -> None:
    """``void mtmd_log_set(ggml_log_callback, void *)`` (mtmd.h): libmtmd's log goes to ``log_callback`` (a ctypes
    ``CFUNCTYPE(None, c_int, c_char_p, c_void_p)`` object, a cffi callback or a plain Python callable); None puts
    libmtmd's own log to stderr. It replaces pyllama_moe's bridge to :mod:`logging` for libmtmd. The callback is
    kept alive until the next call."""
    backend.set_mtmd_log(*_log_args(log_callback, user_data))


def mtmd_helper_log_set(log_callback: Any, user_data: Any = None, /) -> None:
    """``void mtmd_helper_log_set(ggml_log_callback, void *)`` (mtmd-helper.h): as :func:`mtmd_log_set`, for the
    helpers too."""
    backend.set_mtmd_log(*_log_args(log_callback, user_data), helper=True)


def _log_args(log_callback: Any, user_data: Any) -> tuple[Any, Any, object]:
    if callable(log_callback) and not isinstance(log_callback, ffi.CData) \
            and not _calls.is_ctypes_callback(log_callback):
        log_callback = _calls.callback("ggml_log_callback", log_callback)
    callback, data = _log_set_args(log_callback, user_data)
    return callback, data, (log_callback, user_data)


_log_set_args = _calls.arguments("mtmd_log_set", lib.mtmd_log_set)


def __getattr__(name: str) -> Any:
    if name.startswith(_PREFIXES):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}: the mtmd.h of this build does not "
                             "declare it (llama.cpp renames and removes functions; see mtmd.h for the current name)")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
