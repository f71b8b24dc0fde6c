"""llama-cpp-python's ``llama_cpp.llama_tokenizer`` names."""

from __future__ import annotations

from pyllama_moe.vocab import BaseLlamaTokenizer, LlamaHFTokenizer, LlamaTokenizer

__all__ = ["BaseLlamaTokenizer", "LlamaHFTokenizer", "LlamaTokenizer"]
