"""Exceptions, and the one place where results of C calls are checked.

llama.cpp reports why a call failed only through its log; ``backend``'s log bridge records the
error lines here (``note_native_error``), and the checks below add the lines logged since the call
began (``native_mark``) to the exception's message.
"""

from __future__ import annotations

import itertools
from collections import deque
from enum import IntEnum
from typing import Any


class LlamaError(RuntimeError):
    """A call into llama.cpp failed."""


class ModelLoadError(LlamaError):
    """The model file could not be loaded (missing, not a GGUF, truncated, unsupported)."""


class ModelNotFoundError(ModelLoadError, ValueError, FileNotFoundError):
    """The model path does not exist.

    Also a ``ValueError`` (llama-cpp-python raises ``ValueError("Model path does not exist: ...")``)
    and a ``FileNotFoundError``, so code written for either keeps working.
    """


class RpcServerError(LlamaError, ValueError, ConnectionError):
    """A server of ``rpc_servers`` does not answer: a ``ValueError`` naming the argument (what llama-cpp-python raises
    for a model it cannot load) and a ``ConnectionError`` (the cause)."""


class ContextError(LlamaError):
    """A context could not be created (out of memory, bad parameters)."""


class ContextLengthError(ValueError):
    """A prompt does not fit the context: the ``ValueError`` llama-cpp-python raises, with the figures (the
    server answers it as OpenAI does, ``context_length_exceeded``)."""

    def __init__(self, n_requested: int, n_ctx: int, at_least: bool = False) -> None:
        # at_least: n_requested is a bound from the prompt's length, which was refused before it was tokenized
        super().__init__(f"Requested tokens ({'at least ' if at_least else ''}{n_requested}) exceed context window "
                         f"of {n_ctx}")
        self.n_requested = n_requested
        self.n_ctx = n_ctx
        self.at_least = at_least


class ContextSizeError(ContextError, ValueError):
    """``n_ctx`` asks for a KV cache larger than the memory there is: refused before llama.cpp allocates it (a
    ``ContextError``, what the failed allocation gave, and a ``ValueError`` naming ``n_ctx``)."""


class ClosedError(LlamaError):
    """An object was used after ``close()``."""


class GrammarError(ValueError):
    """A grammar does not parse, or would crash llama.cpp's parser (a ValueError naming ``grammar``)."""


class SchemaError(ValueError):
    """A JSON schema uses something :func:`pyllama_moe.json_schema.json_schema_to_gbnf` cannot express."""


class InvalidSchemaError(SchemaError):
    """A JSON schema that is wrong (reversed or negative bounds, an unknown type, a ``$ref`` that resolves to nothing,
    nested deeper than ``SCHEMA_MAX_DEPTH``) or whose grammar would be past the grammar checks' bounds: refused, where
    a schema that is only beyond the converter falls back to plain JSON."""


class ProjectorLoadError(ModelLoadError, ValueError):
    """A multimodal projector (``clip_model_path``, an mmproj GGUF) could not be loaded, or does not fit the text
    model: a ``ValueError`` too, which llama-cpp-python raises for it."""


class ImageError(ValueError):
    """An image that cannot be used: not an image, truncated, too large, or refused by the projector's
    preprocessing."""


class MediaMismatchError(ValueError):
    """A prompt's media markers and the images given do not match in number."""


class ChatFormatNotFoundError(ValueError):
    """No chat format or handler is registered under that name."""


class DecodeStatus(IntEnum):
    """llama.h: the return values of ``llama_decode`` (any other negative value is a fatal error)."""

    OK = 0
    NO_KV_SLOT = 1
    """No KV slot for the batch: reduce the batch or raise n_ctx."""
    ABORTED = 2
    """The abort callback returned true."""
    INVALID_BATCH = -1
    """The batch was invalid."""


DECODE_CODES: dict[int, str] = {
    DecodeStatus.NO_KV_SLOT: "no KV slot for the batch (reduce the batch or raise n_ctx)",
    DecodeStatus.ABORTED: "aborted",
    DecodeStatus.INVALID_BATCH: "invalid input batch",
}


class DecodeError(LlamaError):
    """``llama_decode`` / ``llama_encode`` returned an error code."""

    def __init__(self, what: str, code: int) -> None:
        super().__init__(f"{what} failed with code {code}: {DECODE_CODES.get(code, 'fatal error')}")
        self.code = code

# llama.cpp error lines, numbered, so a check can name the ones logged during its call
_native_errors: deque[tuple[int, str]] = deque(maxlen=16)
_counter = itertools.count(1)
_last = 0


def note_native_error(line: str) -> None:
    """Record an error line of llama.cpp's log (called by the log bridge)."""
    global _last
    _last = next(_counter)
    _native_errors.append((_last, line.strip()))


def native_mark() -> int:
    """A mark to pass to the checks: only error lines logged after it are quoted."""
    return _last


def _native_detail(since: int) -> str:
    lines = list(dict.fromkeys(line for n, line in _native_errors if n > since))
    return (": " + "; ".join(lines)) if lines else ""


def check_ptr(ptr: Any, error: type[Exception], message: str, since: int | None = None) -> Any:
    """Return ``ptr`` unless it is NULL, in which case raise ``error(message)``.

    With ``since`` (a ``native_mark()``), the llama.cpp error lines logged since then are added.
    """
    from pyllama_moe.ffi import ffi

    if ptr == ffi.NULL:
        raise error(message + (_native_detail(since) if since is not None else ""))
    return ptr


def check_decode(code: int, what: str = "llama_decode") -> None:
    if code != DecodeStatus.OK:
        raise DecodeError(what, code)


def check_size(n: int, expected: int, what: str, since: int | None = None) -> int:
    """State functions return the bytes they copied: anything but ``expected`` is a failure (with ``since``, the
    llama.cpp error lines logged since then say why)."""
    if n != expected:
        if since is not None:  # ``what`` says it all, the log lines say why
            raise LlamaError(what + (_native_detail(since) or ": llama.cpp logged no reason"))
        raise LlamaError(f"{what} copied {n} bytes, expected {expected}")
    return n


def check_true(ok: bool, error: type[Exception], message: str, since: int | None = None) -> None:
    """Raise ``error(message)`` when a C function returned false."""
    if not ok:
        raise error(message + (_native_detail(since) if since is not None else ""))


def check_tokenize(n: int, capacity: int) -> int:
    """``llama_tokenize``: >= 0 tokens written; < 0 minus the count needed (INT32_MIN on overflow)."""
    if n == -(2**31):
        raise ValueError("the text is too long to tokenize (more than 2**31 tokens)")
    return n


def check_fit_status(status: int, since: int) -> bool:
    """``pyllama_moe_fit_params``: 0 fitted, 1 could not fit (parameters left as they were), 2 error."""
    if status == 2:
        raise ModelLoadError("fitting the parameters to device memory failed" + _native_detail(since))
    return status == 0


def check_mtmd_tokenize(code: int, n_markers: int, n_bitmaps: int, since: int) -> None:
    """``mtmd_tokenize``: 0 success, 1 markers and bitmaps differ in number, 2 an image's preprocessing failed."""
    if code == 1:
        raise MediaMismatchError(f"the prompt has {n_markers} media markers for {n_bitmaps} images")
    if code != 0:
        raise ImageError(f"the projector could not preprocess an image (mtmd_tokenize returned {code})"
                         + _native_detail(since))


def check_mtmd_eval(code: int, since: int, fn: str = "mtmd_helper_eval_chunks") -> None:
    """``mtmd_helper_eval_chunks`` (or ``fn``, its one-chunk form): 0 success; otherwise an image's encoding or a
    decode failed."""
    if code != 0:
        raise LlamaError(f"evaluating the prompt's text and images failed ({fn} returned {code})"
                         + (_native_detail(since) or ": llama.cpp logged no reason"))


def check_closed(ptr: Any, what: str) -> Any:
    """Return the handle unless the object was closed."""
    if ptr is None:
        raise ClosedError(f"this {what} has been closed; create a new one")
    return ptr
