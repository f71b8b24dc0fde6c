"""scripts/vendor.py on a small fake sdist: hash check, patch failures, idempotence, export, check."""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from scripts import vendor

REPO = Path(__file__).resolve().parents[2]
ROOT = "thirdparty/llama.cpp"
FILES = {
    "CMakeLists.txt": "project(x)\n",
    "src/llama.cpp": "int x = 1;\nint y = 2;\n",
    "models/ggml-vocab-a.gguf": "vocab\n",
    "models/other.bin": "not wanted\n",
    "docs/readme.md": "not wanted\n",
}


def make_sdist(path: Path, files: dict[str, str] = FILES) -> str:
    with tarfile.open(path, "w:gz") as tar:
        for rel, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"fake-1.0/{ROOT}/{rel}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make_patch(tmp: Path, name: str, old: str, new: str, subject: str) -> str:
    """A git-format patch of src/llama.cpp from `old` to `new`."""
    work = tmp / f"work-{name}"
    work.mkdir()
    vendor.git(work, "init", "-q")
    (work / "src").mkdir()
    (work / "src/llama.cpp").write_text(old)
    vendor.git(work, "add", "-A")
    vendor.git(work, "commit", "-qm", "base")
    (work / "src/llama.cpp").write_text(new)
    vendor.git(work, "commit", "-qam", subject)
    return vendor.git(work, "format-patch", "--stdout", "-1", "HEAD") + "\n"


@pytest.fixture
def lay(tmp_path: Path) -> vendor.Layout:
    cache = tmp_path / "cache"
    cache.mkdir()
    sha = make_sdist(cache / "fake-1.0.tar.gz")
    pin = vendor.Pin(build="b1", package="fake", version="1.0", filename="fake-1.0.tar.gz", sha256=sha,
                     root=ROOT, paths=("CMakeLists.txt", "src/", "models/ggml-vocab-*"))
    patches = tmp_path / "patches"
    patches.mkdir()
    p1 = make_patch(tmp_path, "1", FILES["src/llama.cpp"], "int x = 10;\nint y = 2;\n", "first change")
    p2 = make_patch(tmp_path, "2", "int x = 10;\nint y = 2;\n", "int x = 10;\nint y = 20;\n", "second change")
    (patches / "0001-first.patch").write_text(p1)
    (patches / "0002-second.patch").write_text(p2)
    (patches / "series").write_text("# comment\n0001-first.patch\n0002-second.patch\n")
    return vendor.Layout(pin, patches, tmp_path / "vendor" / "llama.cpp", cache, quiet=True)


def log(lay: vendor.Layout) -> list[str]:
    return vendor.git(lay.dest, "log", "--format=%s").splitlines()


def test_apply_makes_upstream_plus_series(lay: vendor.Layout) -> None:
    assert vendor.apply(lay) == "made a new tree"
    files = sorted(str(p.relative_to(lay.dest)) for p in lay.dest.rglob("*") if p.is_file() and ".git" not in p.parts)
    assert files == ["CMakeLists.txt", "models/ggml-vocab-a.gguf", "src/llama.cpp"]
    assert (lay.dest / "src/llama.cpp").read_text() == "int x = 10;\nint y = 20;\n"
    assert log(lay)[:2] == ["second change", "first change"]
    assert vendor.git(lay.dest, "rev-list", "--count", "upstream..HEAD") == "2"
    vendor.check(lay)


def test_reapply_is_idempotent_and_deterministic(lay: vendor.Layout) -> None:
    vendor.apply(lay)
    head = vendor.git(lay.dest, "rev-parse", "HEAD")
    assert vendor.apply(lay) == "up to date"
    assert vendor.git(lay.dest, "rev-parse", "HEAD") == head
    # a series change re-applies on the same pristine commit, without extracting again
    (lay.patches / "series").write_text("0001-first.patch\n")
    assert vendor.apply(lay) == "re-applied the series"
    assert log(lay)[0] == "first change"
    (lay.patches / "series").write_text("0001-first.patch\n0002-second.patch\n")
    vendor.apply(lay)
    assert vendor.git(lay.dest, "rev-parse", "HEAD") == head  # same inputs, same commits


def test_bad_hash_stops_and_leaves_nothing(lay: vendor.Layout) -> None:
    sdist = lay.cache / lay.pin.filename
    make_sdist(sdist, {**FILES, "src/llama.cpp": "tampered\n"})
    with pytest.raises(vendor.HashMismatch, match="sha256 mismatch"):
        vendor.apply(lay)
    assert not lay.dest.exists()
    assert not sdist.exists()  # a bad download is not kept
    assert not list(lay.dest.parent.glob("*.tmp-*"))


def test_failing_patch_names_it_and_leaves_no_half_tree(lay: vendor.Layout) -> None:
    bad = make_patch(lay.patches.parent, "bad", "no such content\n", "x\n", "broken")
    (lay.patches / "0003-broken.patch").write_text(bad)
    (lay.patches / "series").write_text("0001-first.patch\n0002-second.patch\n0003-broken.patch\n")
    with pytest.raises(vendor.PatchFailed, match="0003-broken.patch") as e:
        vendor.apply(lay)
    assert e.value.patch == "0003-broken.patch"
    assert not lay.dest.exists()
    assert not list(lay.dest.parent.glob("*.tmp-*"))


def test_failing_patch_on_reapply_keeps_the_old_tree(lay: vendor.Layout) -> None:
    vendor.apply(lay)
    head = vendor.git(lay.dest, "rev-parse", "HEAD")
    bad = make_patch(lay.patches.parent, "bad", "no such content\n", "x\n", "broken")
    (lay.patches / "0003-broken.patch").write_text(bad)
    (lay.patches / "series").write_text("0001-first.patch\n0002-second.patch\n0003-broken.patch\n")
    with pytest.raises(vendor.PatchFailed, match="0003-broken.patch"):
        vendor.apply(lay)
    assert vendor.git(lay.dest, "rev-parse", "HEAD") == head
    assert not vendor._dirty(lay.dest)


def test_missing_patch_file(lay: vendor.Layout) -> None:
    (lay.patches / "series").write_text("0001-first.patch\n0009-gone.patch\n")
    with pytest.raises(vendor.VendorError, match="0009-gone.patch"):
        vendor.apply(lay)


def test_local_work_is_never_thrown_away(lay: vendor.Layout) -> None:
    vendor.apply(lay)
    (lay.dest / "src/llama.cpp").write_text("edited\n")
    with pytest.raises(vendor.VendorError, match="not in patches"):
        vendor.apply(lay)
    with pytest.raises(vendor.VendorError, match="uncommitted"):
        vendor.check(lay)
    vendor.git(lay.dest, "commit", "-qam", "third change")
    with pytest.raises(vendor.VendorError, match="not in patches"):
        vendor.apply(lay)
    with pytest.raises(vendor.VendorError, match="differs"):
        vendor.check(lay)
    # the build's call leaves the work there and builds it
    assert vendor.apply(lay, allow_local=True).startswith("kept local changes")
    assert vendor.git(lay.dest, "log", "-1", "--format=%s") == "third change"
    assert vendor.apply(lay, force=True) == "re-applied the series"
    assert (lay.dest / "src/llama.cpp").read_text() == "int x = 10;\nint y = 20;\n"


def test_export_round_trip(lay: vendor.Layout) -> None:
    vendor.apply(lay)
    (lay.dest / "src/llama.cpp").write_text("int x = 10;\nint y = 20;\nint z = 3;\n")
    vendor.git(lay.dest, "commit", "-qam", "third change")
    names = vendor.export(lay)
    assert names == ["0001-first-change.patch", "0002-second-change.patch", "0003-third-change.patch"]
    assert not (lay.patches / "0001-first.patch").exists()
    first = {p.name: p.read_bytes() for p in lay.patches.iterdir()}
    assert b"Date: Thu, 1 Jan 2026 00:00:00 +0000" in first["0003-third-change.patch"]
    assert vendor.apply(lay) == "up to date"
    vendor.check(lay)
    # the same tree made again from the exported series exports the same bytes
    vendor.apply(lay, force=True)
    lay2 = vendor.Layout(lay.pin, lay.patches, lay.dest.parent / "again", lay.cache, quiet=True)
    vendor.apply(lay2)
    vendor.export(lay2)
    assert {p.name: p.read_bytes() for p in lay.patches.iterdir()} == first


def test_roundtrip_names_the_files_that_differ(lay: vendor.Layout, tmp_path: Path) -> None:
    vendor.apply(lay)
    vendor.export(lay)
    patches = {p.name: p.read_bytes() for p in lay.patches.iterdir()}
    stamp = (lay.dest / ".git" / vendor.STAMP).read_bytes()
    assert vendor.roundtrip(lay, tmp_path / "rt") == []
    assert {p.name: p.read_bytes() for p in (tmp_path / "rt").iterdir()} == patches
    with pytest.raises(vendor.VendorError, match="not an empty folder"):
        vendor.roundtrip(lay, tmp_path / "rt")
    # a commit not exported yet, an edited patch, a stray file
    (lay.dest / "src/llama.cpp").write_text("int x = 10;\nint y = 20;\nint z = 3;\n")
    vendor.git(lay.dest, "commit", "-qam", "third change")
    first = lay.patches / "0001-first-change.patch"
    first.write_bytes(first.read_bytes() + b"\n")
    (lay.patches / "notes.txt").write_text("x\n")
    assert vendor.roundtrip(lay, tmp_path / "rt2") == [
        "0001-first-change.patch (differs)",
        "0003-third-change.patch (only in the export)",
        "notes.txt (only in patches/)",
        "series (differs)",
    ]
    # neither patches/ nor the tree's stamp is touched
    assert sorted(p.name for p in lay.patches.iterdir()) == sorted([*patches, "notes.txt"])
    assert (lay.dest / ".git" / vendor.STAMP).read_bytes() == stamp


def test_cli_roundtrip(lay: vendor.Layout, tmp_path: Path) -> None:
    """`vendor.py roundtrip [DIR]`: exit 0 when an export gives patches/ again, else 1 naming the files."""
    pin = tmp_path / "pin.toml"
    pin.write_text(
        f'[upstream]\nbuild = "{lay.pin.build}"\n'
        f'[sdist]\npackage = "{lay.pin.package}"\nversion = "{lay.pin.version}"\nfilename = "{lay.pin.filename}"\n'
        f'sha256 = "{lay.pin.sha256}"\nroot = "{lay.pin.root}"\n'
        f"[extract]\npaths = {list(lay.pin.paths)!r}\n")
    assert vendor.Pin.load(pin) == lay.pin
    vendor.apply(lay)
    vendor.export(lay)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(REPO / "scripts/vendor.py"), "roundtrip", *args, "--pin", str(pin),
             "--patches", str(lay.patches), "--dest", str(lay.dest), "--cache", str(lay.cache)],
            capture_output=True, text=True)

    res = run()  # into a temporary folder
    assert res.returncode == 0, res.stderr
    assert "round trip" in res.stderr
    second = lay.patches / "0002-second-change.patch"
    second.write_text(second.read_text().replace("second change", "second chang"))
    res = run(str(tmp_path / "rt"))
    assert res.returncode == 1
    assert "0002-second-change.patch (differs)" in res.stderr
    assert "0001-first-change.patch" not in res.stderr
    assert "Traceback" not in res.stderr
    assert (tmp_path / "rt" / "0002-second-change.patch").read_text() != second.read_text()  # DIR is kept


def test_series_hash_follows_content(lay: vendor.Layout) -> None:
    h = vendor.series_hash(lay.patches)
    assert len(h) == 12
    p = lay.patches / "0002-second.patch"
    p.write_text(p.read_text() + "\n")
    assert vendor.series_hash(lay.patches) != h


def test_cli_reports_errors_without_a_traceback(lay: vendor.Layout, tmp_path: Path) -> None:
    bad_pin = tmp_path / "pin.toml"
    bad_pin.write_text("[upstream]\n")
    res = subprocess.run(
        ["python3", str(REPO / "scripts/vendor.py"), "apply", "--pin", str(bad_pin), "--dest", str(tmp_path / "d")],
        capture_output=True, text=True)
    assert res.returncode == 1
    assert "vendor: error: cannot read the pin" in res.stderr
    assert "Traceback" not in res.stderr


def test_the_real_tree_is_upstream_plus_series() -> None:
    """The tree the package was built from is exactly the pin plus patches/series."""
    lay = vendor.Layout(vendor.Pin.load(vendor.DEFAULT_PIN), vendor.DEFAULT_PATCHES, vendor.DEFAULT_DEST,
                        vendor.DEFAULT_CACHE, quiet=True)
    vendor.check(lay)
    assert vendor.git(lay.dest, "rev-list", "--count", "upstream..HEAD") == str(len(vendor.series(lay.patches)))
    assert "sha256 " + lay.pin.sha256 in vendor.git(lay.dest, "log", "-1", "--format=%B", "upstream")


def test_the_version_names_the_pin_and_the_series() -> None:
    """pyproject's version is 0.1.0+<upstream build>.p<patches>, and the installed package reports it."""
    import tomllib

    import pyllama_moe

    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    pin = vendor.Pin.load(vendor.DEFAULT_PIN)
    n = len(vendor.series(vendor.DEFAULT_PATCHES))
    assert version.split("+")[1] == f"{pin.build}.p{n}", "bump pyproject.toml's version with the pin or the series"
    # a CUDA wheel adds its variant (ci/wheel.sh): +b11549.p18.cu13
    assert pyllama_moe.__version__ == version or pyllama_moe.__version__.startswith(version + ".cu"), \
        f"the installed pyllama-moe is {pyllama_moe.__version__}, the source {version}: install it again"
