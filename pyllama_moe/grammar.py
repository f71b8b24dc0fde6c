"""GBNF grammars as ``grammar=`` takes them: llama-cpp-python's :class:`LlamaGrammar`, the text and root rule of an
argument, and the checks that keep a grammar llama.cpp's parser would crash on (or one that matches nothing) from
reaching it. JSON schemas become grammars in :mod:`pyllama_moe.json_schema`.

Public API: :class:`LlamaGrammar`, :func:`grammar_text`, :func:`check_grammar`.
"""

from __future__ import annotations

import os
from typing import Any

from pyllama_moe.errors import GrammarError, SchemaError


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


# what llama_sampler_init_grammar is given: its recursive parser overflows the stack on deep nesting (20k
# parentheses), and a long grammar takes minutes to parse and to apply
GRAMMAR_MAX_DEPTH = 1000
GRAMMAR_MAX_BYTES = 1 << 20
_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\", '"': '"', "[": "[", "]": "]", "-": "-", "^": "^"}


def _grammar_char(text: str, i: int) -> tuple[str, int]:
    """The character at text[i] of a GBNF literal or character class, escapes decoded, and the index after it."""
    c = text[i]
    if c != "\\" or i + 1 >= len(text):
        return c, i + 1
    e = text[i + 1]
    width = {"x": 2, "u": 4, "U": 8}.get(e)
    if width is not None:
        digits = text[i + 2:i + 2 + width]
        try:
            return chr(int(digits, 16)), i + 2 + width
        except ValueError:
            raise GrammarError(f"grammar: bad escape \\{e}{digits} at {i}") from None
    return _ESCAPES.get(e, e), i + 2


def check_grammar(text: str) -> None:
    """ValueError before llama.cpp parses a grammar that would crash it or can match nothing: nested deeper than
    GRAMMAR_MAX_DEPTH, longer than GRAMMAR_MAX_BYTES, or with an empty character range (``[z-a]``)."""
    if len(text.encode("utf-8", errors="surrogatepass")) > GRAMMAR_MAX_BYTES:
        raise GrammarError(f"grammar: longer than {GRAMMAR_MAX_BYTES} bytes")
    depth, i, n = 0, 0, len(text)
    while i < n:
        c = text[i]
        if c == "#":  # a comment, to the end of the line
            while i < n and text[i] not in "\r\n":
                i += 1
        elif c == '"':
            i += 1
            while i < n and text[i] != '"':
                i = _grammar_char(text, i)[1]
            i += 1
        elif c == "[":
            i += 1
            if i < n and text[i] == "^":
                i += 1
            while i < n and text[i] != "]":
                lo, i = _grammar_char(text, i)
                if i + 1 < n and text[i] == "-" and text[i + 1] != "]":
                    hi, i = _grammar_char(text, i + 1)
                    if ord(lo) > ord(hi):
                        raise GrammarError(f"grammar: the character range [{lo}-{hi}] is empty, it matches nothing")
            i += 1
        else:
            if c == "(":
                depth += 1
                if depth > GRAMMAR_MAX_DEPTH:
                    raise GrammarError(f"grammar: nested more than {GRAMMAR_MAX_DEPTH} levels deep")
            elif c == ")":
                depth -= 1
            i += 1


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
