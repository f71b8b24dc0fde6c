"""Which CUDA libraries pyllama_moe loaded: ``python ci/cuda_libs.py PREFIX`` prints them and fails unless
libcudart and libcublas come from under PREFIX (a venv's site-packages: the nvidia-* packages)."""

from __future__ import annotations

import sys
from pathlib import Path


def main() -> int:
    prefix = Path(sys.argv[1]).resolve()
    from pyllama_moe import backend

    backend.init()
    names = [d.name for d in backend.devices()]
    with open("/proc/self/maps") as f:
        libs = sorted({Path(line.split()[-1]) for line in f if "/libcu" in line})
    for lib in libs:
        print(f"cuda_libs: {lib}")
    print(f"cuda_libs: devices {names}")
    bad = [n for n in ("libcudart", "libcublas") if not any(
        lib.name.startswith(n + ".") and lib.resolve().is_relative_to(prefix) for lib in libs)]
    if bad:
        print(f"cuda_libs: {', '.join(bad)} not loaded from under {prefix}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
