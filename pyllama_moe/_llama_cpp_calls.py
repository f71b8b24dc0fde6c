"""How :mod:`pyllama_moe.llama_cpp` calls ``llama.h`` as llama-cpp-python's ctypes binding is called.

One table turns each C parameter type into a converter for what llama-cpp-python's callers pass, and each C result
type into what its ctypes declarations return. :func:`wrap` applies them to one function of ``lib``, read from the
function's cffi type, so no function is written by hand and none drifts from the patched ``llama.h``.

On the way in (each argument converted once, then checked by cffi against the C type):

=========================== ==========================================================================================
C parameter                 accepted
=========================== ==========================================================================================
number, ``bool``, enum      a Python number or bool, or a ctypes scalar (``c_bool(True)``, ``llama_token(5)``)
``char *``                  ``bytes``, ``None`` (NULL), a ctypes ``c_char`` buffer (``create_string_buffer(n)``,
                            ``(c_char * n)()``) or ``c_char_p``, a ``bytearray``, a cffi ``char`` array
``T *`` (T a number)        a ctypes array, pointer or ``byref()`` of T (``(llama_token * n)()``), a contiguous
                            buffer of T (numpy array, ``array.array``), a cffi ``T[]``, ``None``
``char **``, ``void **``    a ctypes array of ``c_char_p`` / ``c_void_p``, a cffi array, ``None``
``void *``                  ``None``, an int address, a ``c_void_p`` or any ctypes object (its address), cdata
callback                    a cffi callback, a ctypes ``CFUNCTYPE`` object with as many arguments, ``None``
struct pointer (handle)     the cffi pointer a function returned, ``None``
struct by value             a cffi struct (``llama_cpp.llama_<struct>(...)`` or a ``*_default_params()``)
=========================== ==========================================================================================

A list or tuple where C takes a pointer is refused: cffi would copy it into a temporary array that C can neither
write back to nor keep (``llama_batch_get_one`` keeps it), so the result would be lost or read after it is freed.

On the way out: ``char *`` -> ``bytes`` (None for NULL), as ``c_char_p``; ``T *`` (T a number) -> a ctypes
``POINTER(T)`` (NULL is a false pointer), as llama-cpp-python declares them, so ``np.ctypeslib.as_array(p,
shape=(n,))`` works; struct pointers (handles) -> the cffi pointer, ``None`` for NULL (llama-cpp-python's handles are
``c_void_p``: ``None`` for NULL); numbers, bools and structs as cffi returns them.
"""

from __future__ import annotations

import ctypes
import struct
import weakref
from collections.abc import Callable
from typing import Any

from pyllama_moe.ffi import ffi

Converter = Callable[[Any], Any]

# the ctypes type of each C number type that llama.h and mtmd.h pass or return by pointer (mtmd.h's pixels and image
# files are ``unsigned char *``: ctypes ``c_uint8`` arrays, bytes, bytearrays, numpy uint8 arrays)
_CTYPES: dict[str, Any] = {
    "char": ctypes.c_char, "unsigned char": ctypes.c_ubyte, "_Bool": ctypes.c_bool, "float": ctypes.c_float,
    "double": ctypes.c_double,
    "int8_t": ctypes.c_int8, "uint8_t": ctypes.c_uint8, "int16_t": ctypes.c_int16, "uint16_t": ctypes.c_uint16,
    "int32_t": ctypes.c_int32, "uint32_t": ctypes.c_uint32, "int64_t": ctypes.c_int64, "uint64_t": ctypes.c_uint64,
    "size_t": ctypes.c_size_t, "int": ctypes.c_int, "unsigned int": ctypes.c_uint,
}
_CArgObject = type(ctypes.byref(ctypes.c_int()))
_CFuncPtr = ctypes.CFUNCTYPE(None).__mro__[1]  # the base class of every CFUNCTYPE type


def _codes(item: Any) -> frozenset[str]:
    """The ctypes ``_type_`` / buffer format codes of elements that C reads as ``item`` (empty: cffi values only)."""
    if item.kind == "pointer":
        return frozenset("z") if item.cname == "char *" else frozenset("P")
    if item.kind != "primitive":
        return frozenset()
    name = item.cname
    if name == "char":
        return frozenset("cbB")
    if name in ("float", "double", "_Bool"):
        return frozenset({"float": "f", "double": "d", "_Bool": "?"}[name])
    if name not in _CTYPES:
        return frozenset()
    signed = int(ffi.cast(name, -1)) < 0
    return frozenset(c for c in ("bhilqn" if signed else "BHILQN") if struct.calcsize(c) == ffi.sizeof(item))


def _ctypes_view(a: Any) -> tuple[Any, int] | None:
    """``(element type, address)`` of a ctypes array, pointer, scalar or ``byref()``; None for anything else."""
    if isinstance(a, ctypes.Array | ctypes._Pointer):
        return type(a)._type_, ctypes.cast(a, ctypes.c_void_p).value or 0
    if isinstance(a, ctypes._SimpleCData):
        return type(a), ctypes.addressof(a)
    if isinstance(a, _CArgObject):
        target = getattr(a, "_obj", None)
        elem = type(target)._type_ if isinstance(target, ctypes.Array) else type(target)
        return elem, ctypes.cast(a, ctypes.c_void_p).value or 0
    return None


def _describe(a: Any) -> str:
    if isinstance(a, ctypes.Array | ctypes._Pointer):
        return f"a ctypes {type(a).__name__} (of {type(a)._type_.__name__})"
    return f"a {type(a).__module__}.{type(a).__qualname__}" if type(a).__module__ != "builtins" \
        else f"a {type(a).__name__}"


def _hint(item: Any) -> str:
    """What to pass where C takes ``item *``."""
    if item.cname == "char":
        return ("pass bytes for a string, or a buffer C can write to: ctypes.create_string_buffer(n), "
                "(ctypes.c_char * n)(), a bytearray or ffi.new('char[]', n); None for NULL")
    if item.cname in _CTYPES:
        ct = "llama_cpp.llama_token" if item.cname == "int32_t" else "ctypes." + _CTYPES[item.cname].__name__
        return (f"pass a ctypes array of {item.cname} (({ct} * n)()), a pointer or byref() to one, a contiguous "
                f"buffer of {item.cname} (a numpy array, array.array), ffi.new('{item.cname}[]', n) or None")
    if item.kind == "pointer":
        elem = "ctypes.c_char_p" if item.cname == "char *" else "ctypes.c_void_p"
        return f"pass a ctypes array of {elem} (({elem} * n)(...)), ffi.new('{item.cname}[]', n) or None"
    if item.kind == "function":
        return f"pass ffi.new('{item.cname} *') or None"
    return (f"pass the cffi pointer a llama_* function returned, a struct made by llama_cpp's constructors "
            f"(byref(s) for its address, ffi.new('{item.cname}[]', n) for several) or None; "
            "ctypes Structures of llama-cpp-python are not this binding's structs")


def _pointer(where: str, ptype: Any) -> Converter:
    item = ptype.item
    codes = _codes(item)
    is_char = item.cname == "char"
    array = ffi.getctype(item, "[]")
    size = ffi.sizeof(item) if item.kind in ("primitive", "pointer") else 0

    def refuse(a: Any) -> TypeError:
        return TypeError(f"{where} is a C '{ptype.cname}': {_hint(item)}; got {_describe(a)}")

    def convert(a: Any) -> Any:
        if isinstance(a, ffi.CData):
            return a
        if a is None:
            return ffi.NULL
        if is_char and isinstance(a, bytes):
            return a
        if is_char and isinstance(a, ctypes.c_char_p):
            return ffi.NULL if a.value is None else a.value
        view = _ctypes_view(a)
        if view is not None:
            elem, address = view
            code = getattr(elem, "_type_", None)
            if isinstance(code, str) and code in codes and ctypes.sizeof(elem) == size:
                return ffi.cast(ptype, address)
            raise refuse(a)
        if codes and not isinstance(a, str | list | tuple):
            try:
                view_ = memoryview(a)
            except TypeError:
                raise refuse(a) from None
            with view_:
                fits = (view_.c_contiguous and view_.itemsize == size
                        and view_.format.lstrip("@=<>!") in codes)
            if fits:
                return ffi.from_buffer(array, a)
        raise refuse(a)

    return convert


def _void_pointer(where: str) -> Converter:
    def convert(a: Any) -> Any:
        if a is None:
            return ffi.NULL
        if isinstance(a, ffi.CData):
            return a
        if isinstance(a, int) and not isinstance(a, bool):
            return ffi.cast("void *", a)
        if isinstance(a, ctypes.c_void_p):
            return ffi.cast("void *", a.value or 0)
        view = _ctypes_view(a)
        if view is not None:
            return ffi.cast("void *", view[1])
        raise TypeError(f"{where} is a C 'void *': pass None, an int address, a ctypes.c_void_p or ctypes object, "
                        f"or cffi cdata (ffi.new_handle(obj)); got {_describe(a)}")

    return convert


def _handle(where: str, ptype: Any) -> Converter:
    def convert(a: Any) -> Any:
        if a is None:
            return ffi.NULL
        if isinstance(a, ffi.CData):
            return a
        raise TypeError(f"{where} is a C '{ptype.cname}': {_hint(ptype.item)}; got {_describe(a)}")

    return convert


def is_ctypes_callback(a: object) -> bool:
    """Whether ``a`` is a ctypes ``CFUNCTYPE`` object (a C function pointer made by ctypes)."""
    return isinstance(a, _CFuncPtr)


def _function(where: str, ftype: Any) -> Converter:
    def convert(a: Any) -> Any:
        if a is None:
            return ffi.NULL
        if isinstance(a, ffi.CData):
            return a
        if is_ctypes_callback(a):
            argtypes = getattr(type(a), "_argtypes_", None) or ()
            if len(argtypes) != len(ftype.args):
                raise TypeError(f"{where} is a C callback '{ftype.cname}' of {len(ftype.args)} arguments; "
                                f"the ctypes callback given takes {len(argtypes)}")
            return ffi.cast(ftype, ctypes.cast(a, ctypes.c_void_p).value or 0)
        raise TypeError(f"{where} is a C callback '{ftype.cname}': pass a ctypes CFUNCTYPE object, a cffi callback "
                        "(llama_cpp.llama_log_callback(fn), llama_progress_callback(fn), ggml_abort_callback(fn) or "
                        f"ffi.callback('{ftype.cname}', fn)) or None, and keep it alive while C may call it; "
                        f"got {_describe(a)}")

    return convert


def _scalar(a: Any) -> Any:
    return a.value if isinstance(a, ctypes._SimpleCData) else a


def _bool(a: Any) -> bool:
    return bool(a.value if isinstance(a, ctypes._SimpleCData) else a)


def argument(where: str, ctype: Any) -> Converter | None:
    """The converter of one parameter of C type ``ctype`` (None: passed to cffi as it is)."""
    if ctype.kind == "pointer":
        if ctype.item.kind == "void":
            return _void_pointer(where)
        if ctype.item.kind in ("struct", "union"):
            return _handle(where, ctype)
        return _pointer(where, ctype)  # numbers, strings, pointers, callbacks
    if ctype.kind == "function":
        return _function(where, ctype)
    if ctype.kind == "primitive" and ctype.cname == "_Bool":
        return _bool
    if ctype.kind in ("primitive", "enum"):
        return _scalar
    return None  # structs by value: cffi's own check says what it needs


def _string_result(p: Any) -> bytes | None:
    return None if p == ffi.NULL else ffi.string(p)


def _handle_result(p: Any) -> Any:
    return None if p == ffi.NULL else p


def result(ctype: Any) -> Converter | None:
    """The converter of a C result of type ``ctype`` (None: returned as cffi gives it)."""
    if ctype.kind != "pointer":
        return None
    item = ctype.item
    if item.cname == "char":
        return _string_result
    if item.kind == "struct":
        return _handle_result
    if item.kind == "primitive" and item.cname in _CTYPES:
        pointer = ctypes.POINTER(_CTYPES[item.cname])

        def to_ctypes(p: Any) -> Any:
            return ctypes.cast(int(ffi.cast("uintptr_t", p)), pointer)

        return to_ctypes
    return None


def _signature(name: str, ftype: Any) -> str:
    return f"{ftype.result.cname} {name}({', '.join(a.cname for a in ftype.args) or 'void'})"


def arguments(name: str, fn: Any) -> Callable[..., list[Any]]:
    """The arguments of ``fn`` (a function of ``lib``) converted for cffi, for a function written by hand."""
    convs = [argument(f"{name}() argument {i + 1}", t) for i, t in enumerate(ffi.typeof(fn).args)]

    def convert(*args: Any) -> list[Any]:
        if len(args) != len(convs):
            raise TypeError(f"{name}() takes {len(convs)} arguments, got {len(args)}")
        return [a if c is None else c(a) for c, a in zip(convs, args, strict=True)]

    return convert


def wrap(name: str, fn: Any, header: str = "llama.h") -> Any:
    """``fn`` (a function of ``lib``, declared in ``header``) called with llama-cpp-python's values; ``fn`` itself if
    nothing converts."""
    ftype = ffi.typeof(fn)
    if ftype.kind != "function" or ftype.ellipsis:
        return fn
    convs = tuple(argument(f"{name}() argument {i + 1}", t) for i, t in enumerate(ftype.args))
    res = result(ftype.result)
    if res is None and not any(convs):
        return fn
    n = len(convs)

    def call(*args: Any) -> Any:
        if len(args) != n:
            return fn(*args)  # cffi says how many it takes
        out = fn(*[a if c is None else c(a) for c, a in zip(convs, args, strict=True)])
        return out if res is None else res(out)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = (f"``{_signature(name, ftype)}`` ({header}), called as llama-cpp-python's ctypes binding is: "
                    "see pyllama_moe._llama_cpp_calls for what each argument accepts and what it returns.")
    call.__wrapped__ = fn  # type: ignore[attr-defined]
    return call


def _callback_arg(ctype: Any) -> Converter | None:
    """What a Python callback receives for a C argument, as ctypes gives it: ``char *`` as bytes, ``void *`` as an
    int (None for NULL)."""
    if ctype.kind == "pointer" and ctype.item.cname == "char":
        return _string_result
    if ctype.kind == "pointer" and ctype.item.kind == "void":
        return lambda p: int(ffi.cast("uintptr_t", p)) or None
    return None


def callback(ctype: str, fn: Callable[..., Any]) -> Any:
    """``fn`` as a C callback of type ``ctype`` (``ffi.callback``) whose arguments arrive as ctypes gives them."""
    ftype = ffi.typeof(ctype)
    convs = tuple(_callback_arg(t) for t in ftype.args)

    def call(*args: Any) -> Any:
        return fn(*[a if c is None else c(a) for c, a in zip(convs, args, strict=True)])

    return ffi.callback(ctype, call if any(convs) else fn)


# the string copies of a struct made by StructType, alive as long as the struct
_kept: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()


class StructType:
    """A constructor of ``struct <name>`` that reads like a ctypes Structure class: ``T(*fields, **fields)`` makes
    one (zero-initialised, owning its memory), ``(T * n)(*items)`` an array of ``n``."""

    def __init__(self, name: str, module: str = "llama_cpp") -> None:
        self.__name__ = self.__qualname__ = name
        self.module = module
        self.cname = "struct " + name
        self.fields = [field for field, _ in ffi.typeof(self.cname).fields]
        # ``char *`` fields take bytes, as a ctypes ``c_char_p`` field does (``mtmd_input_text(text=b"...")``)
        self.strings = {field for field, f in ffi.typeof(self.cname).fields
                        if f.type.kind == "pointer" and f.type.item.cname == "char"}
        self.__doc__ = (f"A new zero-initialised ``{self.cname}`` with the given fields ({', '.join(self.fields)}), "
                        "a struct cdata like a ctypes Structure: pass it by value, or ``byref(...)`` where C takes a "
                        f"pointer; ``({name} * n)()`` makes an array.")

    def __call__(self, *args: Any, **fields: Any) -> Any:
        if len(args) > len(self.fields):
            raise TypeError(f"{self.__name__}() takes at most {len(self.fields)} fields ({', '.join(self.fields)}), "
                            f"got {len(args)}")
        for field, value in zip(self.fields, args, strict=False):
            if field in fields:
                raise TypeError(f"{self.__name__}() got field {field!r} twice")
            fields[field] = value
        unknown = sorted(set(fields) - set(self.fields))
        if unknown:
            raise TypeError(f"{self.__name__}() has no field {', '.join(unknown)} "
                            f"(its fields: {', '.join(self.fields)})")
        keep = []
        for field in self.strings & fields.keys():
            if isinstance(fields[field], bytes):
                fields[field] = ffi.new("char[]", fields[field])
                keep.append(fields[field])
        # the struct of an owning pointer co-owns its memory (cffi), so it lives as long as it is used; so do the
        # copies of the strings it points to
        struct = ffi.new(self.cname + " *", fields)[0]
        if keep:
            _kept[struct] = keep
        return struct

    def __mul__(self, n: int) -> Callable[..., Any]:
        if not isinstance(n, int) or n < 0:
            raise TypeError(f"{self.__name__} * n needs a count n >= 0, got {n!r}")
        cname = f"{self.cname}[{n}]"

        def array(*items: Any) -> Any:
            if len(items) > n:
                raise IndexError(f"{len(items)} items for an array of {n}")
            return ffi.new(cname, list(items))

        array.__name__ = array.__qualname__ = f"{self.__name__}_Array_{n}"
        return array

    def __repr__(self) -> str:
        return f"<{self.module} struct type {self.__name__}>"
