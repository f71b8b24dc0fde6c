"""``python -m pyllama_moe.server --model M.gguf [--n_gpu_layers -1] [--moe_cache_mib 8192] ...``"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    try:
        import uvicorn
    except ImportError:
        print("the server needs its extra: pip install 'pyllama-moe[server]'", file=sys.stderr)
        return 2
    from pyllama_moe.server import create_app, parse_args
    from pyllama_moe.server.protocol import protocol_class

    server, models = parse_args(argv)
    app = create_app(server, models)
    uvicorn.run(app, host=server.host, port=server.port, ssl_keyfile=server.ssl_keyfile,
                ssl_certfile=server.ssl_certfile, http=protocol_class())
    return 0


if __name__ == "__main__":
    sys.exit(main())
