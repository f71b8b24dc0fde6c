"""pyllama_moe.llama_cpp: llama.h under its C names, for code written against llama_cpp.llama_cpp."""

from __future__ import annotations

import ctypes
import gc
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pyllama_moe import backend, llama_cpp
from pyllama_moe.ffi import ffi, lib

REPO = Path(__file__).resolve().parents[2]
LLAMA_H = REPO / "vendor" / "llama.cpp" / "include" / "llama.h"
QWEN2 = REPO / "vendor" / "llama.cpp" / "models" / "ggml-vocab-qwen2.gguf"


def test_every_llama_function_and_constant_of_lib_is_exported() -> None:
    names = [n for n in dir(lib) if n.startswith(("llama_", "LLAMA_", "GGML_"))]
    assert len(names) > 400
    for n in names:
        ours, theirs = getattr(llama_cpp, n), getattr(lib, n)
        if callable(theirs) and n != "llama_log_set":  # functions: lib's, or lib's called with converted values
            assert ours is theirs or ours.__wrapped__ is theirs, n
        elif not callable(theirs):
            assert ours == theirs, n
        assert n in llama_cpp.__all__


def test_llama_h_functions_are_there() -> None:
    text = re.sub(r"//[^\n]*|/\*.*?\*/", "", LLAMA_H.read_text(), flags=re.DOTALL)
    declared = {m.group(1) for d in text.split("LLAMA_API")[1:] if (m := re.search(r"\b(llama_\w+)\s*\(", d))}
    missing = sorted(n for n in declared if not callable(getattr(llama_cpp, n, None)))
    assert not missing


def test_constants_and_types() -> None:
    assert llama_cpp.LLAMA_DEFAULT_SEED == 0xFFFFFFFF
    assert llama_cpp.LLAMA_TOKEN_NULL == -1
    assert llama_cpp.LLAMA_VOCAB_TYPE_BPE == lib.LLAMA_VOCAB_TYPE_BPE
    assert llama_cpp.GGML_TYPE_F16 == lib.GGML_TYPE_F16
    assert llama_cpp.llama_token is ctypes.c_int32  # as llama-cpp-python declares it: (llama_token * n)() is an array
    assert llama_cpp.llama_pos is llama_cpp.llama_seq_id is ctypes.c_int32
    assert llama_cpp.c_bool is ctypes.c_bool and llama_cpp.ctypes is ctypes
    assert llama_cpp.ffi is ffi


def test_struct_defaults_are_cffi_structs() -> None:
    mp = llama_cpp.llama_model_default_params()
    cp = llama_cpp.llama_context_default_params()
    assert ffi.typeof(mp) is ffi.typeof("struct llama_model_params")
    assert cp.moe_cache_size == 0  # the patched header's field
    cp.n_ctx = 128
    assert cp.n_ctx == 128
    assert llama_cpp.byref(cp) == ffi.addressof(cp)


def test_arrays_and_struct_constructors() -> None:
    toks = llama_cpp.llama_token_array(4)
    assert ffi.typeof(toks) is ffi.typeof("llama_token[]") and list(toks) == [0, 0, 0, 0]
    assert list(llama_cpp.llama_token_array([5, 6])) == [5, 6]
    assert list(llama_cpp.float_array([0.5])) == [0.5]
    data = ffi.new("llama_token_data[]", [{"id": 3, "logit": 1.0, "p": 0.0}, {"id": 7, "logit": 2.0, "p": 0.0}])
    arr = llama_cpp.llama_token_data_array(data=data, size=2, selected=-1, sorted=False)
    assert ffi.typeof(arr) is ffi.typeof("llama_token_data_array")
    gc.collect()  # the struct owns its memory
    assert arr.size == 2 and arr.selected == -1
    sampler = llama_cpp.llama_sampler_init_greedy()
    try:
        llama_cpp.llama_sampler_apply(sampler, llama_cpp.byref(arr))  # ctypes: byref(arr)
        assert arr.data[arr.selected].id == 7
    finally:
        llama_cpp.llama_sampler_free(sampler)
    ptr = llama_cpp.byref(arr)
    assert llama_cpp.byref(ptr) is ptr and llama_cpp.byref(toks) is toks
    with pytest.raises(TypeError):
        llama_cpp.byref(3)
    # by value, as ctypes passes a Structure
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_params(no_perf=True))
    assert chain != ffi.NULL
    llama_cpp.llama_sampler_free(chain)


def test_every_struct_with_a_layout_has_a_constructor() -> None:
    for name in ffi.list_types()[1]:
        if not name.startswith("llama_"):
            continue
        try:
            ffi.sizeof("struct " + name)
        except ffi.error:
            assert not hasattr(llama_cpp, name) or callable(getattr(llama_cpp, name)), name  # opaque handle
            continue
        made = getattr(llama_cpp, name)()
        assert ffi.typeof(made) is ffi.typeof("struct " + name), name
    assert llama_cpp.llama_chat_message(role=ffi.NULL).content == ffi.NULL


def test_structs_read_like_ctypes_structures() -> None:
    # positional fields in C order, as a ctypes Structure takes them; (T * n)() an array of n
    data = llama_cpp.llama_token_data(7, 2.5, 0.0)
    assert (data.id, data.logit) == (7, 2.5)
    candidates = (llama_cpp.llama_token_data * 3)(llama_cpp.llama_token_data(1, 0.5, 0.0), data)
    assert ffi.typeof(candidates) is ffi.typeof("llama_token_data[3]")
    assert [c.id for c in candidates] == [1, 7, 0]
    arr = llama_cpp.llama_token_data_array(candidates, 3, -1, False)
    sampler = llama_cpp.llama_sampler_init_greedy()
    try:
        llama_cpp.llama_sampler_apply(sampler, llama_cpp.byref(arr))
    finally:
        llama_cpp.llama_sampler_free(sampler)
    assert arr.data[arr.selected].id == 7
    with pytest.raises(TypeError, match="has no field nope"):
        llama_cpp.llama_token_data(nope=1)
    with pytest.raises(TypeError, match="got field 'id' twice"):
        llama_cpp.llama_token_data(1, id=2)
    with pytest.raises(TypeError, match="at most 3 fields"):
        llama_cpp.llama_token_data(1, 2, 3, 4)
    with pytest.raises(IndexError):
        (llama_cpp.llama_token_data * 1)(data, data)


def test_tokenize_a_vocab_like_llama_cpp_python_code() -> None:
    if not QWEN2.is_file():
        pytest.skip("no vendored vocabulary")
    backend.init()
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(str(QWEN2).encode(), params)
    assert model != ffi.NULL
    try:
        vocab = llama_cpp.llama_model_get_vocab(model)
        text = b"Hello world"
        toks = llama_cpp.llama_token_array(16)
        n = llama_cpp.llama_tokenize(vocab, text, len(text), toks, 16, False, False)
        assert list(toks[0:n]) == [9707, 1879]
        buf = ffi.new("char[]", 32)
        k = llama_cpp.llama_token_to_piece(vocab, toks[1], buf, 32, 0, False)
        assert ffi.buffer(buf, k)[:] == b" world"
    finally:
        llama_cpp.llama_model_free(model)


def test_callbacks() -> None:
    seen: list[float] = []

    @llama_cpp.llama_progress_callback
    def progress(p: float, user_data: object) -> bool:
        seen.append(p)
        return True

    assert ffi.typeof(progress) is ffi.typeof("llama_progress_callback")
    assert progress(0.5, ffi.NULL) is True and seen == [0.5]
    got: list[tuple[int, bytes, object]] = []
    log = llama_cpp.llama_log_callback(lambda level, text, user_data: got.append((level, text, user_data)))
    assert ffi.typeof(log) is ffi.typeof("ggml_log_callback")
    log(2, ffi.new("char[]", b"loaded\n"), ffi.NULL)
    assert got == [(2, b"loaded\n", None)]  # as a ctypes CFUNCTYPE(None, c_int, c_char_p, c_void_p) receives them


# a fresh interpreter: what ``import pyllama_moe as llama_cpp`` binds, and what it loads
FRESH = '''
import sys
import pyllama_moe as llama_cpp
assert "pyllama_moe._cffi" not in sys.modules and "pyllama_moe.llama_cpp" not in sys.modules  # import stays cheap
import pyllama_moe.llama
assert "pyllama_moe.llama_cpp" not in sys.modules  # nor does the Llama class load the low-level module
low = llama_cpp.llama_cpp
assert low is sys.modules["pyllama_moe.llama_cpp"]
assert llama_cpp.llama_chat_format is sys.modules["pyllama_moe.llama_chat_format"]
assert llama_cpp.llama_print_system_info().decode().startswith("PATCH_SERIES")
assert llama_cpp.llama_backend_init is low.llama_backend_init
namespace = {}
exec("from pyllama_moe import *", namespace)
for name in ("Llama", "LlamaGrammar", "llama_cpp", "llama_types", "llama_backend_init", "llama_token",
             "LLAMA_TOKEN_NULL", "llama_log_set", "CreateCompletionResponse", "LlamaPromptLookupDecoding", "c_bool"):
    assert name in namespace, name
assert namespace["llama_tokenize"] is low.llama_tokenize
assert "np" not in namespace and "Any" not in namespace and "annotations" not in namespace
print("ok")
'''


def test_the_package_binds_llama_cpp_lazily() -> None:
    res = subprocess.run([sys.executable, "-c", FRESH], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip() == "ok"
