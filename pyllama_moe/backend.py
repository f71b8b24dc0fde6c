"""The only global state: llama.cpp's backend, initialised once, and its log bridged to ``logging``.

llama.cpp logs through one process-wide callback; it is installed by ``init()`` (the first model
load or an explicit call), never at import. Messages go to the ``pyllama_moe`` logger at the
matching level, so ``logging.getLogger("pyllama_moe").setLevel(...)`` (or ``Llama(verbose=False)``)
decides what is shown. A program that sets its own callback (``llama_cpp.llama_log_set``, through
``set_log``) keeps it: ``init()`` then installs no bridge.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from pyllama_moe.errors import note_native_error
from pyllama_moe.ffi import ffi, lib

logger = logging.getLogger("pyllama_moe")

_lock = threading.Lock()
_ready = False
_local = threading.local()  # .quiet: depth of verbosity(False) blocks on this thread
_partial: list[str] = []  # a line that llama.cpp sends in pieces (GGML_LOG_LEVEL_CONT)
_last_level = logging.INFO
# what llama_cpp.llama_log_set installed instead of the bridge (kept alive while C may call it); None: the bridge
_user_log: tuple[Any, ...] | None = None
# the same for libmtmd's log (mtmd_cpp.mtmd_log_set)
_user_mtmd_log: tuple[Any, ...] | None = None

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
        if line and _last_level >= logging.ERROR:
            note_native_error(line)
        if line and not getattr(_local, "quiet", 0) and logger.isEnabledFor(_last_level):
            logger.log(_last_level, "%s", line)


@contextlib.contextmanager
def verbosity(verbose: bool) -> Iterator[None]:
    """Within the block, on this thread, llama.cpp's log is dropped unless ``verbose``.

    Error lines are still recorded for the exceptions (``errors.note_native_error``).
    """
    if verbose:
        yield
        return
    _local.quiet = getattr(_local, "quiet", 0) + 1
    try:
        yield
    finally:
        _local.quiet -= 1


class _StderrHandler(logging.Handler):
    """Writes to the current ``sys.stderr`` (looked up at each record, so captures see it)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
        except Exception:  # noqa: BLE001  # pragma: no cover - a closed or broken stream
            self.handleError(record)


_stderr_handler: _StderrHandler | None = None


def show_log_on_stderr() -> None:
    """``Llama(verbose=True)`` as in llama-cpp-python: llama.cpp's log is printed on stderr.

    Only when the application configured no logging at all (no handler would receive the
    ``pyllama_moe`` records); otherwise its configuration decides.
    """
    global _stderr_handler
    if _stderr_handler is not None or logger.hasHandlers():
        return
    _stderr_handler = _StderrHandler(logging.INFO)
    _stderr_handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(_stderr_handler)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)


# -- callbacks from C into Python: user_data is a handle (ffi.new_handle) to a _Callback


class _Callback:
    """A Python callable that C calls through ``user_data``; an exception it raises is kept and
    stops the C operation (the caller re-raises it with ``reraise()``)."""

    def __init__(self, fn: Callable[..., bool]) -> None:
        self.fn = fn
        self.error: BaseException | None = None
        self.stopped = False  # the callback asked C to stop
        self.handle = ffi.new_handle(self)  # alive as long as this object

    def reraise(self) -> None:
        if self.error is not None:
            err, self.error = self.error, None
            raise err


def callback(fn: Callable[..., bool]) -> _Callback:
    """Wrap ``fn`` for ``pyllama_moe_progress_callback`` / ``pyllama_moe_abort_callback``."""
    return _Callback(fn)


@ffi.def_extern(error=False)
def pyllama_moe_progress_callback(progress: float, user_data: Any) -> bool:
    cb = ffi.from_handle(user_data)
    try:
        go_on = bool(cb.fn(progress))
    except BaseException as e:  # noqa: BLE001 - kept and re-raised after the load stops
        cb.error, go_on = e, False
    cb.stopped = cb.stopped or not go_on
    return go_on


@ffi.def_extern(error=True)
def pyllama_moe_abort_callback(user_data: Any) -> bool:
    cb = ffi.from_handle(user_data)
    try:
        return bool(cb.fn())
    except BaseException as e:  # noqa: BLE001 - kept and re-raised after the decode stops
        cb.error = e
        return True


def init() -> None:
    """Initialise llama.cpp's backends and the log bridge (idempotent, thread-safe)."""
    global _ready
    with _lock:
        if _ready:
            return
        if _user_log is None:
            lib.llama_log_set(lib.pyllama_moe_log_callback, ffi.NULL)
        if _user_mtmd_log is None:  # libmtmd logs through a callback of its own (the helpers' sets both)
            lib.mtmd_helper_log_set(lib.pyllama_moe_log_callback, ffi.NULL)
        lib.llama_backend_init()
        _ready = True


def set_log(callback: Any, user_data: Any, keep: object) -> None:
    """``llama_log_set`` of :mod:`pyllama_moe.llama_cpp`: the caller's callback replaces the bridge to ``logging``,
    now and at ``init()``; ``keep`` (what the C pointers point into) lives until the next call."""
    global _user_log
    with _lock:
        lib.llama_log_set(callback, user_data)
        _user_log = (callback, user_data, keep)


def set_mtmd_log(callback: Any, user_data: Any, keep: object, helper: bool = False) -> None:
    """``mtmd_log_set`` (``helper``: ``mtmd_helper_log_set``) of :mod:`pyllama_moe.mtmd_cpp`: as :func:`set_log`, for
    libmtmd's log."""
    global _user_mtmd_log
    with _lock:
        (lib.mtmd_helper_log_set if helper else lib.mtmd_log_set)(callback, user_data)
        _user_mtmd_log = (callback, user_data, keep)


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
        reg = ffi.string(lib.ggml_backend_reg_name(lib.ggml_backend_dev_backend_reg(dev))).decode()
        free[0] = total[0] = 0
        if not reg.startswith("RPC"):  # asking a server that is gone aborts the process
            lib.ggml_backend_dev_memory(dev, free, total)
        out.append(Device(
            index=i,
            name=ffi.string(lib.ggml_backend_dev_name(dev)).decode(),
            description=ffi.string(lib.ggml_backend_dev_description(dev)).decode(),
            # an RPC device says "GPU" whatever the server runs: it is remote, not a local GPU
            type="rpc" if reg.startswith("RPC") else _DEV_TYPES.get(lib.ggml_backend_dev_type(dev), "other"),
            memory_free=int(free[0]),
            memory_total=int(total[0]),
        ))
    return out


def gpus() -> list[Device]:
    """The GPU devices (CUDA, ROCm, MUSA, ...), in registry order."""
    return [d for d in devices() if d.type in ("gpu", "igpu")]


def gpu_available() -> bool:
    """Whether a GPU device is usable."""
    return bool(gpus())


def buffer_types() -> dict[str, Any]:
    """Every buffer type a tensor can be placed in, by name (``CPU``, ``CUDA0``, ``CUDA_Host``...):
    each device's own buffer type and its host buffer type, as ``-ot`` resolves them."""
    init()
    out: dict[str, Any] = {}
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        for buft in (lib.ggml_backend_dev_buffer_type(dev), lib.ggml_backend_dev_host_buffer_type(dev)):
            if buft != ffi.NULL:
                out.setdefault(ffi.string(lib.ggml_backend_buft_name(buft)).decode(), buft)
    return out


def numa_init(strategy: int) -> None:
    """llama-cpp-python's ``numa`` (a ``GGML_NUMA_STRATEGY_*``, from ``params.check_numa``): disabled does nothing."""
    if strategy != lib.GGML_NUMA_STRATEGY_DISABLED:
        lib.llama_numa_init(strategy)
