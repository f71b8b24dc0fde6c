"""GBNF grammars as ``grammar=`` takes them: llama-cpp-python's :class:`LlamaGrammar` and the text and root rule of
an argument. The checks that keep a grammar llama.cpp's parser would crash or run away on (or one that matches
nothing) from reaching it are :mod:`pyllama_moe.gbnf`'s; JSON schemas become grammars in
:mod:`pyllama_moe.json_schema`.

Public API: :class:`LlamaGrammar`, :func:`grammar_text`, :func:`check_grammar` (from :mod:`pyllama_moe.gbnf`).
"""

from __future__ import annotations

import os
from typing import Any

from pyllama_moe.errors import SchemaError
from pyllama_moe.gbnf import check_grammar

__all__ = ["LlamaGrammar", "check_grammar", "grammar_text"]


class LlamaGrammar:
    """A GBNF grammar (llama-cpp-python's ``LlamaGrammar``); ``grammar=`` also takes the text itself."""

    def __init__(self, *args: Any, _grammar: str, root: str = "root", **kwargs: Any) -> None:
        self._grammar = _grammar
        self._root = root

    @classmethod
    def from_string(cls, grammar: str, verbose: bool = True) -> LlamaGrammar:
        return cls(_grammar=grammar)

    @classmethod
    def from_json_schema(cls, json_schema: str, verbose: bool = True) -> LlamaGrammar:
        """The grammar of a JSON schema (given as JSON text); see :mod:`pyllama_moe.json_schema`."""
        from pyllama_moe.json_schema import json_schema_to_gbnf

        try:
            return cls(_grammar=json_schema_to_gbnf(json_schema))
        except SchemaError as e:
            raise ValueError(f"json_schema: {e}") from e

    @classmethod
    def from_file(cls, file: str | os.PathLike[str], verbose: bool = True) -> LlamaGrammar:
        with open(file, encoding="utf-8") as f:
            return cls(_grammar=f.read())


def grammar_text(grammar: Any) -> tuple[str, str] | None:
    """(text, root rule) of a ``grammar=`` argument: a GBNF string or a LlamaGrammar-like object."""
    if grammar is None:
        return None
    if isinstance(grammar, str):
        return grammar, "root"
    text = getattr(grammar, "_grammar", None)
    if isinstance(text, str):
        return text, getattr(grammar, "_root", "root") or "root"
    raise ValueError(f"grammar must be a GBNF string or a LlamaGrammar, got {grammar!r}")
