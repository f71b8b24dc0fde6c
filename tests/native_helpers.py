"""Small drivers over the raw cffi binding for the tests that predate the Python API."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from pyllama_moe import backend
from pyllama_moe.errors import ContextError, ModelLoadError, check_decode, check_ptr
from pyllama_moe.ffi import ffi, lib

EXPERTS = rb"\.ffn_(up|down|gate)_exps"


@contextmanager
def model(path: Path, n_gpu_layers: int = 0, cpu_moe: bool = False, load_mode: int | None = None) -> Iterator[Any]:
    backend.init()
    mparams = lib.llama_model_default_params()
    mparams.n_gpu_layers = n_gpu_layers
    if load_mode is not None:
        mparams.load_mode = load_mode
    keep = []
    if cpu_moe:
        pattern = ffi.new("char[]", EXPERTS)
        overrides = ffi.new("struct llama_model_tensor_buft_override[2]")
        overrides[0].pattern = pattern
        overrides[0].buft = lib.ggml_backend_cpu_buffer_type()
        keep += [pattern, overrides]
        mparams.tensor_buft_overrides = overrides
    m = check_ptr(lib.llama_model_load_from_file(str(path).encode(), mparams), ModelLoadError, f"cannot load {path}")
    try:
        yield m
    finally:
        lib.llama_model_free(m)


def greedy(m: Any, prompt: str, n: int, moe_cache_size: int = 0, n_ctx: int = 256,
           forced: list[int] | None = None) -> tuple[list[int], np.ndarray]:
    """Greedy tokens after ``prompt`` and the logits of every step (n x n_vocab).

    With ``forced``, those tokens are fed instead of the argmax (to compare logits step by step).
    """
    cparams = lib.llama_context_default_params()
    cparams.n_ctx = n_ctx
    cparams.n_batch = n_ctx
    cparams.moe_cache_size = moe_cache_size
    ctx = check_ptr(lib.llama_init_from_model(m, cparams), ContextError, "cannot create the context")
    try:
        vocab = lib.llama_model_get_vocab(m)
        n_vocab = lib.llama_vocab_n_tokens(vocab)
        text = prompt.encode()
        toks = ffi.new("llama_token[]", n_ctx)
        k = lib.llama_tokenize(vocab, text, len(text), toks, n_ctx, True, False)
        assert k > 0
        check_decode(lib.llama_decode(ctx, lib.llama_batch_get_one(toks, k)))
        out, logits, one = [], [], ffi.new("llama_token[1]")
        for _ in range(n):
            row = np.frombuffer(ffi.buffer(lib.llama_get_logits_ith(ctx, -1), n_vocab * 4), dtype=np.float32).copy()
            logits.append(row)
            one[0] = forced[len(out)] if forced else int(row.argmax())
            out.append(one[0])
            check_decode(lib.llama_decode(ctx, lib.llama_batch_get_one(one, 1)))
        return out, np.stack(logits)
    finally:
        lib.llama_free(ctx)
