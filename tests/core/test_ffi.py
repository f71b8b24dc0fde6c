"""The cffi layer: generated from the patched headers, complete, and the build names its patches."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pyllama_moe import backend
from pyllama_moe.ffi import ffi, lib
from scripts import vendor

REPO = Path(__file__).resolve().parents[2]
LLAMA_H = REPO / "vendor" / "llama.cpp" / "include" / "llama.h"
MTMD_HEADERS = [REPO / "vendor" / "llama.cpp" / "tools" / "mtmd" / h for h in ("mtmd.h", "mtmd-helper.h")]


def header_functions(header: Path = LLAMA_H, api: str = "LLAMA_API", prefix: str = "llama_") -> set[str]:
    """Every function a header declares, read from the header text (not how the builder reads it)."""
    text = re.sub(r"//[^\n]*|/\*.*?\*/", "", header.read_text(), flags=re.S)
    text = text.split("#ifdef __cplusplus\nstruct mtmd_memory_usage")[0]  # mtmd.h's C++-only declarations
    names = set()
    for decl in text.split(api)[1:]:
        m = re.search(rf"\b({prefix}\w+)\s*\(", decl)
        if m:
            names.add(m.group(1))
    return names


def test_every_llama_h_function_is_reachable() -> None:
    names = header_functions()
    assert len(names) > 200  # the header parse itself works
    missing = sorted(n for n in names if not hasattr(lib, n))
    assert not missing, f"declared in llama.h but not in pyllama_moe.ffi.lib: {missing}"
    for n in names:
        assert ffi.typeof(getattr(lib, n)).kind == "function", n


def test_every_mtmd_h_function_is_reachable() -> None:
    # libmtmd is built with the package and declared from its headers as llama.h is (#71)
    names = set().union(*(header_functions(h, "MTMD_API", "mtmd_") for h in MTMD_HEADERS))
    names.discard("mtmd_get_memory_usage")  # C++ only (a std::map result)
    assert {"mtmd_init_from_file", "mtmd_tokenize", "mtmd_helper_eval_chunks"} <= names and len(names) > 60
    missing = sorted(n for n in names if not hasattr(lib, n))
    assert not missing, f"declared in mtmd.h / mtmd-helper.h but not in pyllama_moe.ffi.lib: {missing}"
    assert ffi.offsetof("struct mtmd_context_params", "media_marker") > ffi.offsetof(
        "struct mtmd_context_params", "image_marker")
    assert lib.MTMD_INPUT_CHUNK_TYPE_IMAGE == 1


def test_struct_layout_comes_from_the_header() -> None:
    # b11549 added moe_cache_size in the middle of llama_context_params: a hand-written struct that
    # lacks it reads every later field at the wrong offset
    cparams = lib.llama_context_default_params()
    assert cparams.moe_cache_size == 0
    assert cparams.n_ctx == 512 or cparams.n_ctx == 0 or cparams.n_ctx > 0
    assert ffi.offsetof("struct llama_context_params", "op_offload") > ffi.offsetof(
        "struct llama_context_params", "moe_cache_size")
    mparams = lib.llama_model_default_params()
    assert mparams.load_mode == lib.LLAMA_LOAD_MODE_AUTO or mparams.load_mode in range(-1, 5)
    assert ffi.sizeof("struct llama_model_params") > 0


def test_constants() -> None:
    assert lib.LLAMA_DEFAULT_SEED == 0xFFFFFFFF
    assert lib.LLAMA_TOKEN_NULL == -1
    assert ffi.string(lib.llama_load_mode_name(lib.LLAMA_LOAD_MODE_MMAP)) == b"mmap"


def test_system_info_names_the_patch_series() -> None:
    info = backend.system_info()
    build = vendor.Pin.load(vendor.DEFAULT_PIN).build
    want = f"PATCH_SERIES = pyllama-moe {build}+{vendor.series_hash(vendor.DEFAULT_PATCHES)} | "
    assert info.startswith(want), info
    assert "CPU" in info


def test_build_info_matches_the_tree() -> None:
    from pyllama_moe import _build_info

    assert _build_info.PATCH_SERIES == vendor.series_hash(vendor.DEFAULT_PATCHES)


def test_devices_include_the_cpu() -> None:
    devs = backend.devices()
    cpu = [d for d in devs if d.type == "cpu"]
    assert cpu and cpu[0].memory_total > 0


def test_log_bridge_reports_a_missing_model(caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    backend.init()
    params = lib.llama_model_default_params()
    with caplog.at_level("DEBUG", logger="pyllama_moe"):
        model = lib.llama_model_load_from_file(str(tmp_path / "absent.gguf").encode(), params)
    assert model == ffi.NULL
    assert any(r.levelname == "ERROR" and "absent.gguf" in r.getMessage() for r in caplog.records), caplog.text


@pytest.mark.gpu
def test_gpu_is_visible() -> None:
    gpus = [d for d in backend.devices() if d.type == "gpu"]
    assert gpus, "a GPU build must list a GPU device"
    assert gpus[0].memory_total > 1 << 30
    assert "CUDA" in backend.system_info() or "ROCm" in backend.system_info()
