"""llama-cpp-python's ``llama_cpp.llama_cache`` names: the prompt caches of ``Llama.set_cache``."""

from __future__ import annotations

from pyllama_moe.cache import BaseLlamaCache, LlamaCache, LlamaDiskCache, LlamaRAMCache

__all__ = ["BaseLlamaCache", "LlamaCache", "LlamaDiskCache", "LlamaRAMCache"]
