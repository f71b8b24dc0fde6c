"""Llama(rpc_servers=...) through ggml's RPC backend, against an RPC server on loopback."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pyllama_moe import Llama, backend, rpc


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pyllama_moe.tools import synth

    return synth.write_model(tmp_path_factory.mktemp("rpc") / "tiny.gguf", "tiny", seed=7)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# the whole session: a device stays registered once added, and llama.cpp aborts when it cannot reach
# it, so the server lives as long as the process that knows it
@pytest.fixture(scope="session")
def server() -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "pyllama_moe", "rpc-server", "--port", str(port), "--threads", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert time.monotonic() < deadline, "the RPC server did not start"
            time.sleep(0.2)
    yield f"127.0.0.1:{port}"
    proc.kill()
    proc.wait()


def test_layers_run_on_the_rpc_server(tiny: Path, server: str, caplog: pytest.LogCaptureFixture) -> None:
    with Llama(str(tiny), n_ctx=256, verbose=False, seed=1) as local:
        want = local.create_completion("The quick brown fox", max_tokens=12, temperature=0)["choices"][0]["text"]
    with caplog.at_level("DEBUG", logger="pyllama_moe"):
        with Llama(str(tiny), n_ctx=256, n_gpu_layers=-1, rpc_servers=server, verbose=True, seed=1) as remote:
            got = remote.create_completion("The quick brown fox", max_tokens=12, temperature=0)["choices"][0]["text"]
    rpc_devs = [d for d in backend.devices() if d.type == "rpc"]
    assert [d.description for d in rpc_devs] == [server]
    assert any("RPC" in r.getMessage() and "model buffer size" in r.getMessage() for r in caplog.records), \
        "the layers were not placed on the RPC device"
    assert got == want  # the server computes with the same CPU kernels
    assert not backend.gpu_available() or any(d.type == "gpu" for d in backend.devices())


def test_a_model_that_did_not_ask_stays_off_the_rpc_devices(tiny: Path, server: str,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    rpc.add_rpc_servers(server)
    with caplog.at_level("DEBUG", logger="pyllama_moe"):
        with Llama(str(tiny), n_ctx=256, n_gpu_layers=-1, verbose=True) as llm:
            assert llm.create_completion("x", max_tokens=2)["choices"]
    assert not any("RPC" in r.getMessage() and "buffer size" in r.getMessage() for r in caplog.records)


def test_unreachable_server_is_a_clear_error(tiny: Path) -> None:
    # a ValueError naming rpc_servers (what llama-cpp-python raises for a model it cannot load) and, as before, a
    # ConnectionError (issue #48)
    for kind in (ConnectionError, ValueError):
        with pytest.raises(kind, match="rpc_servers: no llama.cpp RPC server answers"):
            Llama(str(tiny), rpc_servers=[f"127.0.0.1:{free_port()}"], verbose=False)
    with pytest.raises(ValueError, match="rpc_servers"):
        Llama(str(tiny), rpc_servers=",", verbose=False)
