"""Our C entry points into llama.cpp's common library (pyllama_moe/_native/shim.cpp): fit and memory measurement."""

from __future__ import annotations

from pathlib import Path

import pytest

from pyllama_moe import backend
from pyllama_moe.ffi import ffi, lib


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pyllama_moe.tools import synth

    return synth.write_model(tmp_path_factory.mktemp("shim") / "tiny.gguf", "tiny", seed=2)


def test_device_memory_measures_without_allocating(tiny: Path) -> None:
    backend.init()
    mparams = lib.llama_model_default_params()
    cparams = lib.llama_context_default_params()
    cparams.n_ctx = 512
    out = ffi.new("int64_t[]", 5 * 16)
    n = lib.pyllama_moe_device_memory(str(tiny).encode(), ffi.addressof(mparams), ffi.addressof(cparams), out, 16)
    assert n == len(backend.devices()) - sum(d.type == "cpu" for d in backend.devices()) + 1
    from pyllama_moe.tools import synth

    model_bytes = sum(out[5 * i + 2] for i in range(n))
    weights = synth.plan("tiny").tensor_bytes
    assert 0.98 * weights < model_bytes < 1.02 * weights
    assert all(out[5 * i + 4] > 0 for i in range(n) if out[5 * i + 2] > 0)  # compute buffers


def test_device_memory_of_a_missing_file(tmp_path: Path) -> None:
    mparams = lib.llama_model_default_params()
    cparams = lib.llama_context_default_params()
    out = ffi.new("int64_t[]", 5 * 16)
    assert lib.pyllama_moe_device_memory(str(tmp_path / "absent.gguf").encode(), ffi.addressof(mparams),
                                         ffi.addressof(cparams), out, 16) == -1


def test_fit_params(tiny: Path, tmp_path: Path) -> None:
    backend.init()
    n_dev = lib.llama_max_devices()
    mparams = lib.llama_model_default_params()
    cparams = lib.llama_context_default_params()
    cparams.n_ctx = 0  # the fit chooses it
    split = ffi.new("float[]", n_dev)
    overrides = ffi.new("struct llama_model_tensor_buft_override[]", lib.llama_max_tensor_buft_overrides())
    margins = ffi.new("size_t[]", n_dev)
    args = (ffi.addressof(mparams), ffi.addressof(cparams), split, overrides, margins, 256, lib.GGML_LOG_LEVEL_ERROR)
    assert lib.pyllama_moe_fit_params(str(tiny).encode(), *args) == 0
    assert cparams.n_ctx >= 256  # set from the model (its training context fits)
    assert lib.pyllama_moe_fit_params(str(tmp_path / "absent.gguf").encode(), *args) == 2


def test_copy_bandwidth_refuses_the_host_and_bad_arguments() -> None:
    from pyllama_moe.errors import LlamaError
    from pyllama_moe.tools import bench

    cpu = next(d for d in backend.devices() if d.type == "cpu")
    with pytest.raises(LlamaError, match=f"cannot measure the copy bandwidth to {cpu.name}.*is the host"):
        bench.h2d_bandwidth_to(cpu, 1 << 20)
    out = ffi.new("double[3]")
    n_dev = len(backend.devices())
    assert lib.pyllama_moe_h2d_bandwidth(n_dev, 1 << 20, 1, ffi.NULL, out, out + 1, out + 2) == -1  # no such device
    if not backend.gpu_available():  # the bench reports no bandwidth rather than failing
        assert bench.h2d_bandwidth() == {}
