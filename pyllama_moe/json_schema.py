"""GBNF grammars for JSON output: any JSON, and JSON that follows a JSON schema.

The grammars are llama.cpp GBNF (``grammars/README.md`` upstream): ``create_completion(grammar=...)``
hands them to ``llama_sampler_init_grammar``. :func:`json_schema_to_gbnf` converts the part of JSON
Schema that structured output uses in practice:

- ``type``: ``object``, ``array``, ``string``, ``number``, ``integer``, ``boolean``, ``null``, or a
  list of them; a schema without ``type`` is typed by its keywords (``properties`` -> object,
  ``items`` -> array) or accepts any JSON value;
- objects: ``properties`` (emitted in declaration order, required ones first), ``required``,
  ``additionalProperties`` (absent or ``false`` with ``properties``: no other keys; ``true`` or a
  schema: extra keys after the declared ones, whose names are not checked against the declared);
- arrays: ``items``, ``prefixItems`` (tuples), ``minItems``, ``maxItems``;
- strings: ``minLength``, ``maxLength``, ``format`` ``date``, ``time``, ``date-time``, ``uuid``
  (other formats and ``pattern`` are accepted but not enforced);
- ``enum``, ``const``, ``anyOf``, ``oneOf`` (as anyOf), ``allOf`` of object schemas (merged),
  local ``$ref`` (``#/$defs/...``, ``#/definitions/...``, ``#``), recursive ones included.

Numeric keywords (``minimum``, ``maximum``, ``multipleOf``...) are not enforced, except that
``minimum >= 0`` drops the minus sign; neither are ``minProperties``, ``maxProperties``,
``propertyNames`` and ``uniqueItems``. The number rules cap lengths so that sampling cannot run
away in digits: at most 16 integer digits, 24 fraction digits and 4 exponent digits (every float
Python's ``json`` writes fits). Any other keyword raises :class:`SchemaError` naming it; the chat
handlers then fall back to plain JSON.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pyllama_moe.errors import GrammarError, InvalidSchemaError, SchemaError
from pyllama_moe.gbnf import GRAMMAR_MAX_REPETITION, check_grammar

__all__ = ["JSON_GBNF", "JSON_VALUE_GBNF", "SCHEMA_MAX_DEPTH", "InvalidSchemaError", "SchemaError", "gbnf_literal",
           "json_schema_to_gbnf"]


# whitespace between tokens: none, one space, or a newline with a bounded indent (an unbounded run
# of whitespace lets a sampler loop forever inside otherwise valid JSON)
_SPACE = '| " " | "\\n" [ \\t]{0,20}'

_PRIMITIVES: dict[str, str] = {
    "space": _SPACE,
    "boolean": '("true" | "false") space',
    "null": '"null" space',
    "integral-part": "[0] | [1-9] [0-9]{0,15}",
    "decimal-part": "[0-9]{1,24}",
    "exponent": "[eE] [-+]? [0-9]{1,4}",
    "integer": '("-"? integral-part) space',
    "unsigned-integer": "integral-part space",
    "number": '("-"? integral-part) ("." decimal-part)? exponent? space',
    "unsigned-number": 'integral-part ("." decimal-part)? exponent? space',
    "char": '[^"\\\\\\x7F\\x00-\\x1F] | [\\\\] (["\\\\/bfnrt] | "u" [0-9a-fA-F]{4})',
    "string": '"\\"" char* "\\"" space',
    "value": "object | array | string | number | boolean | null",
    "object": '"{" space ( string ":" space value ("," space string ":" space value)* )? "}" space',
    "array": '"[" space ( value ("," space value)* )? "]" space',
    # string formats (RFC 3339 full-date / full-time, RFC 4122 text form), quotes included
    "date-body": '[0-9]{4} "-" ("0" [1-9] | "1" [0-2]) "-" ("0" [1-9] | [12] [0-9] | "3" [01])',
    "time-body": ('([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" ([0-5] [0-9] | "60") ("." [0-9]{1,9})? '
                  '([zZ] | [-+] ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9])'),
    "date": '"\\"" date-body "\\"" space',
    "time": '"\\"" time-body "\\"" space',
    "date-time": '"\\"" date-body [tT ] time-body "\\"" space',
    "uuid": ('"\\"" [0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" '
             '[0-9a-fA-F]{12} "\\"" space'),
}
# which primitives each one refers to
_DEPENDS: dict[str, tuple[str, ...]] = {
    "boolean": ("space",),
    "null": ("space",),
    "integer": ("integral-part", "space"),
    "unsigned-integer": ("integral-part", "space"),
    "number": ("integral-part", "decimal-part", "exponent", "space"),
    "unsigned-number": ("integral-part", "decimal-part", "exponent", "space"),
    "string": ("char", "space"),
    "value": ("object", "array", "string", "number", "boolean", "null"),
    "object": ("space", "string", "value"),
    "array": ("space", "value"),
    "date": ("date-body", "space"),
    "time": ("time-body", "space"),
    "date-time": ("date-body", "time-body", "space"),
    "uuid": ("space",),
}
_STRING_FORMATS = ("date", "time", "date-time", "uuid")
# schemas inside schemas: far more than structured output uses, far less than Python's recursion limit
SCHEMA_MAX_DEPTH = 100


def _grammar(root: str, names: list[str]) -> str:
    rules = {"root": root}
    todo = list(names)
    while todo:
        name = todo.pop()
        if name not in rules:
            rules[name] = _PRIMITIVES[name]
            todo += _DEPENDS.get(name, ())
    return "".join(f"{name} ::= {body}\n" for name, body in rules.items())


#: any JSON object (``response_format={"type": "json_object"}``)
JSON_GBNF = _grammar("object", ["object"])
#: any JSON value
JSON_VALUE_GBNF = _grammar("value", ["value"])


def gbnf_literal(text: str) -> str:
    """``text`` as a GBNF string literal (``"..."``)."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _json_literal(value: Any) -> str:
    """The GBNF literal of a JSON value written compactly (enum and const members)."""
    return gbnf_literal(json.dumps(value, ensure_ascii=False, separators=(",", ":")))


_NAME_BAD = re.compile(r"[^a-zA-Z0-9-]+")

# keywords that only annotate or that we accept without enforcing
_IGNORED = {
    "$schema", "$id", "$comment", "title", "description", "default", "examples", "deprecated",
    "readOnly", "writeOnly", "format", "pattern", "minimum", "maximum", "exclusiveMinimum",
    "exclusiveMaximum", "multipleOf", "$defs", "definitions", "strict", "uniqueItems",
    "contentEncoding", "contentMediaType",
}


class _Converter:
    def __init__(self, root: Any) -> None:
        self.root = root
        self.rules: dict[str, str] = {}
        self.bodies: dict[str, str] = {}  # body -> rule name, to share identical rules
        self.refs: dict[str, str] = {}  # $ref -> rule name
        self.primitives: set[str] = set()
        self.depth = 0  # schemas being visited, one inside the other

    # -- rules

    def prim(self, name: str) -> str:
        self.primitives.add(name)
        return name

    def add(self, name: str, body: str) -> str:
        if body in self.bodies:
            return self.bodies[body]
        name = _NAME_BAD.sub("-", name).strip("-") or "rule"
        base, i = name, 1
        while name in self.rules or name in _PRIMITIVES:
            i += 1
            name = f"{base}-{i}"
        self.rules[name] = body
        self.bodies[body] = name
        return name

    # -- schemas

    def visit(self, schema: Any, name: str) -> str:
        """A GBNF expression (a rule name or a parenthesised group) matching ``schema``."""
        if self.depth >= SCHEMA_MAX_DEPTH:
            shown = name if len(name) <= 80 else name[:40] + "..." + name[-37:]
            raise InvalidSchemaError(f"{shown}: the schema is nested more than {SCHEMA_MAX_DEPTH} levels deep")
        self.depth += 1
        try:
            return self._visit(schema, name)
        finally:
            self.depth -= 1

    def _visit(self, schema: Any, name: str) -> str:
        if schema is True or schema == {}:
            return self.prim("value")
        if schema is False:
            raise InvalidSchemaError(f"{name}: the schema 'false' matches nothing")
        if not isinstance(schema, dict):
            raise InvalidSchemaError(f"{name}: a schema must be an object or a boolean, got {type(schema).__name__}")
        if "$ref" in schema:
            return self.ref(schema["$ref"])
        if "const" in schema:
            return self.const(schema["const"], name)
        if "enum" in schema:
            values = schema["enum"]
            if not isinstance(values, list) or not values:
                raise InvalidSchemaError(f"{name}: enum must be a non-empty list")
            return "(" + " | ".join(self.const(v, f"{name}-{i}") for i, v in enumerate(values)) + ")"
        for key in ("anyOf", "oneOf"):
            if key in schema:
                alts = schema[key]
                if not isinstance(alts, list) or not alts:
                    raise InvalidSchemaError(f"{name}: {key} must be a non-empty list")
                base = {k: v for k, v in schema.items() if k != key}
                exprs = [self.visit({**base, **alt} if isinstance(alt, dict) and _has_type_info(base) else alt,
                                    f"{name}-{i}") for i, alt in enumerate(alts)]
                return "(" + " | ".join(exprs) + ")"
        if "allOf" in schema:
            return self.visit(self.merge_all_of(schema, name), name)

        typ = schema.get("type")
        if isinstance(typ, list):
            if not typ:
                raise InvalidSchemaError(f"{name}: type must not be an empty list")
            return "(" + " | ".join(self.visit({**schema, "type": t}, f"{name}-{t}") for t in typ) + ")"
        if typ is None:
            if "properties" in schema or "additionalProperties" in schema or "required" in schema:
                typ = "object"
            elif "items" in schema or "prefixItems" in schema:
                typ = "array"
            else:
                self.check_keywords(schema, name, set())
                return self.prim("value")

        if typ == "object":
            return self.object(schema, name)
        if typ == "array":
            return self.array(schema, name)
        if typ == "string":
            return self.string(schema, name)
        if typ in ("integer", "number"):
            self.check_keywords(schema, name, set())
            unsigned = any(isinstance(schema.get(k), (int, float)) and not isinstance(schema.get(k), bool)
                           and schema[k] >= 0 for k in ("minimum", "exclusiveMinimum"))
            return self.prim(("unsigned-" if unsigned else "") + typ)
        if typ == "boolean":
            self.check_keywords(schema, name, set())
            return self.prim("boolean")
        if typ == "null":
            self.check_keywords(schema, name, set())
            return self.prim("null")
        raise InvalidSchemaError(f"{name}: unknown type {typ!r}")

    def const(self, value: Any, name: str) -> str:
        """Exactly ``value``; arrays and objects with the usual optional whitespace between tokens."""
        if isinstance(value, list) and value:
            return self.array({"prefixItems": [{"const": v} for v in value]}, name)
        if isinstance(value, dict) and value:
            return self.object({"type": "object", "properties": {k: {"const": v} for k, v in value.items()},
                                "required": list(value), "additionalProperties": False}, name)
        if isinstance(value, list):
            return f'"[" {self.prim("space")} "]" {self.prim("space")}'
        if isinstance(value, dict):
            return f'"{{" {self.prim("space")} "}}" {self.prim("space")}'
        return f"{_json_literal(value)} {self.prim('space')}"

    def check_keywords(self, schema: dict[str, Any], name: str, allowed: set[str]) -> None:
        unknown = set(schema) - _IGNORED - allowed - {"type"}
        if unknown:
            raise SchemaError(f"{name}: unsupported keyword(s) {', '.join(sorted(unknown))}")

    def ref(self, ref: Any) -> str:
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise SchemaError(f"only local $ref ('#/...') are supported, got {ref!r}")
        if ref in self.refs:
            return self.refs[ref]
        target: Any = self.root
        parts = [p for p in ref[1:].split("/") if p]
        for part in parts:
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(target, dict) or part not in target:
                raise InvalidSchemaError(f"$ref {ref!r} does not resolve")
            target = target[part]
        # reserve the name first: the target may refer to itself
        name = _NAME_BAD.sub("-", "ref-" + (parts[-1] if parts else "root")).strip("-")
        base, i = name, 1
        while name in self.rules or name in _PRIMITIVES:
            i += 1
            name = f"{base}-{i}"
        self.rules[name] = ""
        self.refs[ref] = name
        self.rules[name] = self.visit(target, name)
        return name

    def merge_all_of(self, schema: dict[str, Any], name: str) -> dict[str, Any]:
        merged: dict[str, Any] = {"type": "object", "properties": {}, "required": []}
        parts = list(schema["allOf"])
        rest = {k: v for k, v in schema.items() if k != "allOf"}
        if rest:
            parts.append(rest)
        for part in parts:
            seen: set[str] = set()
            while isinstance(part, dict) and "$ref" in part:
                if not isinstance(part["$ref"], str) or part["$ref"] in seen:
                    raise InvalidSchemaError(f"{name}: the $ref {part['$ref']!r} refers to itself")
                seen.add(part["$ref"])
                part = self.resolve(part["$ref"])
            if not isinstance(part, dict) or part.get("type", "object") != "object" or any(
                    k in part for k in ("anyOf", "oneOf", "allOf", "enum", "const")):
                raise SchemaError(f"{name}: allOf is supported for object schemas only")
            merged["properties"].update(part.get("properties", {}))
            merged["required"] += [r for r in part.get("required", []) if r not in merged["required"]]
            if "additionalProperties" in part:
                merged["additionalProperties"] = part["additionalProperties"]
        return merged

    def resolve(self, ref: str) -> Any:
        target: Any = self.root
        for part in (p for p in ref[1:].split("/") if p):
            if not isinstance(target, dict) or part not in target:
                raise InvalidSchemaError(f"$ref {ref!r} does not resolve")
            target = target[part]
        return target

    def object(self, schema: dict[str, Any], name: str) -> str:
        self.check_keywords(schema, name, {"properties", "required", "additionalProperties",
                                           "minProperties", "maxProperties", "propertyNames"})
        props = schema.get("properties", {})
        if not isinstance(props, dict):
            raise InvalidSchemaError(f"{name}: properties must be an object")
        required = schema.get("required", [])
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise InvalidSchemaError(f"{name}: required must be a list of property names, got {required!r:.100}")
        missing = [r for r in required if r not in props]
        extra = schema.get("additionalProperties", None if props else True)
        if missing and extra in (None, False):
            raise InvalidSchemaError(f"{name}: required properties {missing} are not in properties")
        sp = self.prim("space")
        if not props and extra in (None, True):
            return self.prim("object")
        # (key-value expression, required?) in emission order: required first, declaration order
        items: list[tuple[str, bool]] = []
        order = [k for k in props if k in required] + [k for k in props if k not in required]
        for key in order:
            value = self.visit(props[key], f"{name}-{key}")
            kv = self.add(f"{name}-{key}-kv", f'{_json_literal(key)} {sp} ":" {sp} {value}')
            items.append((kv, key in required))
        extra_kv = None
        if extra not in (None, False):
            value = self.visit(extra, f"{name}-additional")
            extra_kv = self.add(f"{name}-additional-kv", f'{self.prim("string")} ":" {sp} {value}')

        # rest[i]: properties i.. after something was emitted (each needs a leading comma);
        # first[i]: properties i.. when nothing was emitted yet
        rest_expr = f'("," {sp} {extra_kv})*' if extra_kv else ""
        first_expr = f'({extra_kv} ("," {sp} {extra_kv})*)?' if extra_kv else ""
        for i in range(len(items) - 1, -1, -1):
            kv, req = items[i]
            rest_next, first_next = rest_expr, first_expr
            if i < len(items) - 1:  # name them, so that the object's rule grows linearly
                rest_next = self.add(f"{name}-rest-{i + 1}", rest_next)
                if first_next and not req:  # only an optional property refers to first[i + 1]
                    first_next = self.add(f"{name}-first-{i + 1}", first_next)
            if req:
                rest_expr = f'"," {sp} {kv} {rest_next}'.rstrip()
                first_expr = f"{kv} {rest_next}".rstrip()
            else:
                rest_expr = f'("," {sp} {kv})? {rest_next}'.rstrip()
                first_expr = f"({kv} {rest_next}".rstrip() + (f" | {first_next})" if first_next else ")?")
        body = f'"{{" {sp} {first_expr} "}}" {sp}'
        return self.add(name, body)

    def array(self, schema: dict[str, Any], name: str) -> str:
        self.check_keywords(schema, name, {"items", "prefixItems", "minItems", "maxItems", "additionalItems"})
        sp = self.prim("space")
        lo = schema.get("minItems", 0)
        hi = schema.get("maxItems")
        if "prefixItems" in schema:
            prefix = schema["prefixItems"]
            if not isinstance(prefix, list) or not prefix:
                raise InvalidSchemaError(f"{name}: prefixItems must be a non-empty list")
            if (schema.get("items", False) not in (False, None)
                    or schema.get("additionalItems", False) not in (False, None)):
                raise SchemaError(f"{name}: prefixItems with further items is not supported")
            exprs = [self.visit(s, f"{name}-{i}") for i, s in enumerate(prefix)]
            return self.add(name, f'"[" {sp} ' + f' "," {sp} '.join(exprs) + f' "]" {sp}')
        items = schema.get("items", True)
        if isinstance(items, list):  # draft-04 tuple form
            rest = {k: v for k, v in schema.items() if k not in ("items", "prefixItems")}
            return self.array({"prefixItems": items, **rest}, name)
        _check_bounds(name, "minItems", "maxItems", lo, hi)
        item = self.visit(items, f"{name}-item")
        if hi == 0:
            return self.add(name, f'"[" {sp} "]" {sp}')
        more_lo = max(lo - 1, 0)
        more_hi = "" if hi is None else str(hi - 1)
        if more_lo == 0 and hi is None:
            more = f'("," {sp} {item})*'
        else:
            more = f'("," {sp} {item}){{{more_lo},{more_hi}}}'
        seq = f"{item} {more}"
        # a rule of its own, not a group: llama.cpp counts the rules a group makes against the repetition around it
        # (maxItems near GRAMMAR_MAX_REPETITION put the 1999 copies' rules under the "?" of the group)
        inner = seq if lo > 0 else self.add(f"{name}-items", seq) + "?"
        return self.add(name, f'"[" {sp} {inner} "]" {sp}')

    def string(self, schema: dict[str, Any], name: str) -> str:
        self.check_keywords(schema, name, {"minLength", "maxLength"})
        if schema.get("format") in _STRING_FORMATS:
            return self.prim(schema["format"])
        lo = schema.get("minLength", 0)
        hi = schema.get("maxLength")
        _check_bounds(name, "minLength", "maxLength", lo, hi)
        if lo == 0 and hi is None:
            return self.prim("string")
        char = self.prim("char")
        return self.add(name, f'"\\"" {char}{{{lo},{"" if hi is None else hi}}} "\\"" {self.prim("space")}')


def _check_bounds(name: str, lo_key: str, hi_key: str, lo: Any, hi: Any) -> None:
    """``minItems``/``maxItems`` or ``minLength``/``maxLength``: integers, 0 <= min <= max <= GRAMMAR_MAX_REPETITION
    (the grammar repeats an item that many times; llama.cpp would take a reversed pair for 2**64 copies)."""
    for key, v in ((lo_key, lo), (hi_key, hi)):
        if (v is not None or key == lo_key) and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise InvalidSchemaError(f"{name}: {key} must be a non-negative integer, got {v!r}")
        if v is not None and v > GRAMMAR_MAX_REPETITION:
            raise InvalidSchemaError(f"{name}: {key} {v} is above {GRAMMAR_MAX_REPETITION} (GRAMMAR_MAX_REPETITION)")
    if hi is not None and lo > hi:
        raise InvalidSchemaError(f"{name}: {lo_key} {lo} is above {hi_key} {hi}")


def _has_type_info(schema: dict[str, Any]) -> bool:
    return any(k in schema for k in ("type", "properties", "items", "required"))


def json_schema_to_gbnf(schema: Any) -> str:
    """A GBNF grammar (start symbol ``root``) for JSON values that ``schema`` accepts.

    ``schema`` is a dict (or a JSON string); raises :class:`SchemaError` for what the module
    docstring lists as unsupported.
    """
    if isinstance(schema, (str, bytes)):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise InvalidSchemaError(f"the schema is not valid JSON: {e}") from e
        except RecursionError:
            raise InvalidSchemaError(f"the schema is nested more than {SCHEMA_MAX_DEPTH} levels deep") from None
    conv = _Converter(schema)
    root = conv.visit(schema, "root")
    rules = {"root": root} if root != "root" else {}
    rules.update(conv.rules)
    todo = list(conv.primitives)
    while todo:
        name = todo.pop()
        if name not in rules:
            rules[name] = _PRIMITIVES[name]
            todo += _DEPENDS.get(name, ())
    if "root" not in rules:  # pragma: no cover - visit() always names or returns an expression
        raise SchemaError("no root rule")
    ordered = {"root": rules.pop("root"), **rules}
    grammar = "".join(f"{name} ::= {body}\n" for name, body in ordered.items())
    try:  # the bounds of every grammar (nested repetitions): the rule's name says where in the schema
        check_grammar(grammar)
    except GrammarError as e:
        raise InvalidSchemaError(f"the schema's {e}") from None
    return grammar
