"""The package's import graph (#30): no cycle, the library apart from its tools, the generation layer above C.

Read from the installed package's sources: every ``import`` counts, also those inside functions and under
``TYPE_CHECKING``, since a cycle there still ties the two modules together for a reader. Each module also imports
alone in a fresh interpreter (a cycle that only works in one import order fails there)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import pyllama_moe

ROOT = Path(pyllama_moe.__file__).resolve().parent
# programs over the library: they may import it, it never imports them
TOOLS = ("pyllama_moe.tools", "pyllama_moe.__main__")
# the generation layer: sessions and requests go through the handle objects, never through the C names
ABOVE_C = ("pyllama_moe.completion", "pyllama_moe.session")


def _modules() -> dict[str, Path]:
    out = {}
    for p in sorted(ROOT.rglob("*.py")):
        parts = ["pyllama_moe", *p.relative_to(ROOT).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        if "_native" in parts or "_decl" in parts:
            continue
        out[".".join(parts)] = p
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(path: Path) -> set[str]:
    deps: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            deps.update(d for a in node.names if (d := _resolve(a.name)) and a.name.startswith("pyllama_moe"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pyllama_moe"):
            for a in node.names:
                full = f"{node.module}.{a.name}"
                d = full if full in MODULES else _resolve(node.module)
                if d:
                    deps.add(d)
    return deps


GRAPH = {m: _imports(p) - {m} for m, p in MODULES.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_graph_is_read() -> None:
    # the reader finds what is certainly there, so that an empty graph cannot pass the tests below
    assert "pyllama_moe.session" in GRAPH["pyllama_moe.llama"]
    assert "pyllama_moe.ffi" in GRAPH["pyllama_moe.context"]
    assert any(m.startswith("pyllama_moe.tools.") for m in MODULES)
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle() -> None:
    assert _cycles(GRAPH) == []


def test_the_library_never_imports_its_tools() -> None:
    library = [m for m in GRAPH if not m.startswith(TOOLS)]
    assert len(library) > 20
    bad = {m: sorted(d for d in GRAPH[m] if d.startswith(TOOLS)) for m in library}
    assert {m: d for m, d in bad.items() if d} == {}


@pytest.mark.parametrize("module", ABOVE_C)
def test_the_generation_layer_imports_no_ffi(module: str) -> None:
    assert module in GRAPH
    assert not {"pyllama_moe.ffi", "pyllama_moe._cffi", "pyllama_moe.llama_cpp"} & GRAPH[module]


@pytest.mark.parametrize("module", ["pyllama_moe.tools.bench.worker", "pyllama_moe.tools.bench.draft"])
def test_the_bench_worker_uses_the_public_api(module: str) -> None:
    # the Python-API runs of the bench: pyllama_moe's public names and the llama.h module, no private attribute
    path = MODULES[module]
    allowed = {"pyllama_moe", "pyllama_moe.llama_cpp"}
    assert {d for d in GRAPH[module] if not d.startswith(TOOLS)} <= allowed
    private = sorted({n.attr for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                      if isinstance(n, ast.Attribute) and n.attr.startswith("_") and not n.attr.startswith("__")})
    assert private == []


def test_each_module_imports_alone(tmp_path: Path) -> None:
    # one fresh interpreter per module; optional dependencies that are not installed are not ours to check
    code = ("import importlib, sys\n"
            "try:\n    importlib.import_module(sys.argv[1])\n"
            "except ModuleNotFoundError as e:\n"
            "    if (e.name or '').startswith('pyllama_moe'):\n        raise\n    print('optional', e.name)\n")
    failed = {}
    for m in MODULES:
        if m.endswith("__main__"):
            continue
        r = subprocess.run([sys.executable, "-c", code, m], capture_output=True, text=True, cwd=tmp_path)
        if r.returncode != 0:
            failed[m] = r.stderr.strip().splitlines()[-1:]
    assert failed == {}
