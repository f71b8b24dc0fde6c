"""``python -m pyllama_moe.server``: an OpenAI-compatible server, drop-in for ``llama_cpp.server``.

Needs the ``server`` extra (FastAPI, uvicorn, pydantic-settings).
"""

from __future__ import annotations

from pyllama_moe.server.app import create_app
from pyllama_moe.server.settings import ModelSettings, ServerSettings, parse_args

__all__ = ["ModelSettings", "ServerSettings", "create_app", "parse_args"]
