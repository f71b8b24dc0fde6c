"""Wheels of installed distributions, for installing them into a fresh venv on a machine without PyPI.

    python -m scripts.wheels_from_site --out DIR [--have DIR] [--requires-of WHEEL] NAME...

writes DIR/<name>-<version>-<tag>.whl for each NAME and, following its Requires-Dist (markers evaluated,
extras ignored), for every requirement that is installed and not already a wheel in --have. Each wheel
holds the distribution's files under site-packages as RECORD lists them (scripts and other files
outside it are left out: pip makes console scripts from entry_points.txt), its dist-info without the
installer's files, and a new RECORD. The GPU machine uses it (ci/gpu.sh wheel) to give a fresh venv
the same nvidia-*, numpy and pytest files that pip would have downloaded.
"""

from __future__ import annotations

import argparse
import email
import re
import sys
import zipfile
from collections.abc import Iterable, Sequence
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from scripts.wheel_variant import record_line

INSTALLER_FILES = {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"}


def _wheel_name(dist: metadata.Distribution) -> str:
    tags = [line.split(":", 1)[1].strip() for line in (dist.read_text("WHEEL") or "").splitlines()
            if line.startswith("Tag:")]
    if not tags:
        raise SystemExit(f"wheels_from_site: {dist.metadata['Name']} was not installed from a wheel (no WHEEL tags)")
    py = ".".join(dict.fromkeys(t.split("-")[0] for t in tags))
    abi = ".".join(dict.fromkeys(t.split("-")[1] for t in tags))
    plat = ".".join(dict.fromkeys(t.split("-")[2] for t in tags))
    name = re.sub(r"[-_.]+", "_", dist.metadata["Name"])
    return f"{name}-{dist.version}-{py}-{abi}-{plat}.whl"


def write_wheel(dist: metadata.Distribution, out: Path) -> Path:
    dest = out / _wheel_name(dist)
    record: list[str] = []
    with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as z:
        di = None
        for f in dist.files or []:
            parts = Path(f).parts
            if ".." in parts or "__pycache__" in parts:
                continue
            if parts[0].endswith(".dist-info"):
                di = parts[0]
                if parts[-1] in INSTALLER_FILES:
                    continue
            src = Path(str(dist.locate_file(f)))
            if not src.is_file():
                continue
            data = src.read_bytes()
            info = zipfile.ZipInfo(str(f), (2026, 1, 1, 0, 0, 0))
            info.external_attr = (src.stat().st_mode & 0xFFFF) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
            record.append(record_line(str(f), data))
        if di is None:
            raise SystemExit(f"wheels_from_site: {dist.metadata['Name']} lists no dist-info files")
        record.append(f"{di}/RECORD,,")
        z.writestr(f"{di}/RECORD", "\n".join(record) + "\n")
    return dest


def _requirements(requires: Iterable[str]) -> Iterable[str]:
    """The names of the Requires-Dist lines that apply here, without extras."""
    for line in requires:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            yield req.name


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--have", type=Path, help="a folder of wheels already at hand (not made again)")
    ap.add_argument("--requires-of", type=Path, help="also the requirements of this wheel (its METADATA)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    have = {canonicalize_name(p.name.split("-")[0]) for p in args.have.glob("*.whl")} if args.have else set()
    todo, done = list(args.names), set(have)
    if args.requires_of:
        with zipfile.ZipFile(args.requires_of) as z:
            meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            todo += _requirements(email.message_from_bytes(z.read(meta)).get_all("Requires-Dist") or [])
    while todo:
        name = canonicalize_name(todo.pop())
        if name in done:
            continue
        done.add(name)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            print(f"wheels_from_site: {name} is not installed", file=sys.stderr)
            return 1
        print(write_wheel(dist, args.out))
        todo.extend(_requirements(dist.requires or []))
    return 0


if __name__ == "__main__":
    sys.exit(main())
