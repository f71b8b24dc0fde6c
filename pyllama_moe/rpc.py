"""llama.cpp's RPC backend: the devices of remote servers as a model's devices (``Llama(rpc_servers=...)``), and a
server of this machine's device (``python -m pyllama_moe rpc-server``). The servers added stay in the process's
registry, as llama.cpp's ``--rpc`` leaves them.
"""

from __future__ import annotations

import threading
from typing import Any

from pyllama_moe import backend
from pyllama_moe.errors import RpcServerError
from pyllama_moe.ffi import ffi, lib
from pyllama_moe.params import check_threads

_lock = threading.Lock()
_rpc_servers: set[str] = set()


def _check_reachable(endpoint: str) -> None:
    import socket

    host, sep, port = endpoint.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"rpc_servers: {endpoint!r} is not host:port")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=10).close()
    except OSError as e:
        raise RpcServerError(f"rpc_servers: no llama.cpp RPC server answers at {endpoint} ({e})") from e


def add_rpc_servers(servers: str | list[str]) -> None:
    """Make the devices of llama.cpp RPC servers (``host:port``, a list or a comma list) usable.

    As llama.cpp's ``--rpc``: each server's devices join the registry, and models then place
    layers on them like on local GPUs. Unreachable servers raise ``RpcServerError`` (a ValueError and a
    ConnectionError).
    """
    backend.init()
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
                raise RpcServerError(f"rpc_servers: no llama.cpp RPC server answers at {name}")
            lib.ggml_backend_register(reg)
            _rpc_servers.add(name)


def model_devices(rpc_servers: str | list[str] | None) -> list[Any] | None:
    """``llama_model_params.devices`` for a model, or None for llama.cpp's own choice.

    RPC devices stay in the process's registry once added, and llama.cpp's default choice takes
    every device that says "GPU": a model must use only the RPC servers it asked for. So as soon as
    any is registered, the list is explicit: the requested RPC devices, then the local GPUs (the
    integrated ones only without a discrete one), as llama.cpp's default orders them.
    """
    devs = backend.devices()
    if not any(d.type == "rpc" for d in devs):
        return None
    wanted = {s.strip() for s in (rpc_servers.split(",") if isinstance(rpc_servers, str) else rpc_servers or [])}
    local = [d for d in devs if d.type == "gpu"] or [d for d in devs if d.type == "igpu"]
    chosen = [d for d in devs if d.type == "rpc" and d.description in wanted] + local
    return [lib.ggml_backend_dev_get(d.index) for d in chosen]


def serve_rpc(endpoint: str, n_threads: int, device: str = "CPU", cache_dir: str | None = None) -> None:
    """Run a llama.cpp RPC server on ``endpoint`` (``host:port``) with a local device; blocks."""
    check_threads("n_threads", n_threads)
    backend.init()
    dev = lib.ggml_backend_dev_by_name(device.encode())
    if dev == ffi.NULL:
        raise ValueError(f"device {device!r} not found; devices: {', '.join(d.name for d in backend.devices())}")
    devs = ffi.new("ggml_backend_dev_t[1]", [dev])
    lib.ggml_backend_rpc_start_server(endpoint.encode(), cache_dir.encode() if cache_dir else ffi.NULL,
                                      n_threads, 1, devs)
