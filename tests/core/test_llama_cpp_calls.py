"""pyllama_moe._llama_cpp_calls: llama.h functions take what llama-cpp-python's callers pass, and return what its ctypes
declarations return (#47)."""

from __future__ import annotations

import array
import ctypes
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pyllama_moe import _llama_cpp_calls as calls
from pyllama_moe import llama_cpp
from pyllama_moe.ffi import ffi, lib

REPO = Path(__file__).resolve().parents[2]
QWEN2 = REPO / "vendor" / "llama.cpp" / "models" / "ggml-vocab-qwen2.gguf"
HELLO_WORLD = [9707, 1879]  # b"Hello world" in qwen2's vocabulary


@pytest.fixture(scope="module")
def model() -> Iterator[Any]:
    if not QWEN2.is_file():
        pytest.skip("no vendored vocabulary")
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    m = llama_cpp.llama_model_load_from_file(str(QWEN2).encode(), params)
    assert m is not None
    yield m
    llama_cpp.llama_model_free(m)


@pytest.fixture(scope="module")
def vocab(model: Any) -> Any:
    return llama_cpp.llama_model_get_vocab(model)


def _where(ctype: str) -> Any:
    conv = calls.argument("f() argument 1", ffi.typeof(ctype))
    assert conv is not None
    return conv


# -- results


def test_strings_come_back_as_bytes_or_none(model: Any, vocab: Any) -> None:
    info = llama_cpp.llama_print_system_info()
    assert isinstance(info, bytes) and info.decode().startswith("PATCH_SERIES")
    assert info[:5] == b"PATCH"  # slicing: bytes, not cdata
    assert llama_cpp.llama_vocab_get_text(vocab, HELLO_WORLD[0]) == b"Hello"
    assert llama_cpp.llama_model_chat_template(model, b"no-such-template") is None  # NULL
    assert llama_cpp.llama_sampler_name(sampler := llama_cpp.llama_sampler_init_greedy()) == b"greedy"
    llama_cpp.llama_sampler_free(sampler)


def test_numbers_and_bools_as_python_values(vocab: Any) -> None:
    eos = llama_cpp.llama_vocab_eos(vocab)
    assert type(eos) is int
    assert llama_cpp.llama_vocab_is_eog(vocab, eos) is True
    assert llama_cpp.llama_vocab_is_eog(vocab, HELLO_WORLD[0]) is False
    assert type(llama_cpp.llama_vocab_n_tokens(vocab)) is int


def test_a_null_handle_is_none() -> None:
    params = llama_cpp.llama_model_default_params()
    assert llama_cpp.llama_model_load_from_file(b"/no/such/model.gguf", params) is None


def test_number_pointers_come_back_as_ctypes_pointers() -> None:
    to_ctypes = calls.result(ffi.typeof("float *"))
    assert to_ctypes is not None
    values = ffi.new("float[]", [1.5, -2.0, 4.0])
    p = to_ctypes(values)
    assert isinstance(p, ctypes.POINTER(ctypes.c_float))
    assert [p[0], p[1], p[2]] == [1.5, -2.0, 4.0]
    assert list(np.ctypeslib.as_array(p, shape=(3,))) == [1.5, -2.0, 4.0]
    null = to_ctypes(ffi.cast("float *", 0))
    assert not null
    with pytest.raises(ValueError):
        null[0]  # ctypes refuses to read through NULL instead of crashing
    tokens = calls.result(ffi.typeof("int32_t *"))
    assert tokens is not None and isinstance(tokens(ffi.new("int32_t[]", 1)), ctypes.POINTER(ctypes.c_int32))


def test_functions_without_anything_to_convert_stay_lib_functions() -> None:
    assert llama_cpp.llama_backend_init is lib.llama_backend_init
    assert llama_cpp.llama_vocab_n_tokens is not lib.llama_vocab_n_tokens
    assert llama_cpp.llama_vocab_n_tokens.__wrapped__ is lib.llama_vocab_n_tokens
    assert "int32_t llama_vocab_n_tokens(struct llama_vocab *)" in llama_cpp.llama_vocab_n_tokens.__doc__


# -- buffers C fills


@pytest.mark.parametrize("make", [
    lambda: ctypes.create_string_buffer(32),
    lambda: (ctypes.c_char * 32)(),
    lambda: bytearray(32),
    lambda: np.zeros(32, dtype=np.uint8),
    lambda: ffi.new("char[]", 32),
], ids=["create_string_buffer", "c_char_array", "bytearray", "numpy_uint8", "cffi"])
def test_char_buffers(vocab: Any, make: Any) -> None:
    buf = make()
    n = llama_cpp.llama_token_to_piece(vocab, HELLO_WORLD[1], buf, 32, 0, False)
    assert n == 6
    got = ffi.buffer(buf, n)[:] if isinstance(buf, ffi.CData) else bytes(memoryview(buf)[:n])
    assert got == b" world"


@pytest.mark.parametrize("make", [
    lambda: (llama_cpp.llama_token * 16)(),
    lambda: (ctypes.c_int * 16)(),
    lambda: np.zeros(16, dtype=np.int32),
    lambda: array.array("i", [0] * 16),
    lambda: llama_cpp.llama_token_array(16),
], ids=["llama_token_array_ctypes", "c_int_array", "numpy_int32", "array_array", "cffi"])
def test_token_buffers(vocab: Any, make: Any) -> None:
    tokens = make()
    n = llama_cpp.llama_tokenize(vocab, b"Hello world", 11, tokens, 16, False, False)
    assert n == 2 and list(tokens[0:n]) == HELLO_WORLD


def test_pointers_and_byref_of_ctypes_arrays(vocab: Any) -> None:
    tokens = (llama_cpp.llama_token * 16)()
    pointer = ctypes.cast(tokens, ctypes.POINTER(llama_cpp.llama_token))
    assert llama_cpp.llama_tokenize(vocab, b"Hello world", 11, pointer, 16, False, False) == 2
    assert list(tokens[:2]) == HELLO_WORLD
    again = (llama_cpp.llama_token * 16)()
    assert llama_cpp.llama_tokenize(vocab, b"Hello world", 11, ctypes.byref(again), 16, False, False) == 2
    assert list(again[:2]) == HELLO_WORLD
    assert llama_cpp.byref(again)._obj is again  # llama_cpp.byref of a ctypes object is ctypes.byref


def test_ctypes_scalars_pass_as_their_values(vocab: Any) -> None:
    tokens = (llama_cpp.llama_token * 16)()
    n = llama_cpp.llama_tokenize(vocab, b"Hello world", ctypes.c_int32(11), tokens, ctypes.c_int(16),
                                 ctypes.c_bool(False), llama_cpp.c_bool(False))
    assert n == 2
    piece = ctypes.create_string_buffer(16)
    assert llama_cpp.llama_token_to_piece(vocab, llama_cpp.llama_token(HELLO_WORLD[0]), piece, 16, 0, False) == 5
    assert piece.value == b"Hello"


def test_detokenize_from_ctypes_tokens(vocab: Any) -> None:
    tokens = (llama_cpp.llama_token * 2)(*HELLO_WORLD)
    out = ctypes.create_string_buffer(32)
    n = llama_cpp.llama_detokenize(vocab, tokens, 2, out, 32, False, False)
    assert out.raw[:n] == b"Hello world"


def test_string_arrays() -> None:
    n = llama_cpp.llama_chat_builtin_templates(None, 0)
    assert n > 10
    names = (ctypes.c_char_p * n)()
    assert llama_cpp.llama_chat_builtin_templates(names, n) == n
    assert b"chatml" in list(names)
    as_cffi = ffi.new("char *[]", n)
    llama_cpp.llama_chat_builtin_templates(as_cffi, n)
    assert [ffi.string(p) for p in as_cffi] == list(names)


def test_size_and_void_pointers() -> None:
    size_p = _where("size_t *")
    count = ctypes.c_size_t(0)
    for given in (count, ctypes.byref(count), ctypes.pointer(count)):
        p = size_p(given)
        p[0] += 7
    assert count.value == 21
    void_p = _where("void *")
    assert void_p(None) == ffi.NULL and void_p(ctypes.c_void_p(0)) == ffi.NULL
    assert int(ffi.cast("uintptr_t", void_p(1234))) == 1234
    assert int(ffi.cast("uintptr_t", void_p(ctypes.c_void_p(99)))) == 99
    assert int(ffi.cast("uintptr_t", void_p(count))) == ctypes.addressof(count)
    with pytest.raises(TypeError, match="void \\*"):
        void_p("text")


# -- what is refused, and the message says what to pass


@pytest.mark.parametrize(("bad", "says"), [
    ("Hello", "pass bytes"),  # str
    ([0] * 32, "pass bytes"),  # a list would be a temporary copy
    ((ctypes.c_int32 * 32)(), "c_int_Array_32"),  # the wrong element type
    (np.zeros(32, dtype=np.float32), "numpy.ndarray"),
], ids=["str", "list", "int_array", "numpy_float32"])
def test_char_pointer_refusals(vocab: Any, bad: Any, says: str) -> None:
    with pytest.raises(TypeError, match=f"llama_token_to_piece\\(\\) argument 3 .*{says}"):
        llama_cpp.llama_token_to_piece(vocab, 1, bad, 32, 0, False)


@pytest.mark.parametrize("bad", [
    [0] * 16, (0,) * 16, (ctypes.c_int64 * 16)(), (ctypes.c_uint32 * 16)(), np.zeros(16, dtype=np.int64),
    np.zeros(16, dtype=np.float32), bytearray(64), "text", 3,
], ids=["list", "tuple", "int64_array", "uint32_array", "numpy_int64", "numpy_float32", "bytearray", "str", "int"])
def test_token_pointer_refusals(vocab: Any, bad: Any) -> None:
    with pytest.raises(TypeError, match=r"llama_tokenize\(\) argument 4 is a C 'int32_t \*': pass a ctypes array "
                                        r"of int32_t \(\(llama_cpp.llama_token \* n\)\(\)\)"):
        llama_cpp.llama_tokenize(vocab, b"Hello", 5, bad, 16, False, False)


def test_handles_take_cffi_pointers_or_none() -> None:
    handle = _where("struct llama_model *")
    assert handle(None) == ffi.NULL
    with pytest.raises(TypeError, match="cffi pointer a llama_\\* function returned"):
        handle(ctypes.c_void_p(0))
    with pytest.raises(TypeError, match="argument"):
        llama_cpp.llama_vocab_n_tokens()  # cffi's own count check


def test_callbacks_from_ctypes_and_cffi() -> None:
    seen: list[tuple[int, bytes, int | None]] = []
    as_ctypes = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)(
        lambda level, text, user_data: seen.append((level, text, user_data)))
    log_cb = _where("ggml_log_callback")
    c_function = log_cb(as_ctypes)
    assert ffi.typeof(c_function) is ffi.typeof("ggml_log_callback")
    c_function(3, b"through C", ffi.NULL)
    assert seen == [(3, b"through C", None)]
    assert log_cb(None) == ffi.NULL
    made = llama_cpp.llama_log_callback(lambda level, text, user_data: seen.append((level, text, user_data)))
    assert log_cb(made) is made
    made(2, ffi.new("char[]", b"from cffi"), ffi.cast("void *", 5))
    assert seen[-1] == (2, b"from cffi", 5)  # the Python function gets what a ctypes callback would
    with pytest.raises(TypeError, match="of 3 arguments; the ctypes callback given takes 1"):
        log_cb(ctypes.CFUNCTYPE(None, ctypes.c_int)(lambda level: None))
    with pytest.raises(TypeError, match="pass a ctypes CFUNCTYPE object, a cffi callback"):
        log_cb(lambda *a: None)  # only llama_log_set wraps a plain callable (it keeps it alive)
