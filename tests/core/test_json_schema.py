"""pyllama_moe.json_schema: the JSON grammars and JSON schemas as GBNF.

The oracle is llama.cpp's grammar engine on a real vocabulary (qwen2's): every grammar we make is parsed by
``llama_sampler_init_grammar``, and texts are checked against it token by token (:class:`Grammar`).
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from pyllama_moe import json_schema as grammar
from pyllama_moe.ffi import ffi, lib
from pyllama_moe.json_schema import (
    JSON_GBNF,
    JSON_VALUE_GBNF,
    InvalidSchemaError,
    SchemaError,
    json_schema_to_gbnf,
)

from fixtures.chat import Grammar


def test_json_grammars(vocab: Any) -> None:
    obj, value = Grammar(vocab, JSON_GBNF), Grammar(vocab, JSON_VALUE_GBNF)
    good = ['{}', '{"a": 1}', '{"a": [1, -2.5e3, true, null, {"b": "x\\n\\u00e9"}], "c": {}}', '{\n  "k": "é"}']
    for text in good:
        assert obj.accepts(text), text
        assert value.accepts(text), text
        json.loads(text)
    for text in ['[1]', '"x"', '{"a": }', '{a: 1}', "{'a': 1}", '{"a": 01}', '{"a": 1,}', '{"a": "\x01"}', "{} {}"]:
        assert not obj.accepts(text), text
    for text in ['[1, "x"]', '"x"', "3.5", "null", "false"]:
        assert value.accepts(text), text
    assert obj.accepts('{"a": [1, ', complete=False) and not obj.accepts('{"a": [1, ')
    assert not obj.accepts(" " * 30 + "{}")


def random_json(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.choice(["int", "float", "str", "bool", "null"] + (["list", "dict"] * 2 if depth < 3 else []))
    if kind == "int":
        return rng.randint(-10**15, 10**15)
    if kind == "float":
        return round(rng.uniform(-1e6, 1e6), rng.randint(0, 8)) * rng.choice([1, 1e-9, 1e12])
    if kind == "str":
        return "".join(rng.choice('ab é"\\/\n\t\x01€😀') for _ in range(rng.randint(0, 6)))
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "null":
        return None
    if kind == "list":
        return [random_json(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {f"k{i}é": random_json(rng, depth + 1) for i in range(rng.randint(0, 3))}


def test_json_grammar_accepts_what_json_dumps_writes(vocab: Any) -> None:
    obj = Grammar(vocab, JSON_GBNF)
    rng = random.Random(0)
    for i in range(25):
        value = {"v": random_json(rng)}
        text = json.dumps(value, ensure_ascii=bool(i % 2), indent=2 if i % 3 == 0 else None)
        assert obj.accepts(text), text


def test_llama_cpp_rejects_a_bad_grammar(vocab: Any) -> None:
    assert lib.llama_sampler_init_grammar(vocab, b"root ::= undefined-rule", b"root") == ffi.NULL


SCHEMA_CASES: list[tuple[str, Any, list[str], list[str]]] = [
    ("required keys", {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                       "required": ["name", "age"]},
     ['{"name": "Ann", "age": 30}', '{"name":"Ann","age":-3}'],
     ['{"name": "Ann"}', '{"age": 30}', '{}', '{"age": 30, "name": "Ann"}', '{"name": "Ann", "age": 30, "x": 1}',
      '{"name": "Ann", "age": 3.5}']),
    ("optional keys", {"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"type": "null"},
                                                        "c": {"const": "x"}}},
     ['{}', '{"a": true}', '{"b": null}', '{"c": "x"}', '{"a": false, "c": "x"}', '{"a": true, "b": null, "c": "x"}'],
     ['{"c": "y"}', '{"b": null, "a": true}', '{"a": true,}', '{, "b": null}', '{"a": 1}']),
    ("mixed", {"type": "object",
               "properties": {"x": {"type": "number"}, "y": {"type": "number"}, "z": {"type": "string"}},
               "required": ["y"]},
     ['{"y": 1}', '{"y": 1, "x": 2.5}', '{"y": 1, "z": "q"}', '{"y": 1, "x": 0, "z": ""}'],
     ['{"x": 2.5}', '{"x": 2.5, "y": 1}', '{"y": 1 "x": 2}']),
    ("additional properties", {"type": "object", "properties": {"id": {"type": "integer"}},
                               "additionalProperties": {"type": "string"}},
     ['{}', '{"id": 1}', '{"id": 1, "k": "v", "l": "w"}', '{"k": "v"}'],
     ['{"id": 1, "k": 2}', '{"k": 2}']),
    ("free object", {"type": "object"}, ['{}', '{"a": [1]}'], ['[]']),
    ("enum", {"enum": ["red", 1, None, {"a": [True]}]},
     ['"red"', "1", "null", '{"a":[true]}', '{ "a": [ true ] }'],
     ['"blue"', "2", '{"a": [false]}', '{"a": [true, true]}']),
    ("array", {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3},
     ["[1]", "[1, 2, 3]", "[ 1,2 ]"], ["[]", "[1, 2, 3, 4]", '["a"]', "[1,]"]),
    ("array from zero", {"type": "array", "items": {"type": "boolean"}, "maxItems": 2},
     ["[]", "[true]", "[true, false]"], ["[true, true, true]"]),
    ("tuple", {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}]},
     ['["a", 1]'], ['["a"]', '[1, "a"]', '["a", 1, 2]']),
    ("string length", {"type": "string", "minLength": 2, "maxLength": 3},
     ['"ab"', '"abc"', '"\\n\\t"'], ['"a"', '"abcd"']),
    ("any of", {"anyOf": [{"type": "integer"}, {"type": "array", "items": {"type": "string"}}]},
     ["3", '["x"]', "[]"], ['"x"', "[3]", "true"]),
    ("one of with type list", {"oneOf": [{"type": ["string", "null"]}, {"type": "boolean"}]},
     ['"s"', "null", "true"], ["1"]),
    ("unsigned", {"type": "integer", "minimum": 0}, ["0", "42"], ["-1", "01"]),
    ("string formats", {"type": "array", "prefixItems": [{"type": "string", "format": f} for f in
                                                         ("date", "time", "date-time", "uuid", "email")]},
     ['["2024-02-29", "23:59:60Z", "2024-01-01T08:00:00.5+02:00", "123e4567-e89b-12d3-a456-426614174000", "x"]'],
     ['["2024-13-01", "23:59:60Z", "2024-01-01T08:00:00Z", "123e4567-e89b-12d3-a456-426614174000", "x"]',
      '["2024-01-01", "24:00:00Z", "2024-01-01T08:00:00Z", "123e4567-e89b-12d3-a456-426614174000", "x"]',
      '["2024-01-01", "23:00:00Z", "2024-01-01 08:00:00", "123e4567-e89b-12d3-a456-426614174000", "x"]',
      '["2024-01-01", "23:00:00Z", "2024-01-01T08:00:00Z", "123e4567e89b12d3a456426614174000", "x"]']),
    ("refs and recursion", {
        "$defs": {"node": {"type": "object",
                           "properties": {"v": {"type": "integer"},
                                          "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}},
                           "required": ["v", "next"]}},
        "$ref": "#/$defs/node"},
     ['{"v": 1, "next": null}', '{"v": 1, "next": {"v": 2, "next": null}}'],
     ['{"v": 1}', '{"v": 1, "next": {"v": 2}}']),
    ("all of", {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                          {"properties": {"b": {"type": "integer"}}, "required": ["b"]}]},
     ['{"a": 1, "b": 2}'], ['{"a": 1}', '{"b": 2}']),
    ("untyped", {"description": "anything"}, ['1', '"x"', '{"a": null}'], ["nope"]),
    ("pydantic style", {
        "title": "Person", "type": "object",
        "properties": {"name": {"title": "Name", "type": "string"},
                       "pets": {"title": "Pets", "type": "array", "items": {"$ref": "#/definitions/Pet"}}},
        "required": ["name", "pets"],
        "definitions": {"Pet": {"title": "Pet", "type": "object", "properties": {"kind": {"enum": ["cat", "dog"]}},
                                "required": ["kind"]}}},
     ['{"name": "Ann", "pets": [{"kind": "cat"}, {"kind": "dog"}]}', '{"name": "Ann", "pets": []}'],
     ['{"name": "Ann", "pets": [{"kind": "cow"}]}', '{"name": "Ann"}']),
]


@pytest.mark.parametrize(("what", "schema", "good", "bad"), SCHEMA_CASES, ids=[c[0] for c in SCHEMA_CASES])
def test_schema_grammars(vocab: Any, what: str, schema: Any, good: list[str], bad: list[str]) -> None:
    g = Grammar(vocab, json_schema_to_gbnf(schema))
    for text in good:
        json.loads(text)
        assert g.accepts(text), f"{what}: should accept {text}\n{g.text}"
    for text in bad:
        assert not g.accepts(text), f"{what}: should reject {text}\n{g.text}"


def random_schema(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    kinds = ["integer", "number", "string", "boolean", "null", "enum", "const", "anyOf"]
    if depth < 2:
        kinds += ["object", "object", "array"]
    kind = rng.choice(kinds)
    if kind == "object":
        props = {f"p{i}": random_schema(rng, depth + 1) for i in range(rng.randint(1, 4))}
        required = [k for k in props if rng.random() < 0.5]
        return {"type": "object", "properties": props, "required": required}
    if kind == "array":
        lo = rng.randint(0, 2)
        return {"type": "array", "items": random_schema(rng, depth + 1), "minItems": lo,
                "maxItems": lo + rng.randint(0, 2)}
    if kind == "string":
        return {"type": "string", "maxLength": rng.randint(1, 5)}
    if kind == "enum":
        return {"enum": rng.sample(["a", "b", 1, 2.5, None, True], rng.randint(1, 3))}
    if kind == "const":
        return {"const": rng.choice(["x", 0, False, [1, "y"], {"k": None}])}
    if kind == "anyOf":
        return {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 3}]}
    return {"type": kind}


def random_instance(rng: random.Random, schema: dict[str, Any]) -> Any:
    """A value valid for ``schema``, with object keys in the order the grammar emits them (required first)."""
    if "enum" in schema:
        return rng.choice(schema["enum"])
    if "const" in schema:
        return schema["const"]
    if "anyOf" in schema:
        return random_instance(rng, rng.choice(schema["anyOf"]))
    kind = schema["type"]
    if kind == "object":
        props, req = schema["properties"], schema["required"]
        keys = [k for k in props if k in req] + [k for k in props if k not in req and rng.random() < 0.5]
        return {k: random_instance(rng, props[k]) for k in keys}
    if kind == "array":
        n = rng.randint(schema["minItems"], schema["maxItems"])
        return [random_instance(rng, schema["items"]) for _ in range(n)]
    return {"integer": lambda: rng.randint(-999, 999), "number": lambda: rng.choice([0.5, -3, 1e-3, 12.25]),
            "string": lambda: "".join(rng.choice('ab"é\\') for _ in range(rng.randint(0, schema.get("maxLength", 5)))),
            "boolean": lambda: rng.random() < 0.5, "null": lambda: None}[kind]()


def invalid_variant(rng: random.Random, schema: dict[str, Any], value: dict[str, Any]) -> dict[str, Any] | None:
    """``value`` (an object) made invalid: a required key dropped, an undeclared key added, or a wrong type."""
    choices = []
    if schema["required"]:
        choices.append("drop")
    choices += ["extra", "type"]
    how = rng.choice(choices)
    if how == "drop":
        key = rng.choice(schema["required"])
        return {k: v for k, v in value.items() if k != key}
    if how == "extra":
        return {**value, "zz": 1}
    typed = [k for k in value if schema["properties"][k].get("type") in ("integer", "boolean", "null")]
    if not typed:
        return None
    key = rng.choice(typed)
    return {**value, key: {"integer": "1", "boolean": 0, "null": "null"}[schema["properties"][key]["type"]]}


def test_random_schemas_accept_their_instances_and_reject_broken_ones(vocab: Any) -> None:
    rng = random.Random(7)
    for _ in range(30):
        schema = {"type": "object", "properties": {f"k{i}": random_schema(rng) for i in range(rng.randint(1, 4))}}
        schema["required"] = [k for k in schema["properties"] if rng.random() < 0.6]
        g = Grammar(vocab, json_schema_to_gbnf(schema))
        for _ in range(3):
            value = random_instance(rng, schema)
            text = json.dumps(value, ensure_ascii=False, indent=rng.choice([None, 2]))
            assert g.accepts(text), f"{json.dumps(schema)}\n{text}\n{g.text}"
            bad = invalid_variant(rng, schema, value)
            if bad is not None:
                text = json.dumps(bad, ensure_ascii=False)
                assert not g.accepts(text), f"{json.dumps(schema)}\n{text}\n{g.text}"


def test_schema_errors() -> None:
    for schema, match in [
        ({"type": "object", "properties": {"a": {"not": {}}}}, "unsupported keyword"),
        ({"$ref": "https://example.com/s.json"}, "local"),
        ({"$ref": "#/$defs/missing"}, "does not resolve"),
        ({"type": "tuple"}, "unknown type"),
        ({"enum": []}, "enum"),
        (False, "matches nothing"),
        ({"type": "array", "minItems": 3, "maxItems": 1}, "minItems"),
        ("{not json", "not valid JSON"),
    ]:
        with pytest.raises(SchemaError, match=match):
            json_schema_to_gbnf(schema)
    assert json_schema_to_gbnf('{"type": "boolean"}').startswith("root ::= boolean\n")


def test_schema_bounds_and_depth(vocab: Any) -> None:
    # issue #48: the repetition bounds of grammars, on the keywords that become repetitions; a wrong schema is
    # InvalidSchemaError (refused, not relaxed to any JSON), one beyond the converter only SchemaError
    deep: Any = {"type": "string"}
    for _ in range(5000):
        deep = {"type": "array", "items": deep}
    for schema, match in [
        ({"type": "array", "minItems": 3, "maxItems": 1}, "minItems 3 is above maxItems 1"),
        ({"type": "string", "minLength": 5, "maxLength": 2}, "minLength 5 is above maxLength 2"),
        ({"type": "string", "maxLength": -1}, "maxLength must be a non-negative integer"),
        ({"type": "array", "minItems": 1.5}, "minItems must be a non-negative integer"),
        ({"type": "array", "maxItems": 10**9}, "maxItems 1000000000 is above 2000"),
        ({"type": "string", "minLength": 2001}, "minLength 2001 is above 2000"),
        (deep, "nested more than 100 levels deep"),
        ("[" * 100_000, "nested more than 100 levels deep"),
        ({"type": "object", "required": "a", "properties": {"a": {}}}, "required must be a list"),
        ({"$defs": {"a": {"$ref": "#/$defs/a"}}, "allOf": [{"$ref": "#/$defs/a"}]}, "refers to itself"),
        ({"type": "tuple"}, "unknown type"),
        (5, "must be an object or a boolean"),
    ]:
        with pytest.raises(InvalidSchemaError, match=match):
            json_schema_to_gbnf(schema)
    with pytest.raises(SchemaError) as e:
        json_schema_to_gbnf({"not": {}})
    assert not isinstance(e.value, InvalidSchemaError)
    # at the bounds, llama.cpp parses what comes out (a rule of its own for the items under "?": llama.cpp counts
    # the rules a group makes against the repetition around it)
    for schema in ({"type": "array", "maxItems": 2000, "items": {"type": "integer"}},
                   {"type": "array", "maxItems": 1000, "items": {"type": "string"}},  # cut only at commas
                   {"type": "array", "maxItems": 500, "items": {"type": "string", "maxLength": 2000}},
                   {"type": "string", "minLength": 2000, "maxLength": 2000}):
        Grammar(vocab, json_schema_to_gbnf(schema))


def test_gbnf_literals_escape(vocab: Any) -> None:
    text = 'q"uo\\te\n\t\x01é'
    g = Grammar(vocab, f"root ::= {grammar.gbnf_literal(text)}")
    assert g.accepts(text) and not g.accepts(text + "x")
    schema = {"enum": [text]}
    assert Grammar(vocab, json_schema_to_gbnf(schema)).accepts(json.dumps(text, ensure_ascii=False))
