"""scripts/wheels_from_site.py: a wheel made from an installed distribution installs with pip and holds its files."""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_an_installed_distribution_round_trips(tmp_path: Path) -> None:
    # pytest's own requirement, installed wherever the tests run; its requirements come along
    res = subprocess.run([sys.executable, "-m", "scripts.wheels_from_site", "--out", str(tmp_path / "w"),
                          "iniconfig"], capture_output=True, text=True, cwd=REPO)
    assert res.returncode == 0, res.stderr
    wheels = list((tmp_path / "w").glob("iniconfig-*.whl"))
    assert len(wheels) == 1
    dist = metadata.distribution("iniconfig")
    with zipfile.ZipFile(wheels[0]) as z:
        names = set(z.namelist())
        record = next(n for n in names if n.endswith(".dist-info/RECORD"))
        rows = [line.split(",") for line in z.read(record).decode().splitlines()]
        assert {r[0] for r in rows} == names
        for name, digest, size in rows:
            if name != record:
                data = z.read(name)
                b64 = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
                assert (digest, int(size)) == (f"sha256={b64}", len(data)), name
    installed = {str(f) for f in dist.files or [] if ".." not in Path(f).parts and "__pycache__" not in Path(f).parts}
    assert {n for n in installed if not n.endswith(("/INSTALLER", "/REQUESTED", "/direct_url.json"))} <= names
    res = subprocess.run([sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "-q", "--no-index",
                          "--no-deps", "--target", str(tmp_path / "site"), str(wheels[0])],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    module = dist.read_text("top_level.txt") or "iniconfig"
    assert (tmp_path / "site" / module.split()[0]).is_dir()


def test_a_missing_distribution_is_an_error(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "scripts.wheels_from_site", "--out", str(tmp_path),
                          "no-such-distribution-xyz"], capture_output=True, text=True, cwd=REPO)
    assert res.returncode == 1
    assert "no-such-distribution-xyz is not installed" in res.stderr


def test_the_requirements_of_a_wheel(tmp_path: Path) -> None:
    # --requires-of: the wheel's Requires-Dist that apply here (markers evaluated, extras left out)
    wheel = tmp_path / "x-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("x-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: x\nVersion: 1.0\n"
                   "Requires-Dist: iniconfig\nRequires-Dist: no-such-distribution-xyz; python_version < '3'\n"
                   'Requires-Dist: no-such-distribution-abc; extra == "test"\n\nbody\n')
    res = subprocess.run([sys.executable, "-m", "scripts.wheels_from_site", "--out", str(tmp_path / "w"),
                          "--requires-of", str(wheel)], capture_output=True, text=True, cwd=REPO)
    assert res.returncode == 0, res.stderr
    assert [p.name.split("-")[0] for p in (tmp_path / "w").glob("*.whl")] == ["iniconfig"]
