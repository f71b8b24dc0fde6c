"""The low-level llama.cpp API under its ``llama.h`` names, for users of ``llama_cpp.llama_cpp``.

Every ``llama_*`` function, every ``LLAMA_*`` constant (enum values and ``#define`` integers) and
every ``GGML_*`` constant of the compiled binding (:mod:`pyllama_moe.ffi`) is an attribute of this
module, taken from ``dir(lib)`` at import, so nothing is listed by hand and nothing drifts from the
patched ``llama.h``. The functions are called as llama-cpp-python's ctypes binding is, with the values
its callers pass (one table converts them: :mod:`pyllama_moe._llama_cpp_calls`)::

    import ctypes
    import pyllama_moe as llama_cpp  # pyllama_moe.llama_cpp is this module

    llama_cpp.llama_backend_init()
    print(llama_cpp.llama_print_system_info().decode())
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(b"model.gguf", params)  # None if it fails
    vocab = llama_cpp.llama_model_get_vocab(model)
    tokens = (llama_cpp.llama_token * 64)()
    n = llama_cpp.llama_tokenize(vocab, b"Hello", 5, tokens, 64, True, False)
    buf = ctypes.create_string_buffer(32)
    k = llama_cpp.llama_token_to_piece(vocab, tokens[0], buf, 32, 0, False)
    llama_cpp.llama_model_free(model)

As in llama-cpp-python: ``char *`` results are ``bytes`` (None for NULL), ``bool`` results ``bool``;
strings go in as ``bytes``; buffers C fills are ctypes arrays (``(llama_cpp.llama_token * n)()``,
``ctypes.create_string_buffer(n)``), ``bytearray`` or numpy arrays of the C element type, and ctypes
scalars (``ctypes.c_bool(True)``) pass as their values; number pointers come back as ctypes pointers
(``np.ctypeslib.as_array(llama_cpp.llama_get_logits(ctx), shape=(n,))``); ``llama_token``,
``llama_pos`` and ``llama_seq_id`` are ``ctypes.c_int32``; :func:`llama_log_set` takes a ctypes
callback, one made by :func:`llama_log_callback`, or a plain Python callable. What else goes in
raises a ``TypeError`` that says what to pass.

Differences from llama-cpp-python's ``llama_cpp.llama_cpp`` (docs/compat.md lists them too):

- Handles and structs are cffi objects, not ctypes ones. A handle (``llama_model *``...) is a cffi
  pointer, ``None`` when C returns NULL. Structs returned by value (``llama_model_default_params()``,
  ``llama_batch_init()``) are cffi struct cdata whose fields are read and set as attributes, as with
  ctypes; a pointer field takes a cffi value (``ffi.new``, :func:`llama_token_array`), not a ctypes array.
- Every ``llama_*`` struct of ``llama.h`` with a known layout has a constructor of its name taking its
  fields (positionally in C order, or by keyword), e.g. ``llama_token_data_array(data=..., size=n,
  selected=-1, sorted=False)``, and ``(llama_cpp.llama_token_data * n)()`` makes an array of ``n``; the
  struct is passed by value as it is and by pointer as ``byref(s)``, as with ctypes. ctypes
  Structures of llama-cpp-python's own classes are not accepted. Pointer fields do not keep their
  target alive: keep a reference to it, as with ctypes.
- :func:`byref` is ``ctypes.byref`` for ctypes objects and ``ffi.addressof`` for a cffi struct.
- Callbacks made by :func:`llama_log_callback` / :func:`llama_progress_callback` /
  :func:`ggml_abort_callback` are cffi callbacks (their Python function receives ``char *`` as bytes and
  ``void *`` as an int or None, as ctypes gives them); a struct field (``progress_callback``) takes
  only those. Keep a reference to a callback for as long as C may call it.
  :func:`llama_log_set` replaces pyllama_moe's bridge to :mod:`logging` (see :mod:`pyllama_moe.backend`).
- Functions take positional arguments only (no keywords), and only the functions of this llama.cpp
  (b11549, see ``pyllama_moe info``) exist: ones llama.cpp removed since llama-cpp-python 0.3.36 was
  released raise ``AttributeError``, and struct fields follow this ``llama.h`` (e.g.
  ``llama_context_params.moe_cache_size``).
- ``_lib``, ``ctypes_function`` and the ctypes pointer types (``llama_model_p``, ``llama_token_p``...)
  do not exist; ``ffi`` and ``lib`` are the binding itself (``lib``'s functions take cffi values only).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterable
from ctypes import (
    c_bool,
    c_char,
    c_char_p,
    c_double,
    c_float,
    c_int,
    c_int8,
    c_int32,
    c_int64,
    c_size_t,
    c_uint8,
    c_uint32,
    c_uint64,
    c_void_p,
)
from typing import Any

from pyllama_moe import _llama_cpp_calls as _calls
from pyllama_moe import backend
from pyllama_moe.ffi import ffi, lib

__all__ = [
    "byref",
    "c_bool",
    "c_char",
    "c_char_p",
    "c_double",
    "c_float",
    "c_int",
    "c_int8",
    "c_int32",
    "c_int64",
    "c_size_t",
    "c_uint8",
    "c_uint32",
    "c_uint64",
    "c_void_p",
    "ctypes",
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

# the C integer typedefs of llama.h, as llama-cpp-python declares them: ``(llama_token * n)()`` is an array C fills
llama_token = c_int32
llama_pos = c_int32
llama_seq_id = c_int32

_PREFIXES = ("llama_", "LLAMA_", "GGML_")


def _export() -> list[str]:
    """Put every ``llama_*`` function (wrapped by ``_calls.wrap``) and ``LLAMA_*`` / ``GGML_*`` constant of ``lib``
    in this module."""
    names = []
    g = globals()
    for name in dir(lib):
        if name.startswith(_PREFIXES) and name not in g:
            value = getattr(lib, name)
            g[name] = _calls.wrap(name, value) if callable(value) else value
            names.append(name)
    return names


_exported = _export()
__all__.extend(_exported)


def llama_token_array(n_or_tokens: int | Iterable[int]) -> Any:
    """A cffi ``llama_token[]``: ``n`` zeros, or a copy of the given tokens (``ffi.new("llama_token[]", ...)``)."""
    if isinstance(n_or_tokens, int):
        return ffi.new("llama_token[]", n_or_tokens)
    return ffi.new("llama_token[]", list(n_or_tokens))


def float_array(n_or_values: int | Iterable[float]) -> Any:
    """A cffi ``float[]``: ``n`` zeros, or a copy of the given values."""
    if isinstance(n_or_values, int):
        return ffi.new("float[]", n_or_values)
    return ffi.new("float[]", list(n_or_values))


def byref(obj: Any) -> Any:
    """``ctypes.byref``: a pointer to a struct cdata (a pointer or array is returned as it is); for a ctypes object,
    ``ctypes.byref(obj)``."""
    if isinstance(obj, ctypes.Array | ctypes._Pointer | ctypes._SimpleCData | ctypes.Structure | ctypes.Union):
        return ctypes.byref(obj)
    if not isinstance(obj, ffi.CData):
        raise TypeError(f"byref() needs a struct, pointer or array (cffi or ctypes), got {type(obj).__name__}")
    kind = ffi.typeof(obj).kind
    if kind == "struct":
        return ffi.addressof(obj)
    if kind in ("pointer", "array"):
        return obj
    raise TypeError(f"byref() needs a struct, pointer or array cdata, got {ffi.typeof(obj).cname}")


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
        globals()[name] = _calls.StructType(name)
        names.append(name)
    return names


_structs = _export_structs()
__all__.extend(_structs)


def _callback(ctype: str) -> Callable[[Callable[..., Any]], Any]:
    def make(fn: Callable[..., Any]) -> Any:
        return _calls.callback(ctype, fn)

    make.__name__ = ctype
    make.__doc__ = (f"Wrap a Python function as a C ``{ctype}`` (usable as a decorator); it receives ``char *`` "
                    "as bytes and ``void *`` as an int (None for NULL), as a ctypes callback does. Keep the result "
                    "alive while C may call it.")
    return make


llama_log_callback = _callback("ggml_log_callback")
llama_progress_callback = _callback("llama_progress_callback")
ggml_abort_callback = _callback("ggml_abort_callback")

_log_set_args = _calls.arguments("llama_log_set", lib.llama_log_set)


def llama_log_set(log_callback: Any, user_data: Any = None, /) -> None:
    """``void llama_log_set(ggml_log_callback log_callback, void * user_data)`` (llama.h): llama.cpp's and ggml's
    log goes to ``log_callback(level, text, user_data)``.

    ``log_callback`` is what llama-cpp-python's callers pass: a ctypes ``CFUNCTYPE(None, c_int, c_char_p,
    c_void_p)`` object, one made by :func:`llama_log_callback` (a decorator), or a plain Python callable (it gets
    ``text`` as bytes and ``user_data`` as an int or None); None restores llama.cpp's own log to stderr.
    ``user_data`` is None, an int or a ``ctypes.c_void_p``. The callback is kept alive until the next call; it
    replaces pyllama_moe's bridge to :mod:`logging` for the rest of the process (``Llama`` no longer installs it,
    and its exceptions no longer quote llama.cpp's error lines).
    """
    if callable(log_callback) and not isinstance(log_callback, ffi.CData) \
            and not _calls.is_ctypes_callback(log_callback):
        log_callback = llama_log_callback(log_callback)
    callback, data = _log_set_args(log_callback, user_data)
    backend.set_log(callback, data, keep=(log_callback, user_data))


def __getattr__(name: str) -> Any:
    """Only reached for names that are not exported: say why (and let type checkers see the dynamic exports)."""
    if name.startswith(_PREFIXES):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}: the llama.h of this build does not "
                             "declare it (llama.cpp renames and removes functions; see llama.h for the current name)")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
