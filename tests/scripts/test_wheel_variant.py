"""scripts/wheel_variant.py on small fake wheels: version, dependencies, RECORD, modes, CPU wheels refused."""

from __future__ import annotations

import base64
import hashlib
import stat
import zipfile
from pathlib import Path

import pytest

from scripts import wheel_variant

METADATA = """Metadata-Version: 2.2
Name: pyllama-moe
Version: 0.1.0+b11549.p20
Requires-Dist: cffi>=1.17
Requires-Dist: numpy>=1.26
Provides-Extra: synth
Requires-Dist: gguf>=0.19; extra == "synth"
Description-Content-Type: text/markdown

# pyllama-moe
Version: not a header
"""


def fake_wheel(tmp: Path, cuda_version: str, version: str = "0.1.0+b11549.p20") -> Path:
    path = tmp / f"pyllama_moe-{version}-cp312-cp312-linux_x86_64.whl"
    di = f"pyllama_moe-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("pyllama_moe/_build_info.py", f'UPSTREAM_BUILD = "b11549"\nCUDA_VERSION = "{cuda_version}"\n')
        tool = zipfile.ZipInfo("pyllama_moe/bin/llama-bench")
        tool.external_attr = (stat.S_IFREG | 0o755) << 16
        z.writestr(tool, b"\x7fELF fake")
        z.writestr(f"{di}/METADATA", METADATA.replace("0.1.0+b11549.p20", version, 1))
        z.writestr(f"{di}/WHEEL", "Wheel-Version: 1.0\nTag: cp312-cp312-linux_x86_64\n")
        z.writestr(f"{di}/RECORD", "stale\n")
    return path


def test_cuda13_variant(tmp_path: Path) -> None:
    out = wheel_variant.make_variant(fake_wheel(tmp_path, "13.0.88"), tmp_path / "out")
    assert out.name == "pyllama_moe-0.1.0+b11549.p20.cu13-cp312-cp312-linux_x86_64.whl"
    di = "pyllama_moe-0.1.0+b11549.p20.cu13.dist-info"
    with zipfile.ZipFile(out) as z:
        names = z.namelist()
        assert not any(n.startswith("pyllama_moe-0.1.0+b11549.p20.dist-info/") for n in names)
        meta = z.read(f"{di}/METADATA").decode()
        head, body = meta.split("\n\n", 1)
        assert "Version: 0.1.0+b11549.p20.cu13" in head.split("\n")
        requires = [line for line in head.split("\n") if line.startswith("Requires-Dist: ")]
        assert requires == ["Requires-Dist: cffi>=1.17", "Requires-Dist: numpy>=1.26",
                            'Requires-Dist: gguf>=0.19; extra == "synth"',
                            "Requires-Dist: nvidia-cuda-runtime>=13.0,<14", "Requires-Dist: nvidia-cublas>=13.0,<14"]
        assert body == "# pyllama-moe\nVersion: not a header\n"  # the description is left alone
        assert stat.S_IMODE(z.getinfo("pyllama_moe/bin/llama-bench").external_attr >> 16) == 0o755
        # RECORD: every other entry with its sha256 and size, itself without
        record = z.read(f"{di}/RECORD").decode().splitlines()
        assert record[-1] == f"{di}/RECORD,,"
        rows = {line.split(",")[0]: line.split(",")[1:] for line in record[:-1]}
        assert set(rows) == set(names) - {f"{di}/RECORD"}
        for name, (digest, size) in rows.items():
            data = z.read(name)
            assert digest == "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert int(size) == len(data)


def test_cuda12_variant_and_a_version_without_local_part(tmp_path: Path) -> None:
    out = wheel_variant.make_variant(fake_wheel(tmp_path, "12.8.1", version="0.2.0"), tmp_path / "out")
    assert out.name.startswith("pyllama_moe-0.2.0+cu12-")
    with zipfile.ZipFile(out) as z:
        meta = z.read("pyllama_moe-0.2.0+cu12.dist-info/METADATA").decode()
    assert "Requires-Dist: nvidia-cublas-cu12>=12.4" in meta


def test_a_cpu_wheel_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wheel = fake_wheel(tmp_path, "")
    with pytest.raises(wheel_variant.VariantError, match="without CUDA"):
        wheel_variant.make_variant(wheel, tmp_path / "out")
    assert wheel_variant.main([str(wheel), "--out", str(tmp_path / "out")]) == 1
    assert "wheel_variant: error:" in capsys.readouterr().err
