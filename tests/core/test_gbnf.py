"""pyllama_moe.gbnf: the checks before llama.cpp parses a grammar (issue #48).

A grammar that runs away in llama.cpp (reversed or huge repetition bounds, nested repetitions whose copies multiply)
is refused in milliseconds with a ValueError naming its rule; the grammars of practice pass and llama.cpp parses
them. What llama.cpp does without the check is tests/core/test_hostile_calls.py's (in a child process)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from pyllama_moe.errors import GrammarError
from pyllama_moe.gbnf import GRAMMAR_MAX_REPETITION, GRAMMAR_MAX_REPETITION_PRODUCT, check_grammar
from pyllama_moe.json_schema import JSON_GBNF, JSON_VALUE_GBNF, json_schema_to_gbnf

from fixtures.chat import Grammar

REFUSED = [
    # (grammar, the rule named, what the message says)
    ('root ::= "a"{3,1}', "root", "minimum above its maximum"),
    ('root ::= "a" { 5 , 3 }', "root", "minimum above its maximum"),
    ('root ::= x\nx ::= "b"{2,1}', "x", "minimum above its maximum"),
    ('root ::= "a"{0,100000}', "root", f"above {GRAMMAR_MAX_REPETITION}"),
    ('root ::= "a"{100000}', "root", f"above {GRAMMAR_MAX_REPETITION}"),
    ('root ::= "a"{100000,}', "root", f"above {GRAMMAR_MAX_REPETITION}"),
    ('root ::= "a"{' + "9" * 100_000 + "}", "root", f"above {GRAMMAR_MAX_REPETITION}"),
    ('root ::= ("a"{0,2000}){0,2000}', "root", "nested in one another"),
    ('r ::= "a"{0,300}\nroot ::= r{0,300}', "root", "nested in one another"),  # through a rule
    ('root ::= item{1,200}\nitem ::= [a-c]{1,200} "b"', "root", "nested in one another"),  # may end as it starts
    ('root ::= ("a" | "b"{0,200}){0,200}', "root", "nested in one another"),
    ('root ::= "a"' + "{2}" * 20, "root", "nested in one another"),
    ('root ::= "x" ' + "(" * 500 + '"a"{0,50}' + ")" * 500 + "{0,500}", "root", "nested in one another"),
    ("root ::= [z-a]", "root", "empty"),
]


@pytest.mark.parametrize("text, rule, match", REFUSED, ids=[r[0][:40] for r in REFUSED])
def test_runaway_grammars_are_refused_in_milliseconds(text: str, rule: str, match: str) -> None:
    t0 = time.perf_counter()
    with pytest.raises(GrammarError, match=match) as e:
        check_grammar(text)
    assert time.perf_counter() - t0 < 0.5
    assert isinstance(e.value, ValueError)
    assert f"rule {rule!r}" in str(e.value) or rule == "root" and "[z-a]" in text
    assert len(str(e.value)) < 300  # a megabyte of digits is not quoted back


ACCEPTED = [
    'root ::= "a"{0,2000}',
    'root ::= "a"{3} "b"{2,} "c"{0,5} "d"* "e"+ "f"?',
    'root ::= ("a"{0,40}){0,40}',  # 1600 copies
    'root ::= item{0,1000}\nitem ::= "[" "a"{0,1000} "]"',  # each copy enclosed: cut only at its brackets
    'root ::= item{0,1000}\nitem ::= "a"{1,1000} "b"',  # each copy ends with what none starts with
    'root ::= "x" ' + "(" * 900 + '"a"' + ")" * 900,
    'root ::= line+\nline ::= [^\\n]* "\\n"  # a comment {3,1}\n',
    'root ::= "{3,1}" [{] "\\x41"{2}',  # braces inside literals and classes are no repetition
    'root ::= expr\nexpr ::= term (("+" | "-") term)*\nterm ::= [0-9]{1,10} | "(" expr ")"',
    JSON_GBNF,
    JSON_VALUE_GBNF,
    json_schema_to_gbnf({"type": "array", "maxItems": 2000, "items": {"type": "string", "maxLength": 2000}}),
    json_schema_to_gbnf({"type": "object", "properties": {"tags": {"type": "array", "maxItems": 50, "items": {
        "type": "array", "maxItems": 50, "items": {"type": "number"}}}, "id": {"type": "string", "format": "uuid"}}}),
]


@pytest.mark.parametrize("text", ACCEPTED, ids=[a[:40] for a in ACCEPTED])
def test_the_grammars_of_practice_pass_and_llama_cpp_parses_them(vocab: Any, text: str) -> None:
    t0 = time.perf_counter()
    check_grammar(text)
    assert time.perf_counter() - t0 < 0.5
    Grammar(vocab, text)  # llama.cpp parses it


def test_the_product_bound_is_the_documented_one() -> None:
    n = int(GRAMMAR_MAX_REPETITION_PRODUCT ** 0.5)
    check_grammar(f'r ::= "a"{{0,{n}}}\nroot ::= r{{0,{n}}}')
    with pytest.raises(GrammarError, match=str((n + 1) * (n + 1))):
        check_grammar(f'r ::= "a"{{0,{n + 1}}}\nroot ::= r{{0,{n + 1}}}')


def test_inline_nesting_is_left_to_llama_cpp_which_refuses_it_cleanly(vocab: Any) -> None:
    # llama.cpp counts the rules a group makes against the repetition around it (at most 2000, at once): not a
    # runaway, so not refused here; "a"** is left recursion to it
    from pyllama_moe.ffi import ffi, lib

    for text in ('root ::= ("[" "a"{0,1000} "]"){0,1000}', 'root ::= "a"' + "*" * 10_000):
        t0 = time.perf_counter()
        check_grammar(text)
        assert lib.llama_sampler_init_grammar(vocab, text.encode(), b"root") == ffi.NULL
        assert time.perf_counter() - t0 < 0.5


def test_a_megabyte_is_checked_in_about_a_second() -> None:
    lines = ["root ::= r0"] + [f'r{i} ::= "abc" [a-z0-9]{{0,5}} r{i + 1} | "x" ("y" | "z")*' for i in range(18_000)]
    text = "\n".join(lines)[:(1 << 20) - 100] + "\n"
    t0 = time.perf_counter()
    check_grammar(text)  # a chain of 18k rules: no recursion in Python
    assert time.perf_counter() - t0 < 5
