"""The cffi builder: declarations generated from the patched headers at build time.

Importable before the package is built (it needs only cffi and a C preprocessor). CMake runs

    python -m pyllama_moe._ffi_build --include <llama.cpp>/include --include <llama.cpp>/ggml/include \
        --include <llama.cpp>/tools/mtmd --out <build>/_cffi.c

and compiles the emitted C source in API (out-of-line) mode, so the C compiler checks every
declaration and struct layout against the real headers: they cannot drift from the library.

What is declared:
- every type, enum and function of ``llama.h``;
- every type, enum and function of libmtmd's ``mtmd.h`` and ``mtmd-helper.h`` (images and audio through a
  projector; :mod:`pyllama_moe.mtmd_cpp`, :mod:`pyllama_moe.mtmd`);
- the ggml / ggml-backend / gguf types that ``llama.h`` uses, and the ggml functions the bindings
  need (device registry, buffer types, type sizes, logging, timing, CPU features, gguf reading);
- integer ``#define`` constants of those headers;
- our C entry points into llama.cpp's common library (``_native/pyllama_moe_shim.h``: fit and memory
  measurement), implemented in ``_native/shim.cpp``;
- our Python callbacks (``_decl/*.h``), written by hand.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

MODULE = "pyllama_moe._cffi"
DECL_DIR = Path(__file__).resolve().parent / "_decl"
NATIVE_DIR = Path(__file__).resolve().parent / "_native"
SHIM_HEADER = "pyllama_moe_shim.h"  # our C entry points into llama.cpp's common library
MTMD_HEADER = "mtmd-helper.h"  # libmtmd's helpers; it includes mtmd.h
# the headers the module is compiled against, in this order (each includes what it needs of llama.h and ggml)
TOP_HEADERS = (SHIM_HEADER, MTMD_HEADER)

# headers whose text is declared; anything else the preprocessor pulls in (libc) is left to cffi,
# which knows the standard types (size_t, int32_t, bool, FILE, ...)
API_HEADERS = ("llama.h", "ggml.h", "ggml-backend.h", "ggml-alloc.h", "ggml-cpu.h", "ggml-opt.h", "gguf.h",
               "ggml-rpc.h", "mtmd.h", MTMD_HEADER, SHIM_HEADER)
# headers all of whose functions are declared
ALL_FUNCTIONS = ("llama.h", "mtmd.h", MTMD_HEADER, SHIM_HEADER)

# functions: all of llama.h; of ggml's headers only these, the rest being graph-building API that
# the bindings never call (and some of it is declared for backends we do not build)
GGML_FUNCTIONS = re.compile(
    r"^(ggml_backend_(dev|reg|buft|buffer|load|unload|device|cpu|sched_get|get_device|name|synchronize|rpc|tensor_get)\w*"
    r"|ggml_(type_name|type_size|blck_size|row_size|nbytes|is_quantized|time_\w+|log_\w+|op_name|op_desc"
    r"|status_to_string|get_name|cpu_has_\w+|cpu_get_\w+|threadpool_\w+|numa_init|is_numa|version|commit)"
    r"|gguf_\w+)$"
)

_LINEMARK = re.compile(r'^# \d+ "([^"]*)"')
_FUNC_NAME = re.compile(r"(\w+)\s*\(")
_DEFINE = re.compile(r"^\s*#\s*define\s+((?:LLAMA|GGML|GGUF)_\w+)\s+(\(?-?(?:0x[0-9a-fA-F]+|\d+)[uUlL]*\)?)\s*(?://.*)?$")


def _cc() -> list[str]:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        raise RuntimeError("no C compiler found to preprocess llama.h (set CC)")
    return shlex.split(cc)


def find_header(name: str, include: Sequence[Path]) -> Path:
    for d in include:
        if (d / name).is_file():
            return d / name
    raise FileNotFoundError(f"{name} not found in {', '.join(map(str, include))}")


def preprocess(include: Sequence[Path]) -> list[tuple[str, str]]:
    """TOP_HEADERS (our shim header, which includes llama.h, and mtmd-helper.h) preprocessed: (header, text) chunks
    of API_HEADERS, in order; libc is left out."""
    include = [*include, NATIVE_DIR]
    source = "".join(f'#include "{find_header(h, include)}"\n' for h in TOP_HEADERS)
    cmd = _cc() + [
        "-E", "-std=c11", "-D__attribute__(x)=", "-D__restrict=", "-D__extension__=", "-D__inline=",
        *[f"-I{d}" for d in include], "-x", "c", "-",
    ]
    res = subprocess.run(cmd, input=source, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"preprocessing llama.h and mtmd.h failed:\n{res.stderr}")
    chunks: list[tuple[str, list[str]]] = []
    header = ""
    for line in res.stdout.splitlines():
        m = _LINEMARK.match(line)
        if m:
            header = os.path.basename(m.group(1))
            if header in API_HEADERS and (not chunks or chunks[-1][0] != header):
                chunks.append((header, []))
        elif header in API_HEADERS and line.strip():
            chunks[-1][1].append(line)
    return [(h, "\n".join(lines)) for h, lines in chunks]


def split_declarations(text: str) -> list[str]:
    """Top-level declarations (ending in ';'); function bodies (static inline helpers) are dropped."""
    decls: list[str] = []
    cur: list[str] = []
    depth, i = 0, 0
    body = False
    while i < len(text):
        c = text[i]
        if c == "{":
            if depth == 0 and "".join(cur).rstrip().endswith(")"):
                body = True
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0 and body:
                cur, body = [], False
                i += 1
                continue
        cur.append(c)
        if c == ";" and depth == 0:
            decls.append(" ".join("".join(cur).split()))
            cur = []
        i += 1
    return decls


def _array_length(m: re.Match[str]) -> str:
    """cffi takes only plain numbers as array lengths: fold simple arithmetic, let the compiler size the rest."""
    expr = m.group(1).strip()
    if re.fullmatch(r"\d+", expr):
        return m.group(0)
    if re.fullmatch(r"[\d\s*+()-]+", expr):
        return f"[{eval(expr, {'__builtins__': {}})}]"  # digits and operators only
    return "[...]"


def is_function(decl: str) -> bool:
    head = decl.split("(", 1)[0]
    return "(" in decl and "{" not in decl and not re.match(r"^(typedef|struct|enum|union)\b", head.strip())


def function_name(decl: str) -> str:
    m = _FUNC_NAME.search(decl)
    assert m, decl
    return m.group(1)


def exported_symbols(libraries: Sequence[Path], nm: str = "nm") -> set[str]:
    """The functions the built libraries define (a header can declare one that nothing defines)."""
    names: set[str] = set()
    for lib in libraries:
        res = subprocess.run([nm, "-D", "--defined-only", str(lib)], capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"{nm} -D {lib} failed:\n{res.stderr}")
        names.update(line.split()[-1] for line in res.stdout.splitlines() if line.strip())
    return names


def declarations(include: Sequence[Path], defined: set[str] | None = None) -> str:
    """The cdef text: types, the chosen functions, integer constants and our callbacks.

    With ``defined``, functions that no library defines are left out (else the module would not load).
    """
    out: list[str] = []
    for header, text in preprocess(include):
        for d in split_declarations(text):
            if d.startswith("static ") or d in out:  # C allows repeating a typedef, cffi does not
                continue
            if is_function(d):
                name = function_name(d)
                if header not in ALL_FUNCTIONS and not GGML_FUNCTIONS.match(name):
                    continue
                if defined is not None and name not in defined and header != SHIM_HEADER:
                    continue
            out.append(re.sub(r"\[([^\]]+)\]", _array_length, d))
    seen = set()
    for header in API_HEADERS:
        for line in find_header(header, [*include, NATIVE_DIR]).read_text().splitlines():
            m = _DEFINE.match(line)
            if m and m.group(1) not in seen:
                seen.add(m.group(1))
                out.append(f"#define {m.group(1)} ...")
    for extra in sorted(DECL_DIR.glob("*.h")):
        out.append(extra.read_text())
    return "\n".join(out) + "\n"


def make_ffi(include: Sequence[Path], defined: set[str] | None = None):  # -> cffi.FFI
    import cffi

    ffi = cffi.FFI()
    ffi.cdef(declarations(include, defined))
    ffi.set_source(MODULE, "".join(f'#include "{h}"\n' for h in TOP_HEADERS))
    return ffi


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pyllama_moe._ffi_build")
    ap.add_argument("--include", type=Path, action="append", required=True, help="header folder (repeatable)")
    ap.add_argument("--out", type=Path, required=True, help="the C source to write")
    ap.add_argument("--cdef", type=Path, help="also write the declarations here (for reading)")
    ap.add_argument("--library", type=Path, action="append", default=[],
                    help="a built library (repeatable): declare only the functions these define")
    ap.add_argument("--nm", default="nm", help="the nm program that lists a library's symbols")
    args = ap.parse_args(argv)
    defined = exported_symbols(args.library, args.nm) if args.library else None
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.cdef:
        args.cdef.write_text(declarations(args.include, defined))
    ffi = make_ffi(args.include, defined)
    ffi.emit_c_code(str(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
