"""``python -m pyllama_moe info``: the build it reports."""

from __future__ import annotations

import pytest

import pyllama_moe
from pyllama_moe import __main__ as cli
from pyllama_moe import _build_info, backend


def test_info_names_the_build_and_the_devices(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (f"pyllama-moe {pyllama_moe.__version__}: llama.cpp {_build_info.UPSTREAM_BUILD} "
                      f"+ patch series {_build_info.PATCH_SERIES}")
    assert (f"built with CUDA {_build_info.CUDA_VERSION}" in out) == bool(_build_info.CUDA_VERSION)
    for d in backend.devices():
        assert any(line.startswith(f"device {d.index}: {d.name} ") for line in out)
