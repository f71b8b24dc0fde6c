"""The only global state: llama.cpp's backend, initialised once, and its log bridged to ``logging``.

llama.cpp logs through one process-wide callback; it is installed by ``init()`` (the first model
load or an explicit call), never at import. Messages go to the ``pyllama_moe`` logger at the
matching level, so ``logging.getLogger("pyllama_moe").setLevel(...)`` (or ``Llama(verbose=False)``)
decides what is shown.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from pyllama_moe.errors import LlamaError, check_true, native_mark, note_native_error
from pyllama_moe.ffi import ffi, lib

logger = logging.getLogger("pyllama_moe")

_lock = threading.Lock()
_ready = False
_local = threading.local()  # .quiet: depth of verbosity(False) blocks on this thread
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


def h2d_bandwidth(device: Device, n_bytes: int = 1 << 30, reps: int = 3,
                  mapped: str | os.PathLike[str] | None = None) -> dict[str, float]:
    """Host-to-device copy bandwidth to ``device`` in GB/s, from pinned (``pinned``; absent if the device has
    no pinned host buffer type) and pageable (``pageable``) memory, copied as llama.cpp uploads weights; with
    ``mapped`` (a file, e.g. the model), also from that file's first ``n_bytes`` mapped read-only (``mapped``:
    page-cache pages, as load mode mmap uploads them; absent where files cannot be mapped)."""
    init()
    pinned, pageable, from_file = ffi.new("double *"), ffi.new("double *"), ffi.new("double *")
    path = ffi.new("char[]", os.fsencode(mapped)) if mapped is not None else ffi.NULL
    mark = native_mark()
    rc = lib.pyllama_moe_h2d_bandwidth(device.index, n_bytes, reps, path, pinned, pageable, from_file)
    check_true(rc == 0, LlamaError, f"cannot measure the copy bandwidth to {device.name}", mark)
    out = {"pinned": pinned[0] / 1e9} if pinned[0] > 0 else {}
    out["pageable"] = pageable[0] / 1e9
    if from_file[0] > 0:
        out["mapped"] = from_file[0] / 1e9
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


_rpc_servers: set[str] = set()


def _check_reachable(endpoint: str) -> None:
    import socket

    host, sep, port = endpoint.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"rpc_servers: {endpoint!r} is not host:port")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=10).close()
    except OSError as e:
        raise ConnectionError(f"rpc_servers: no llama.cpp RPC server answers at {endpoint} ({e})") from e


def add_rpc_servers(servers: str | list[str]) -> None:
    """Make the devices of llama.cpp RPC servers (``host:port``, a list or a comma list) usable.

    As llama.cpp's ``--rpc``: each server's devices join the registry, and models then place
    layers on them like on local GPUs. Unreachable servers raise ConnectionError.
    """
    init()
    names = [s.strip() for s in (servers.split(",") if isinstance(servers, str) else servers)]
    if not names or not all(names):
        raise ValueError(f"rpc_servers: expected host:port entries, got {servers!r}")
    if not hasattr(lib, "ggml_backend_rpc_add_server"):
        raise ValueError("rpc_servers: this build has no RPC backend (GGML_RPC)")
    with _lock:
        for name in names:
            if name in _rpc_servers:
                continue
            _check_reachable(name)  # ggml's RPC client aborts the process on a failed connection
            reg = lib.ggml_backend_rpc_add_server(name.encode())
            if reg == ffi.NULL:
                raise ConnectionError(f"rpc_servers: no llama.cpp RPC server answers at {name}")
            lib.ggml_backend_register(reg)
            _rpc_servers.add(name)


def model_devices(rpc_servers: str | list[str] | None) -> list[Any] | None:
    """``llama_model_params.devices`` for a model, or None for llama.cpp's own choice.

    RPC devices stay in the process's registry once added, and llama.cpp's default choice takes
    every device that says "GPU": a model must use only the RPC servers it asked for. So as soon as
    any is registered, the list is explicit: the requested RPC devices, then the local GPUs (the
    integrated ones only without a discrete one), as llama.cpp's default orders them.
    """
    devs = devices()
    if not any(d.type == "rpc" for d in devs):
        return None
    wanted = {s.strip() for s in (rpc_servers.split(",") if isinstance(rpc_servers, str) else rpc_servers or [])}
    local = [d for d in devs if d.type == "gpu"] or [d for d in devs if d.type == "igpu"]
    chosen = [d for d in devs if d.type == "rpc" and d.description in wanted] + local
    return [lib.ggml_backend_dev_get(d.index) for d in chosen]


def serve_rpc(endpoint: str, n_threads: int, device: str = "CPU", cache_dir: str | None = None) -> None:
    """Run a llama.cpp RPC server on ``endpoint`` (``host:port``) with a local device; blocks."""
    init()
    dev = lib.ggml_backend_dev_by_name(device.encode())
    if dev == ffi.NULL:
        raise ValueError(f"device {device!r} not found; devices: {', '.join(d.name for d in devices())}")
    devs = ffi.new("ggml_backend_dev_t[1]", [dev])
    lib.ggml_backend_rpc_start_server(endpoint.encode(), cache_dir.encode() if cache_dir else ffi.NULL,
                                      n_threads, 1, devs)


def numa_init(numa: bool | int) -> None:
    """llama-cpp-python's ``numa``: True distributes, an int is a ``GGML_NUMA_STRATEGY_*``, False does nothing."""
    strategy = (lib.GGML_NUMA_STRATEGY_DISTRIBUTE if numa else lib.GGML_NUMA_STRATEGY_DISABLED) \
        if isinstance(numa, bool) else numa
    if strategy != lib.GGML_NUMA_STRATEGY_DISABLED:
        lib.llama_numa_init(strategy)
