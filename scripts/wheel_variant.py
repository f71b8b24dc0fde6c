"""Make a built wheel the CUDA variant: a local version tag and the CUDA libraries as dependencies.

    python scripts/wheel_variant.py WHEEL --out DIR

reads the CUDA version the wheel was built with (``pyllama_moe/_build_info.py``), then writes
``DIR/pyllama_moe-<version>.cu<major>-<tags>.whl`` whose METADATA requires the ``nvidia-*`` PyPI
packages of that CUDA major version (libcudart and cuBLAS; the build's RUNPATH looks for them in
site-packages/nvidia), with a new RECORD. Every other entry is copied unchanged, modes included.
A CPU wheel (no CUDA version) is an error.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import re
import sys
import zipfile
from collections.abc import Sequence
from pathlib import Path

# per CUDA major version: the PyPI packages with the libraries libggml-cuda links (libcuda comes with the driver)
REQUIREMENTS = {
    12: ["nvidia-cuda-runtime-cu12>=12.4", "nvidia-cublas-cu12>=12.4"],
    13: ["nvidia-cuda-runtime>=13.0,<14", "nvidia-cublas>=13.0,<14"],
}


class VariantError(Exception):
    """The wheel cannot be made a CUDA variant; the message says why."""


def record_line(name: str, data: bytes) -> str:
    """A RECORD row: path, sha256 (urlsafe base64, unpadded) and size."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def cuda_major(build_info: str) -> int:
    m = re.search(r'^CUDA_VERSION = "(\d+)\.', build_info, re.MULTILINE)
    if m is None:
        raise VariantError("the wheel was built without CUDA (its _build_info.py names no CUDA_VERSION)")
    return int(m.group(1))


def metadata_for(metadata: str, version: str, requires: Sequence[str]) -> str:
    """METADATA with ``version`` and the extra Requires-Dist lines (after the existing ones, before the body)."""
    head, sep, body = metadata.partition("\n\n")
    lines = [f"Version: {version}" if line.startswith("Version: ") else line for line in head.split("\n")]
    at = max((i + 1 for i, line in enumerate(lines) if line.startswith("Requires-Dist: ")), default=len(lines))
    lines[at:at] = [f"Requires-Dist: {r}" for r in requires]
    return "\n".join(lines) + sep + body


def make_variant(wheel: Path, out: Path) -> Path:
    parts = wheel.name[: -len(".whl")].split("-")
    if len(parts) != 5:
        raise VariantError(f"{wheel.name} is not a plain <name>-<version>-<py>-<abi>-<platform>.whl")
    name, version = parts[0], parts[1]
    with zipfile.ZipFile(wheel) as zin:
        info = zin.read("pyllama_moe/_build_info.py").decode()
        major = cuda_major(info)
        if major not in REQUIREMENTS:
            raise VariantError(f"no nvidia-* packages known for CUDA {major} (scripts/wheel_variant.py REQUIREMENTS)")
        new_version = f"{version}.cu{major}" if "+" in version else f"{version}+cu{major}"
        old_di, new_di = f"{name}-{version}.dist-info/", f"{name}-{new_version}.dist-info/"
        dest = out / ("-".join([name, new_version, *parts[2:]]) + ".whl")
        out.mkdir(parents=True, exist_ok=True)
        record: list[str] = []
        with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as zout:
            for item in zin.infolist():
                if item.filename == old_di + "RECORD":
                    continue
                data = zin.read(item)
                target = item.filename
                if target.startswith(old_di):
                    target = new_di + target[len(old_di):]
                    if target == new_di + "METADATA":
                        data = metadata_for(data.decode(), new_version, REQUIREMENTS[major]).encode()
                copy = zipfile.ZipInfo(target, item.date_time)
                copy.external_attr = item.external_attr  # executables stay executable
                copy.compress_type = zipfile.ZIP_DEFLATED
                zout.writestr(copy, data)
                record.append(record_line(target, data))
            record.append(f"{new_di}RECORD,,")
            zout.writestr(zipfile.ZipInfo(new_di + "RECORD", (2026, 1, 1, 0, 0, 0)), "\n".join(record) + "\n")
    return dest


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("wheel", type=Path)
    ap.add_argument("--out", type=Path, required=True, help="folder for the variant wheel")
    args = ap.parse_args(argv)
    try:
        print(make_variant(args.wheel, args.out))
    except (VariantError, OSError, KeyError, zipfile.BadZipFile) as e:
        print(f"wheel_variant: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
