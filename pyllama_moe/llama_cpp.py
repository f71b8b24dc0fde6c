"""The low-level llama.cpp API under its ``llama.h`` names, for users of ``llama_cpp.llama_cpp``.

Every ``llama_*`` function, every ``LLAMA_*`` constant (enum values and ``#define`` integers) and
every ``GGML_*`` constant of the compiled binding (:mod:`pyllama_moe.ffi`) is an attribute of this
module, taken from ``dir(lib)`` at import, so nothing is listed by hand and nothing drifts from the
patched ``llama.h``::

    from pyllama_moe import llama_cpp

    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(b"model.gguf", params)
    vocab = llama_cpp.llama_model_get_vocab(model)
    tokens = llama_cpp.llama_token_array(64)
    n = llama_cpp.llama_tokenize(vocab, b"Hello", 5, tokens, 64, True, False)
    llama_cpp.llama_model_free(model)

Differences from llama-cpp-python's ``llama_cpp.llama_cpp`` (a ctypes module):

- Values are cffi objects, not ctypes ones. Structs returned by value
  (``llama_model_default_params()``, ``llama_batch_init()``) are cffi struct cdata whose fields
  are read and set as attributes, as with ctypes. Pointers are cffi pointers: compare them with
  ``ffi.NULL`` (``ptr == ffi.NULL``), not with ``None`` or ``bool(ptr)``.
- Arrays come from ``ffi.new``: use :func:`llama_token_array` (or ``ffi.new("llama_token[]", n)``)
  where ctypes code writes ``(llama_cpp.llama_token * n)()``, and :func:`float_array`.
- ``ctypes.byref(x)`` becomes :func:`byref` (``ffi.addressof`` for a struct, the pointer itself
  for a pointer); a function that takes a pointer also accepts a pointer made by ``ffi.new``.
- Strings go in as ``bytes`` (``b"..."``); ``char *`` results are cdata: read them with
  ``ffi.string(ptr)`` (bytes). Output buffers are ``ffi.new("char[]", n)``.
- Every ``llama_*`` struct of ``llama.h`` with a known layout has a constructor of its name taking
  keyword fields, e.g. ``llama_token_data_array(data=..., size=n, selected=-1, sorted=False)``;
  it returns a struct cdata that owns its memory, passed by value as it is and by pointer as
  ``byref(s)``, as with ctypes. Pointer fields (``data`` above) do not keep their target alive:
  keep a reference to it, as with ctypes.
- Callbacks are made with :func:`llama_log_callback` / :func:`llama_progress_callback` /
  :func:`ggml_abort_callback` (``ffi.callback``) instead of ctypes ``CFUNCTYPE`` types; keep a
  reference to the returned object for as long as C may call it. Setting a log callback replaces
  pyllama_moe's bridge to :mod:`logging` (see :mod:`pyllama_moe.backend`).
- ctypes pointer *types* (``llama_model_p``, ``llama_token_p``, ``c_float_p``...) and the
  ``_lib`` / ``ctypes_function`` machinery do not exist; ``llama_token``, ``llama_pos`` and
  ``llama_seq_id`` are ``int``.
- Only functions of this llama.cpp (b11549, see ``pyllama_moe info``) exist: ones llama.cpp
  removed since llama-cpp-python 0.3.36 was released raise ``AttributeError``, and struct fields
  follow this ``llama.h`` (e.g. ``llama_context_params.moe_cache_size``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from pyllama_moe.ffi import ffi, lib

__all__ = [
    "byref",
    "ffi",
    "float_array",
    "ggml_abort_callback",
    "lib",
    "llama_log_callback",
    "llama_pos",
    "llama_progress_callback",
    "llama_seq_id",
    "llama_token",
    "llama_token_array",
]

# the C integer typedefs of llama.h
llama_token = int
llama_pos = int
llama_seq_id = int

_PREFIXES = ("llama_", "LLAMA_", "GGML_")


def _export() -> list[str]:
    """Put every ``llama_*`` function and ``LLAMA_*`` / ``GGML_*`` constant of ``lib`` in this module."""
    names = []
    g = globals()
    for name in dir(lib):
        if name.startswith(_PREFIXES) and name not in g:
            g[name] = getattr(lib, name)
            names.append(name)
    return names


_exported = _export()
__all__.extend(_exported)


def llama_token_array(n_or_tokens: int | Iterable[int]) -> Any:
    """A ``llama_token[]``: ``n`` zeros, or a copy of the given tokens (``ffi.new("llama_token[]", ...)``)."""
    if isinstance(n_or_tokens, int):
        return ffi.new("llama_token[]", n_or_tokens)
    return ffi.new("llama_token[]", list(n_or_tokens))


def float_array(n_or_values: int | Iterable[float]) -> Any:
    """A ``float[]``: ``n`` zeros, or a copy of the given values."""
    if isinstance(n_or_values, int):
        return ffi.new("float[]", n_or_values)
    return ffi.new("float[]", list(n_or_values))


def byref(obj: Any) -> Any:
    """``ctypes.byref``: a pointer to a struct cdata; a pointer or array is returned as it is."""
    kind = ffi.typeof(obj).kind
    if kind == "struct":
        return ffi.addressof(obj)
    if kind in ("pointer", "array"):
        return obj
    raise TypeError(f"byref() needs a struct, pointer or array cdata, got {ffi.typeof(obj).cname}")


def _struct(name: str) -> Callable[..., Any]:
    cname = "struct " + name

    def make(**fields: Any) -> Any:
        # the struct of an owning pointer co-owns its memory (cffi), so it lives as long as it is used
        return ffi.new(cname + " *", fields)[0]

    make.__name__ = make.__qualname__ = name
    make.__doc__ = (f"A new zero-initialised ``{cname}`` with the given fields (a struct cdata, like a ctypes "
                    "Structure: pass it by value, or ``byref(...)`` where C takes a pointer).")
    return make


def _export_structs() -> list[str]:
    """A constructor for every ``llama_*`` struct whose layout the binding knows (not the opaque handles)."""
    names = []
    for name in ffi.list_types()[1]:
        if not name.startswith("llama_") or name in globals():
            continue
        try:
            ffi.sizeof("struct " + name)
        except ffi.error:  # opaque: llama_model, llama_context, ...
            continue
        globals()[name] = _struct(name)
        names.append(name)
    return names


_structs = _export_structs()
__all__.extend(_structs)


def _callback(ctype: str) -> Callable[[Callable[..., Any]], Any]:
    def make(fn: Callable[..., Any]) -> Any:
        return ffi.callback(ctype, fn)

    make.__name__ = ctype
    make.__doc__ = (f"Wrap a Python function as a C ``{ctype}`` (usable as a decorator); keep the "
                    "result alive while C may call it.")
    return make


llama_log_callback = _callback("ggml_log_callback")
llama_progress_callback = _callback("llama_progress_callback")
ggml_abort_callback = _callback("ggml_abort_callback")


def __getattr__(name: str) -> Any:
    """Only reached for names that are not exported: say why (and let type checkers see the dynamic exports)."""
    if name.startswith(_PREFIXES):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}: the llama.h of this build does not "
                             "declare it (llama.cpp renames and removes functions; see llama.h for the current name)")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
