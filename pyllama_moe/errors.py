"""Exceptions, and the one place where results of C calls are checked."""

from __future__ import annotations

from typing import Any


class LlamaError(RuntimeError):
    """A call into llama.cpp failed."""


class ModelLoadError(LlamaError):
    """The model file could not be loaded (missing, not a GGUF, truncated, unsupported)."""


class ContextError(LlamaError):
    """A context could not be created (out of memory, bad parameters)."""


class DecodeError(LlamaError):
    """``llama_decode`` / ``llama_encode`` returned an error code."""

    def __init__(self, what: str, code: int) -> None:
        super().__init__(f"{what} failed with code {code}: {DECODE_CODES.get(code, 'fatal error')}")
        self.code = code


# llama.h: return values of llama_decode (any other negative value is a fatal error)
DECODE_CODES = {
    1: "no KV slot for the batch (reduce the batch or raise n_ctx)",
    2: "aborted",
    -1: "invalid input batch",
}


def check_ptr(ptr: Any, error: type[LlamaError], message: str) -> Any:
    """Return ``ptr`` unless it is NULL, in which case raise ``error(message)``."""
    from pyllama_moe.ffi import ffi

    if ptr == ffi.NULL:
        raise error(message)
    return ptr


def check_decode(code: int, what: str = "llama_decode") -> None:
    if code != 0:
        raise DecodeError(what, code)
