"""The vocabulary a synthetic model copies: the ``tokenizer.*`` keys of a vocab-only GGUF, read without gguf-py."""

from __future__ import annotations

import functools
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

VOCAB_ENV = "PYLLAMA_MOE_VOCAB"
VOCAB_FILE = "ggml-vocab-qwen2.gguf"
QWEN2_N_VOCAB = 151936  # tokens in ggml-vocab-qwen2.gguf, used by plan() when no vocab is given


@dataclass(frozen=True)
class _Vocab:
    """The ``tokenizer.*`` key-value pairs of a vocab GGUF, ready for GGUFWriter.add_key_value."""

    entries: tuple[tuple[str, Any, int, int | None], ...]  # key, value, GGUFValueType, array sub-type
    n_tokens: int


def default_vocab_path() -> Path:
    """The vocabulary GGUF to copy: ``$PYLLAMA_MOE_VOCAB``, the packaged one, or the vendored one.

    Looks in order at the environment variable ``PYLLAMA_MOE_VOCAB``, at
    ``<package>/data/ggml-vocab-qwen2.gguf`` and at
    ``<repository>/vendor/llama.cpp/models/ggml-vocab-qwen2.gguf``.
    """
    env = os.environ.get(VOCAB_ENV)
    if env:
        path = Path(env).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"{VOCAB_ENV}={env} does not name a file")
        return path
    import pyllama_moe

    try:  # the package's data (a source checkout also looks at the installed copy's)
        return pyllama_moe.data_file(VOCAB_FILE)
    except FileNotFoundError:
        pass
    # the package's own folder is the first: in a source checkout, the repository's vendored tree is beside it
    repository = Path(pyllama_moe.__path__[0]).resolve().parent
    vendored = repository / "vendor" / "llama.cpp" / "models" / VOCAB_FILE
    if vendored.is_file():
        return vendored
    raise FileNotFoundError(
        f"no vocabulary GGUF found: set {VOCAB_ENV} to a vocab-only GGUF (e.g. llama.cpp's models/{VOCAB_FILE}) "
        f"or pass vocab_path; looked at pyllama_moe/data/{VOCAB_FILE} and {vendored}"
    )


def _load_vocab(path: Path) -> _Vocab:
    """The vocabulary of the GGUF at ``path`` (cached while the file is unchanged)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"vocab_path {path} does not name a file")
    st = path.stat()
    return _load_vocab_cached(str(path.resolve()), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=4)
def _load_vocab_cached(path: str, mtime_ns: int, size: int) -> _Vocab:
    """:func:`_load_vocab` behind a cache keyed by the file's identity."""
    try:
        kv = _read_gguf_kv(Path(path).read_bytes())
    except (ValueError, struct.error, IndexError) as e:
        raise ValueError(f"vocab_path {path} is not a readable GGUF file: {e}") from e
    entries = tuple((k, v, t, sub) for k, (v, t, sub) in kv.items() if k.startswith("tokenizer."))
    tokens = kv.get("tokenizer.ggml.tokens")
    if tokens is None or tokens[1] != _GGUF_ARRAY or tokens[2] != _GGUF_STRING or not tokens[0]:
        raise ValueError(f"vocab_path {path} has no tokenizer.ggml.tokens string array")
    return _Vocab(entries, len(tokens[0]))


# GGUF value types (gguf.GGUFValueType) and the struct format of the fixed-size ones
_GGUF_STRING = 8
_GGUF_ARRAY = 9
_GGUF_SCALARS: dict[int, str] = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
                                 12: "d"}


def _read_gguf_kv(data: bytes) -> dict[str, tuple[Any, int, int | None]]:
    """The key-value section of a little-endian GGUF (v2/v3): key -> (value, type, array sub-type).

    Strings stay bytes, so they are copied exactly. (gguf.GGUFReader reads the same, but takes
    seconds on a 150k-token vocabulary; this takes a fraction of one.)
    """
    if data[:4] != b"GGUF":
        raise ValueError("no GGUF magic")
    version, _n_tensors, n_kv = struct.unpack_from("<IQQ", data, 4)
    if version not in (2, 3):
        raise ValueError(f"unsupported GGUF version {version}")
    off = 24
    out: dict[str, tuple[Any, int, int | None]] = {}
    for _ in range(n_kv):
        key, off = _read_str(data, off)
        (vtype,) = struct.unpack_from("<I", data, off)
        off += 4
        if vtype == _GGUF_ARRAY:
            sub, count = struct.unpack_from("<IQ", data, off)
            off += 12
            value, off = _read_array(data, off, sub, count)
            out[key.decode()] = (value, vtype, sub)
        else:
            value, off = _read_scalar(data, off, vtype)
            out[key.decode()] = (value, vtype, None)
    return out


def _read_str(data: bytes, off: int) -> tuple[bytes, int]:
    """A GGUF string at ``off`` and the offset after it."""
    (n,) = struct.unpack_from("<Q", data, off)
    end = off + 8 + n
    if end > len(data):
        raise ValueError("string runs past the end of the file")
    return data[off + 8 : end], end


def _read_scalar(data: bytes, off: int, vtype: int) -> tuple[Any, int]:
    """A GGUF string or fixed-size value at ``off`` and the offset after it."""
    if vtype == _GGUF_STRING:
        return _read_str(data, off)
    fmt = _GGUF_SCALARS.get(vtype)
    if fmt is None:
        raise ValueError(f"unknown GGUF value type {vtype}")
    return struct.unpack_from("<" + fmt, data, off)[0], off + struct.calcsize(fmt)


def _read_array(data: bytes, off: int, sub: int, count: int) -> tuple[list[Any], int]:
    """A GGUF array of ``count`` values of type ``sub`` at ``off`` and the offset after it."""
    if sub == _GGUF_STRING:
        items = []
        for _ in range(count):
            item, off = _read_str(data, off)
            items.append(item)
        return items, off
    fmt = _GGUF_SCALARS.get(sub)
    if fmt is None:
        raise ValueError(f"unsupported GGUF array type {sub}")
    size = struct.calcsize(fmt)
    dtype = np.dtype("<" + fmt) if fmt != "?" else np.dtype(np.bool_)
    if off + size * count > len(data):
        raise ValueError("array runs past the end of the file")
    return np.frombuffer(data, dtype=dtype, count=count, offset=off).tolist(), off + size * count
