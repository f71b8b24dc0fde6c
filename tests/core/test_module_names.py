"""No module of ours is named after a standard-library module.

A script run as ``python DIR/x.py`` has DIR first on ``sys.path``: a ``DIR/types.py`` then replaces
the standard library's ``types`` for everything that script imports (a fresh venv's build of the cffi
source failed so). The build runs its generators with ``-P``; this keeps the names safe for any
script run from these folders.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pyllama_moe

ROOT = Path(__file__).resolve().parents[2]


def _module_names(folder: Path) -> set[str]:
    """Each Python file's stem and each package folder's name below folder."""
    names = {p.stem for p in folder.rglob("*.py") if p.stem != "__init__" and p.stem != "__main__"}
    names |= {p.parent.name for p in folder.rglob("__init__.py") if p.parent != folder}
    return names


def _clashes(folder: Path) -> set[str]:
    return _module_names(folder) & set(sys.stdlib_module_names)


def test_installed_package_shadows_nothing() -> None:
    for d in pyllama_moe.__path__:
        assert _module_names(Path(d)), d  # the walk sees the modules
        assert _clashes(Path(d)) == set(), f"{d}: rename these modules, they shadow the standard library's"


def test_source_folders_shadow_nothing() -> None:
    folders = [ROOT / name for name in ("pyllama_moe", "scripts", "ci", "tests")]
    if not (ROOT / "pyproject.toml").is_file():  # pragma: no cover - tests copied without the checkout
        folders = [Path(__file__).resolve().parents[1]]
    for d in folders:
        if d.is_dir():
            assert _clashes(d) == set(), f"{d}: rename these modules, they shadow the standard library's"


def test_the_check_sees_a_shadow(tmp_path: Path) -> None:
    (tmp_path / "types.py").write_text("")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "__init__.py").write_text("")
    (tmp_path / "sub" / "json").mkdir()
    (tmp_path / "sub" / "json" / "__init__.py").write_text("")
    assert _clashes(tmp_path) == {"types", "json"}
