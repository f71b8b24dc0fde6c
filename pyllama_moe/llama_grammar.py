"""llama-cpp-python's ``llama_cpp.llama_grammar`` names: the grammar class and the JSON grammars."""

from __future__ import annotations

from pyllama_moe.grammar import LlamaGrammar
from pyllama_moe.json_schema import JSON_GBNF, json_schema_to_gbnf

LLAMA_GRAMMAR_DEFAULT_ROOT = "root"

__all__ = ["JSON_GBNF", "LLAMA_GRAMMAR_DEFAULT_ROOT", "LlamaGrammar", "json_schema_to_gbnf"]
