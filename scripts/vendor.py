"""Make vendor/llama.cpp from the upstream pin and the patch series.

    python scripts/vendor.py apply            # idempotent; fast when nothing changed
    python scripts/vendor.py export           # patches/ from the commits above `upstream`
    python scripts/vendor.py check            # tree == upstream + patches/series
    python scripts/vendor.py roundtrip [DIR]  # an export of the tree (into DIR) == patches/, byte for byte
    python scripts/vendor.py fetch            # only download and verify the sdist
    python scripts/vendor.py series-hash      # short hash of the series (the build reports it)

Also runnable as ``python -m scripts.vendor``. The upstream tree comes from the PyPI sdist named in
vendor/upstream.toml (sha256-checked, cached in vendor/.cache or $PYLLAMA_MOE_SDIST_CACHE); the
generated tree is a local git repository with one pristine commit tagged ``upstream`` and one
commit per patch above it. Nothing here is ever committed to our repository.
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from collections.abc import Iterator, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PIN = ROOT / "vendor" / "upstream.toml"
DEFAULT_PATCHES = ROOT / "patches"
DEFAULT_DEST = ROOT / "vendor" / "llama.cpp"
DEFAULT_CACHE = ROOT / "vendor" / ".cache"

STAMP = "pyllama-moe-stamp.json"
# fixed identity and dates: the same pin and series always give the same commits
GIT_IDENT = {
    "GIT_AUTHOR_NAME": "upstream",
    "GIT_AUTHOR_EMAIL": "upstream@pyllama-moe.invalid",
    "GIT_COMMITTER_NAME": "pyllama-moe vendor",
    "GIT_COMMITTER_EMAIL": "vendor@pyllama-moe.invalid",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00+0000",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00+0000",
}
PATCH_DATE = "Date: Thu, 1 Jan 2026 00:00:00 +0000"
SERIES_HEADER = "# applied in order by scripts/vendor.py; regenerate with `python scripts/vendor.py export`\n"


class VendorError(Exception):
    """Something about the pin, the sdist, the series or the tree is wrong; the message says what."""


class HashMismatch(VendorError):
    pass


class PatchFailed(VendorError):
    def __init__(self, patch: str, detail: str) -> None:
        super().__init__(f"patch {patch} does not apply:\n{detail.strip()}")
        self.patch = patch


@dataclasses.dataclass(frozen=True)
class Pin:
    build: str
    package: str
    version: str
    filename: str
    sha256: str
    root: str
    paths: tuple[str, ...]

    @classmethod
    def load(cls, path: Path) -> Pin:
        try:
            data = tomllib.loads(path.read_text())
            sdist = data["sdist"]
            return cls(
                build=data["upstream"]["build"],
                package=sdist["package"],
                version=sdist["version"],
                filename=sdist["filename"],
                sha256=sdist["sha256"].lower(),
                root=sdist["root"].strip("/"),
                paths=tuple(data["extract"]["paths"]),
            )
        except (OSError, KeyError, tomllib.TOMLDecodeError) as e:
            raise VendorError(f"cannot read the pin {path}: {e!r}") from e

    def key(self) -> str:
        """What the pristine commit depends on."""
        blob = json.dumps([self.sha256, self.root, list(self.paths)]).encode()
        return hashlib.sha256(blob).hexdigest()


@dataclasses.dataclass
class Layout:
    pin: Pin
    patches: Path
    dest: Path
    cache: Path
    quiet: bool = False

    def log(self, msg: str) -> None:
        if not self.quiet:
            print(f"vendor: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the sdist


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def verify(pin: Pin, path: Path) -> None:
    got = sha256_file(path)
    if got != pin.sha256:
        raise HashMismatch(
            f"sha256 mismatch for {path}: expected {pin.sha256} (vendor/upstream.toml), got {got}; "
            "the file was removed, run again to download it anew"
        )


def _pip() -> list[str]:
    probe = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True)
    if probe.returncode == 0:
        return [sys.executable, "-m", "pip"]
    for name in ("pip3", "pip"):
        exe = shutil.which(name)
        if exe:
            return [exe]
    raise VendorError("pip is needed to download the upstream sdist and none was found")


def fetch(lay: Layout) -> Path:
    """The verified sdist, downloaded with pip into the cache unless it is there already."""
    pin = lay.pin
    cached = lay.cache / pin.filename
    if cached.exists():
        try:
            verify(pin, cached)
        except HashMismatch:
            cached.unlink()
            raise
        return cached
    lay.cache.mkdir(parents=True, exist_ok=True)
    lay.log(f"downloading {pin.package}=={pin.version} (sdist) into {lay.cache}")
    with tempfile.TemporaryDirectory(dir=lay.cache) as tmp:
        cmd = _pip() + [
            "download", "--no-deps", "--no-binary", ":all:", "--no-build-isolation",
            "--disable-pip-version-check", "-q", "-d", tmp, f"{pin.package}=={pin.version}",
        ]
        res = subprocess.run(cmd, capture_output=True, text=True)
        got = Path(tmp) / pin.filename
        if not got.exists():
            # metadata preparation without isolation can fail where the build backend is missing
            cmd.remove("--no-build-isolation")
            res = subprocess.run(cmd, capture_output=True, text=True)
        if not got.exists():
            raise VendorError(f"pip download of {pin.package}=={pin.version} failed:\n{res.stderr.strip()}")
        verify(pin, got)
        os.replace(got, cached)
    return cached


# ---------------------------------------------------------------- git helpers


def git(repo: Path, *args: str, env: dict[str, str] | None = None, check: bool = True) -> str:
    full_env = {**os.environ, **GIT_IDENT, **(env or {})}
    res = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, env=full_env)
    if check and res.returncode != 0:
        raise VendorError(f"git {' '.join(args)} failed in {repo}:\n{res.stderr.strip()}")
    return res.stdout.strip()


def series(patches: Path) -> list[Path]:
    """The patches listed in patches/series, in order; each must exist."""
    listing = patches / "series"
    if not listing.exists():
        return []
    out = []
    for line in listing.read_text().splitlines():
        name = line.split("#", 1)[0].strip()
        if not name:
            continue
        p = patches / name
        if not p.is_file():
            raise VendorError(f"patches/series names {name}, which does not exist")
        out.append(p)
    return out


def series_hash(patches: Path) -> str:
    h = hashlib.sha256()
    for p in series(patches):
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def _read_stamp(dest: Path) -> dict[str, str] | None:
    try:
        return json.loads((dest / ".git" / STAMP).read_text())
    except (OSError, ValueError):
        return None


def _write_stamp(lay: Layout, repo: Path) -> None:
    stamp = {"pin": lay.pin.key(), "series": series_hash(lay.patches), "head": git(repo, "rev-parse", "HEAD")}
    (repo / ".git" / STAMP).write_text(json.dumps(stamp, indent=1) + "\n")


def _dirty(repo: Path) -> bool:
    return bool(git(repo, "status", "--porcelain", "--untracked-files=no"))


# ---------------------------------------------------------------- making the tree


def _members(pin: Pin, tar: tarfile.TarFile) -> Iterator[tuple[tarfile.TarInfo, str]]:
    for m in tar.getmembers():
        parts = m.name.split("/", 1)  # <name>-<version>/...
        if len(parts) != 2 or not parts[1].startswith(pin.root + "/"):
            continue
        rel = parts[1][len(pin.root) + 1:]
        if not rel or not (m.isfile() or m.isdir()):
            continue
        for pat in pin.paths:
            if pat.endswith("/") and (rel + "/").startswith(pat):
                yield m, rel
                break
            if not pat.endswith("/") and fnmatch.fnmatchcase(rel, pat):
                yield m, rel
                break


def extract(pin: Pin, sdist: Path, dest: Path) -> int:
    n = 0
    with tarfile.open(sdist) as tar:
        for m, rel in _members(pin, tar):
            if m.isdir():
                continue
            out = dest / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            src = tar.extractfile(m)
            assert src is not None
            with src, out.open("wb") as f:
                shutil.copyfileobj(src, f)
            os.chmod(out, 0o755 if m.mode & 0o111 else 0o644)
            n += 1
    if n == 0:
        raise VendorError(f"{sdist.name} holds nothing under {pin.root}/ that vendor/upstream.toml asks for")
    return n


def _pristine(lay: Layout, repo: Path) -> None:
    sdist = fetch(lay)
    n = extract(lay.pin, sdist, repo)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "core.autocrlf", "false")
    git(repo, "add", "-A", "-f")
    msg = f"llama.cpp {lay.pin.build} from {lay.pin.filename} ({lay.pin.root})\n\nsha256 {lay.pin.sha256}\n"
    git(repo, "commit", "-q", "--no-verify", "-m", msg)
    git(repo, "tag", "-f", "upstream")
    lay.log(f"pristine {lay.pin.build}: {n} files")


def _am(lay: Layout, repo: Path) -> None:
    for p in series(lay.patches):
        res = subprocess.run(
            ["git", "-C", str(repo), "am", "-q", "--keep-cr", "--committer-date-is-author-date", str(p)],
            capture_output=True, text=True, env={**os.environ, **GIT_IDENT},
        )
        if res.returncode != 0:
            git(repo, "am", "--abort", check=False)
            raise PatchFailed(p.name, res.stdout + res.stderr)
    lay.log(f"applied {len(series(lay.patches))} patches")


def apply(lay: Layout, force: bool = False, allow_local: bool = False) -> str:
    """Make lay.dest equal to upstream + series. Returns what was done.

    With ``allow_local`` (the build's call), a tree with work that is not exported yet is left as
    it is and built: the developer is between a commit in vendor/llama.cpp and `export`.
    """
    stamp = _read_stamp(lay.dest)
    want_series = series_hash(lay.patches)
    if lay.dest.exists() and stamp is not None:
        head = git(lay.dest, "rev-parse", "HEAD", check=False)
        local = head != stamp.get("head") or _dirty(lay.dest)
        if local and allow_local and not force and stamp.get("pin") == lay.pin.key():
            return "kept local changes that are not in patches/ (export them): building the tree as it is"
        if local and not force:
            raise VendorError(
                f"{lay.dest} has commits or edits that are not in patches/: commit them there and run "
                "`python scripts/vendor.py export`, or run `apply --force` to throw them away"
            )
        if not local and stamp.get("pin") == lay.pin.key() and stamp.get("series") == want_series:
            return "up to date"
        if stamp.get("pin") == lay.pin.key():
            # same upstream: rewind to it and apply the series again; on failure go back
            git(lay.dest, "am", "--abort", check=False)
            git(lay.dest, "reset", "-q", "--hard", "upstream")
            try:
                _am(lay, lay.dest)
            except VendorError:
                git(lay.dest, "reset", "-q", "--hard", head)
                raise
            _write_stamp(lay, lay.dest)
            return "re-applied the series"
    elif lay.dest.exists() and any(lay.dest.iterdir()) and not force:
        raise VendorError(f"{lay.dest} exists but was not made by this tool; remove it or run `apply --force`")

    # a new tree, made beside the old one and swapped in only when complete
    lay.dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=lay.dest.name + ".tmp-", dir=lay.dest.parent))
    try:
        _pristine(lay, tmp)
        _am(lay, tmp)
        _write_stamp(lay, tmp)
        if lay.dest.exists():
            old = tmp.with_name(tmp.name + "-old")
            os.replace(lay.dest, old)
            os.replace(tmp, lay.dest)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, lay.dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return "made a new tree"


def _normalize(text: str) -> str:
    """Drop what changes between exports of the same commit (the date)."""
    head, sep, body = text.partition("\n\n")
    lines = [PATCH_DATE if ln.startswith("Date: ") else ln for ln in head.split("\n")]
    return "\n".join(lines) + sep + body


def export(lay: Layout, stamp: bool = True) -> list[str]:
    """Write patches/NNNN-*.patch and patches/series from the commits above `upstream`."""
    repo = lay.dest
    if not (repo / ".git").exists():
        raise VendorError(f"{repo} is not a vendored tree; run `apply` first")
    if _dirty(repo):
        raise VendorError(f"{repo} has uncommitted edits; commit them there first")
    lay.patches.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        git(repo, "format-patch", "-q", "--no-signature", "--zero-commit", "--full-index", "-N",
            "--no-stat", "-o", tmp, "upstream..HEAD")
        made = sorted(Path(tmp).glob("*.patch"))
        for old in lay.patches.glob("[0-9][0-9][0-9][0-9]-*.patch"):
            old.unlink()
        names = []
        for p in made:
            (lay.patches / p.name).write_text(_normalize(p.read_text()))
            names.append(p.name)
    (lay.patches / "series").write_text(SERIES_HEADER + "".join(n + "\n" for n in names))
    if stamp:  # the tree now matches the series: the next apply has nothing to do
        _write_stamp(lay, repo)
    lay.log(f"exported {len(names)} patches")
    return names


def _files(folder: Path) -> dict[str, bytes]:
    """The files of ``folder`` but its Markdown documents (``README.md`` beside the series is not exported)."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*")
            if p.is_file() and p.suffix != ".md"}


def roundtrip(lay: Layout, out: Path) -> list[str]:
    """Export the tree's series into ``out`` (absent or empty) and compare it with lay.patches byte for byte.

    Returns the files that differ, each with how (``differs``, ``only in patches/``, ``only in the export``);
    an empty list when re-exporting the series gives no diff. Neither lay.patches nor the tree's stamp changes.
    """
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise VendorError(f"{out} is not an empty folder: the round trip exports into a folder of its own")
    out.mkdir(parents=True, exist_ok=True)
    export(dataclasses.replace(lay, patches=out), stamp=False)
    have, made = _files(lay.patches), _files(out)
    diffs = []
    for name in sorted(have.keys() | made.keys()):
        if name not in made:
            diffs.append(f"{name} (only in {lay.patches.name}/)")
        elif name not in have:
            diffs.append(f"{name} (only in the export)")
        elif have[name] != made[name]:
            diffs.append(f"{name} (differs)")
    return diffs


def check(lay: Layout) -> None:
    """Raise unless the tree is exactly upstream + series, with no uncommitted edits."""
    repo = lay.dest
    if not (repo / ".git").exists():
        raise VendorError(f"{repo} is not a vendored tree; run `apply` first")
    if _dirty(repo):
        raise VendorError(f"{repo} has uncommitted edits")
    with tempfile.TemporaryDirectory() as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        git(repo, "read-tree", "upstream", env=env)
        for p in series(lay.patches):
            res = subprocess.run(["git", "-C", str(repo), "apply", "--cached", str(p)],
                                 capture_output=True, text=True, env={**os.environ, **env})
            if res.returncode != 0:
                raise PatchFailed(p.name, res.stderr)
        want = git(repo, "write-tree", env=env)
    have = git(repo, "rev-parse", "HEAD^{tree}")
    if want != have:
        raise VendorError(f"{repo} differs from upstream + patches/series: export or apply again")


# ---------------------------------------------------------------- command line


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="vendor", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["apply", "export", "check", "roundtrip", "fetch", "series-hash"])
    ap.add_argument("dir", nargs="?", type=Path,
                    help="roundtrip: the empty folder to export into and keep (default: a temporary one)")
    ap.add_argument("--force", action="store_true", help="apply: throw away local changes in the tree")
    ap.add_argument("--allow-local", action="store_true",
                    help="apply: leave local changes that are not exported yet and build them (the build's call)")
    ap.add_argument("--pin", type=Path, default=DEFAULT_PIN)
    ap.add_argument("--patches", type=Path, default=DEFAULT_PATCHES)
    ap.add_argument("--dest", type=Path, default=DEFAULT_DEST)
    ap.add_argument("--cache", type=Path, default=Path(os.environ.get("PYLLAMA_MOE_SDIST_CACHE", DEFAULT_CACHE)))
    ap.add_argument("-q", "--quiet", action="store_true")
    args = ap.parse_args(argv)
    if args.dir is not None and args.command != "roundtrip":
        ap.error(f"{args.command} takes no folder")
    try:
        lay = Layout(Pin.load(args.pin), args.patches.resolve(), args.dest.resolve(), args.cache.resolve(), args.quiet)
        if args.command == "apply":
            lay.log(apply(lay, force=args.force, allow_local=args.allow_local))
        elif args.command == "export":
            export(lay)
        elif args.command == "check":
            check(lay)
            lay.log("tree == upstream + patches/series")
        elif args.command == "roundtrip":
            if args.dir is not None:
                diffs = roundtrip(lay, args.dir.resolve())
            else:
                with tempfile.TemporaryDirectory(prefix="vendor-roundtrip-") as tmp:
                    diffs = roundtrip(lay, Path(tmp))
            if diffs:
                print(f"vendor: error: an export of {lay.dest} differs from {lay.patches}:", file=sys.stderr)
                for d in diffs:
                    print(f"  {d}", file=sys.stderr)
                return 1
            lay.log(f"round trip: an export of the tree == {lay.patches}")
        elif args.command == "fetch":
            print(fetch(lay))
        else:
            print(series_hash(lay.patches))
    except VendorError as e:
        print(f"vendor: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
