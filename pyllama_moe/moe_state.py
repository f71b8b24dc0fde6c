"""The MoE cache's warm-start file (#46): how often each layer's experts were selected, for one model and shape.

A file written by ``python -m pyllama_moe calibrate`` (or, with the experts it held, by a ``Llama`` at close:
:mod:`.moe_warm`) is read back at load to fill the cache with the most used experts before the first token.
This module owns the format; it neither reads nor fills a cache.

The format (version 1) is UTF-8 JSON, one object::

    {"format": "pyllama-moe-cache-state", "version": 1, "model_id": "<Model.fingerprint()>", "n_layer": 48,
     "n_expert": 128, "n_tokens": 4096, "source": "calibrate", "counts": [[...128 integers...], ...48 rows...]}

``counts[il][e]`` is how often layer ``il``'s expert ``e`` was selected over ``n_tokens`` tokens, an integer in
``[0, 2**64)``; the rows of dense layers are zeros. Other keys are ignored (a later writer of version 1 may add
some); nothing in the file is executed. :func:`load` gives ``None`` for a file it cannot use (with a warning on the
``pyllama_moe`` logger saying why, none for a file that does not exist) and never raises for a file's content.

Public API: :class:`MoeCacheState`, :func:`save`, :func:`load`, :data:`FORMAT`, :data:`VERSION`,
:data:`MAX_FILE_BYTES`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import secrets
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

logger = logging.getLogger("pyllama_moe")

__all__ = ["FORMAT", "MAX_FILE_BYTES", "SOURCES", "VERSION", "MoeCacheState", "load", "save"]

FORMAT = "pyllama-moe-cache-state"
VERSION = 1
SOURCES = ("calibrate", "run")
# a file larger than this is refused unread: 1M counts of 20 digits and a separator take 22 MiB
MAX_FILE_BYTES = 32 * 1024 * 1024
# layers x experts of a state: far above any model's (DeepSeek-V3: 61 x 256), small enough to hold
MAX_COUNTS = 1 << 20
_U64 = 1 << 64


def _check_int(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < low:
        raise ValueError(f"{name} must be at least {low}, got {value}")
    return int(value)


def _check_shape(n_layer: Any, n_expert: Any) -> tuple[int, int]:
    n_layer, n_expert = _check_int("n_layer", n_layer, 1), _check_int("n_expert", n_expert, 1)
    if n_layer * n_expert > MAX_COUNTS:
        raise ValueError(f"n_layer x n_expert must be at most {MAX_COUNTS}, got {n_layer} x {n_expert}")
    return n_layer, n_expert


def _check_model_id(model_id: Any) -> str:
    if not isinstance(model_id, str):
        raise TypeError(f"model_id must be a str, got {type(model_id).__name__}")
    if not model_id:
        raise ValueError("model_id must not be empty")
    return model_id


@dataclasses.dataclass(frozen=True, eq=False)
class MoeCacheState:
    """The per-expert use counts of one model's MoE layers: ``counts[il, e]`` selections of layer ``il``'s expert
    ``e`` over ``n_tokens`` tokens (a read-only ``uint64`` copy of what was given; rows of dense layers are zeros).
    ``model_id`` is the model's ``Model.fingerprint()``, ``source`` what counted: ``"calibrate"`` or ``"run"``.
    Compared by identity (``counts`` is an array): compare the fields."""

    model_id: str
    n_layer: int
    n_expert: int
    counts: npt.NDArray[np.unsignedinteger[Any]]  # uint32 or uint64 given, a uint64 copy kept
    n_tokens: int
    source: str

    def __post_init__(self) -> None:
        _check_model_id(self.model_id)
        n_layer, n_expert = _check_shape(self.n_layer, self.n_expert)
        _check_int("n_tokens", self.n_tokens, 0)
        if self.source not in SOURCES:
            raise ValueError(f"source must be one of {', '.join(SOURCES)}, got {self.source!r}")
        counts = self.counts
        if not isinstance(counts, np.ndarray):
            raise TypeError(f"counts must be a numpy array, got {type(counts).__name__}")
        if counts.dtype not in (np.uint32, np.uint64):
            raise TypeError(f"counts must be uint32 or uint64, got {counts.dtype}")
        if counts.shape != (n_layer, n_expert):
            raise ValueError(f"counts must have the shape (n_layer, n_expert) = {(n_layer, n_expert)}, "
                             f"got {counts.shape}")
        frozen = counts.astype(np.uint64, copy=True)
        frozen.flags.writeable = False
        object.__setattr__(self, "counts", frozen)
        object.__setattr__(self, "n_layer", n_layer)
        object.__setattr__(self, "n_expert", n_expert)
        object.__setattr__(self, "n_tokens", int(self.n_tokens))


def _check_path(path: Any) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    return Path(path)


def save(state: MoeCacheState, path: str | os.PathLike[str]) -> None:
    """Write ``state`` to ``path`` at once: a temporary file beside it, then renamed over it (a reader sees the old
    file or the new one, never a part). Errors of the file system (``OSError``) are raised."""
    if not isinstance(state, MoeCacheState):
        raise TypeError(f"state must be a MoeCacheState, got {type(state).__name__}")
    dst = _check_path(path)
    doc = {"format": FORMAT, "version": VERSION, "model_id": state.model_id, "n_layer": state.n_layer,
           "n_expert": state.n_expert, "n_tokens": state.n_tokens, "source": state.source,
           "counts": state.counts.tolist()}
    data = json.dumps(doc, separators=(",", ":")).encode("utf-8")
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    # O_EXCL: a name of our own; mode 0o666 less the umask, as any file the user writes
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, dst)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class _Refused(Exception):
    """Why a file is not used (the warning's text)."""


def _read(path: Path) -> dict[str, Any] | None:
    """The file's JSON object; None when there is no file."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_FILE_BYTES:
                raise _Refused(f"the file has {size} bytes, more than a state can ({MAX_FILE_BYTES})")
            data = f.read(MAX_FILE_BYTES + 1)  # the file may grow after the stat
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise _Refused("it is a directory") from None
    except OSError as e:
        raise _Refused(f"cannot read it: {e.strerror or e}") from None
    if len(data) > MAX_FILE_BYTES:
        raise _Refused(f"the file has more than {MAX_FILE_BYTES} bytes")
    try:
        doc = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise _Refused("it is not UTF-8 text") from None
    except (ValueError, RecursionError) as e:
        raise _Refused(f"it is not JSON ({str(e)[:100]})") from None
    if not isinstance(doc, dict):
        raise _Refused(f"it holds a JSON {type(doc).__name__}, not an object")
    return doc


def _field(doc: dict[str, Any], name: str, kind: type) -> Any:
    if name not in doc:
        raise _Refused(f"it has no {name!r}")
    value = doc[name]
    if isinstance(value, bool) or not isinstance(value, kind):
        raise _Refused(f"its {name!r} is a {type(value).__name__}, not a {kind.__name__}")
    return value


def _counts(value: Any, n_layer: int, n_expert: int) -> npt.NDArray[np.uint64]:
    if not isinstance(value, list) or len(value) != n_layer:
        got = f"{len(value)} rows" if isinstance(value, list) else f"a {type(value).__name__}"
        raise _Refused(f"its counts are {got}, not {n_layer} rows")
    out = np.zeros((n_layer, n_expert), dtype=np.uint64)
    for il, row in enumerate(value):
        if not isinstance(row, list) or len(row) != n_expert:
            got = f"{len(row)} counts" if isinstance(row, list) else f"a {type(row).__name__}"
            raise _Refused(f"its counts of layer {il} are {got}, not {n_expert}")
        for e, c in enumerate(row):
            if isinstance(c, bool) or not isinstance(c, int):
                raise _Refused(f"its count of layer {il} expert {e} is not an integer ({repr(c)[:40]})")
            if not 0 <= c < _U64:
                raise _Refused(f"its count of layer {il} expert {e} is out of range ({c})")
        out[il] = row
    return out


def _state(doc: dict[str, Any], model_id: str, n_layer: int, n_expert: int) -> MoeCacheState:
    fmt = doc.get("format")
    if fmt != FORMAT:
        raise _Refused(f"its format is {str(fmt)[:60]!r}, not {FORMAT!r}")
    version = doc.get("version")
    if version != VERSION or isinstance(version, bool):
        raise _Refused(f"its version is {str(version)[:20]}, this reader knows {VERSION}")
    file_id = _field(doc, "model_id", str)
    file_layers, file_experts = _field(doc, "n_layer", int), _field(doc, "n_expert", int)
    n_tokens = _field(doc, "n_tokens", int)
    source = _field(doc, "source", str)
    if n_tokens < 0:
        raise _Refused(f"its n_tokens is negative ({n_tokens})")
    if source not in SOURCES:
        raise _Refused(f"its source is {source[:40]!r}, not one of {', '.join(SOURCES)}")
    # the key: another model, or another cache shape, is not this one's
    if file_id != model_id:
        raise _Refused(f"it was written for another model (model_id {file_id[:64]!r}, this one is {model_id!r})")
    if (file_layers, file_experts) != (n_layer, n_expert):
        raise _Refused(f"its shape is {file_layers} layers x {file_experts} experts, this model's "
                       f"{n_layer} x {n_expert}")
    counts = _counts(doc.get("counts"), n_layer, n_expert)
    return MoeCacheState(model_id, n_layer, n_expert, counts, n_tokens, source)


def load(path: str | os.PathLike[str], model_id: str, n_layer: int, n_expert: int) -> MoeCacheState | None:
    """The state in ``path`` if it was written for this model (``model_id``: its ``Model.fingerprint()``) and shape
    (``n_layer`` blocks of ``n_expert`` experts), else None: without a word when there is no file (a first run), with
    a warning saying why when the file is of another model or shape, corrupt, or too large (refused unread). Raises
    ``TypeError``/``ValueError`` only for bad arguments."""
    src = _check_path(path)
    model_id = _check_model_id(model_id)
    n_layer, n_expert = _check_shape(n_layer, n_expert)
    try:
        doc = _read(src)
        if doc is None:
            return None
        return _state(doc, model_id, n_layer, n_expert)
    except _Refused as e:
        logger.warning("MoE cache state %s ignored: %s", src, e)
        return None
