"""The only global state: llama.cpp's backend, initialised once, and its log bridged to ``logging``.

llama.cpp logs through one process-wide callback; it is installed by ``init()`` (the first model
load or an explicit call), never at import. Messages go to the ``pyllama_moe`` logger at the
matching level, so ``logging.getLogger("pyllama_moe").setLevel(...)`` (or ``Llama(verbose=False)``)
decides what is shown.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from pyllama_moe.ffi import ffi, lib

logger = logging.getLogger("pyllama_moe")

_lock = threading.Lock()
_ready = False
_partial: list[str] = []  # a line that llama.cpp sends in pieces (GGML_LOG_LEVEL_CONT)
_last_level = logging.INFO

_LEVELS = {
    lib.GGML_LOG_LEVEL_NONE: logging.INFO,
    lib.GGML_LOG_LEVEL_DEBUG: logging.DEBUG,
    lib.GGML_LOG_LEVEL_INFO: logging.INFO,
    lib.GGML_LOG_LEVEL_WARN: logging.WARNING,
    lib.GGML_LOG_LEVEL_ERROR: logging.ERROR,
}


@ffi.def_extern()
def pyllama_moe_log_callback(level: int, text: bytes, user_data: object) -> None:
    global _last_level
    msg = ffi.string(text).decode("utf-8", errors="replace")
    if level != lib.GGML_LOG_LEVEL_CONT:
        _last_level = _LEVELS.get(level, logging.INFO)
    _partial.append(msg)
    if msg.endswith("\n"):
        line = "".join(_partial).rstrip("\n")
        _partial.clear()
        if line and logger.isEnabledFor(_last_level):
            logger.log(_last_level, "%s", line)


def init() -> None:
    """Initialise llama.cpp's backends and the log bridge (idempotent, thread-safe)."""
    global _ready
    with _lock:
        if _ready:
            return
        lib.llama_log_set(lib.pyllama_moe_log_callback, ffi.NULL)
        lib.llama_backend_init()
        _ready = True


def system_info() -> str:
    """``llama_print_system_info()``: the patch series, then each backend's features."""
    init()
    return ffi.string(lib.llama_print_system_info()).decode()


@dataclass(frozen=True)
class Device:
    """One ggml backend device (``ggml_backend_dev_*``)."""

    index: int
    name: str
    description: str
    type: str  # "cpu", "gpu", "igpu", "accel", "meta"
    memory_free: int
    memory_total: int


_DEV_TYPES = {
    lib.GGML_BACKEND_DEVICE_TYPE_CPU: "cpu",
    lib.GGML_BACKEND_DEVICE_TYPE_GPU: "gpu",
    lib.GGML_BACKEND_DEVICE_TYPE_IGPU: "igpu",
    lib.GGML_BACKEND_DEVICE_TYPE_ACCEL: "accel",
    lib.GGML_BACKEND_DEVICE_TYPE_META: "meta",
}


def devices() -> list[Device]:
    """The devices llama.cpp can use, in registry order."""
    init()
    out = []
    free, total = ffi.new("size_t *"), ffi.new("size_t *")
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        lib.ggml_backend_dev_memory(dev, free, total)
        out.append(Device(
            index=i,
            name=ffi.string(lib.ggml_backend_dev_name(dev)).decode(),
            description=ffi.string(lib.ggml_backend_dev_description(dev)).decode(),
            type=_DEV_TYPES.get(lib.ggml_backend_dev_type(dev), "other"),
            memory_free=int(free[0]),
            memory_total=int(total[0]),
        ))
    return out


def gpu_available() -> bool:
    """Whether a GPU device (CUDA, ROCm, MUSA, ...) is usable."""
    return any(d.type in ("gpu", "igpu") for d in devices())
