"""The checks a GBNF text passes before llama.cpp's grammar parser sees it: what would crash the parser (nesting
that overflows its stack), run away in it (reversed or huge repetition bounds, nested repetitions whose product
explodes the matcher's stacks) or match nothing (an empty character range). One pass over the text and one over its
rules, iterative throughout: a millisecond for the grammars of practice, half a second for a megabyte.

Public API: :func:`check_grammar` and the limits ``GRAMMAR_MAX_*``.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from pyllama_moe.errors import GrammarError

# what llama_sampler_init_grammar is given: its recursive parser overflows the stack on deep nesting (20k
# parentheses), and a long grammar takes minutes to parse and to apply
GRAMMAR_MAX_DEPTH = 1000
GRAMMAR_MAX_BYTES = 1 << 20
# repetitions {m}, {m,}, {m,n}: llama.cpp's parser refuses a minimum above 2000 (its MAX_REPETITION_THRESHOLD) but
# makes a larger maximum unbounded without a word, and it takes reversed bounds ({3,1}) for 2**64 - 2 optional copies:
# 48 s and 9.9 GB before it gives up. Each bound is checked here first.
GRAMMAR_MAX_REPETITION = 2000
# and the product of the bounds of repetitions nested in one another, where the copies of the outer one can be cut in
# more than one way: ("a"{1,45}){1,45} has the matcher follow every way of cutting a run of a's into copies, 2 s a
# token at 45 x 45. An inner repetition counts when it sits at the start or end of the outer one's item (one enclosed
# by other symbols, as a string's characters between its quotes, does not), and only where the item can end with a
# character it can start with (or be empty): ("," space item){0,999} of a JSON array cuts only at its commas.
GRAMMAR_MAX_REPETITION_PRODUCT = 10_000
_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\", '"': '"', "[": "[", "]": "]", "-": "-", "^": "^"}
_WORD = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")
_LITERAL = re.compile(r'(?:[^"\\]|\\.)*', re.DOTALL)  # a literal's body, up to its closing quote
_LITERAL_CHAR = re.compile(r"\\(?:x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|.)|.", re.DOTALL)
_DIGITS = re.compile(r"[0-9]*")


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


# the characters an item can start or end with: ranges of code points, or None for any character (a negated class,
# ".", a token); more ranges than _MAX_RANGES are taken for any character
_Chars = frozenset[tuple[int, int]] | None
_MAX_RANGES = 256


def _union(a: _Chars, b: _Chars) -> _Chars:
    if a is None or b is None or len(a) + len(b) > _MAX_RANGES:
        return None
    return a | b


def _overlap(a: _Chars, b: _Chars) -> bool:
    if a is None or b is None:
        return a != frozenset() and b != frozenset()
    return any(lo1 <= hi2 and lo2 <= hi1 for lo1, hi1 in a for lo2, hi2 in b)


# a parsed item: ("t", nullable, first, last) a terminal (literal, character class, token, any character) and the
# characters it starts and ends with, ("r", name) a rule reference (a group becomes a rule of its own, as llama.cpp
# makes it one), ("x", item, [factors], nullable) repetitions of a terminal or reference, innermost first
_Item = tuple[Any, ...]


class _Cost(NamedTuple):
    """What an item costs the matcher: ``most`` the largest product of nested repetitions in it, ``first`` / ``last``
    that of the repetitions at its start / end (which multiply with an outer repetition's copies), ``nullable``
    whether it can match nothing, ``starts`` / ``ends`` the characters it can start / end with."""

    most: int
    first: int
    last: int
    nullable: bool
    starts: _Chars
    ends: _Chars


_UNKNOWN = _Cost(1, 1, 1, False, None, None)  # a rule being evaluated (recursion) or undefined


class _GrammarCheck:
    """One pass over a GBNF text (llama.cpp's grammar syntax), then one over its rules: the checks of
    :func:`check_grammar`. Iterative throughout: neither deep groups nor long chains of rules recurse in Python."""

    def __init__(self, text: str) -> None:
        self.text, self.i, self.n = text, 0, len(text)
        self.rules: dict[str, list[list[_Item]]] = {}  # the groups too, as rules named "(rule)#n"
        self.owner: dict[str, str] = {}  # a group's rule -> the rule it is written in
        self.rule = "root"

    def error(self, message: str, rule: str | None = None) -> GrammarError:
        rule = rule if rule is not None else self.rule
        return GrammarError(f"grammar: rule {self.owner.get(rule, rule)!r}: {message}")

    def skip_space(self, newlines: bool = True) -> None:
        text, n = self.text, self.n
        while self.i < n:
            c = text[self.i]
            if c == "#":  # a comment, to the end of the line
                end = text.find("\n", self.i)
                self.i = n if end < 0 else end
            elif c in " \t" or (newlines and c in "\r\n"):
                self.i += 1
            else:
                return

    def literal(self) -> _Item:
        m = _LITERAL.match(self.text, self.i + 1)
        assert m is not None  # the pattern matches the empty string too
        body = m.group()
        self.i = m.end() + 1
        if not body:
            return ("t", True, frozenset(), frozenset())
        if "\\" in body:  # decode the first and last characters
            chars = [_grammar_char(c, 0)[0] for c in _LITERAL_CHAR.findall(body)]
            first, last = chars[0], chars[-1]
        else:
            first, last = body[0], body[-1]
        return ("t", False, frozenset({(ord(first), ord(first))}), frozenset({(ord(last), ord(last))}))

    def char_class(self) -> _Item:
        text, n = self.text, self.n
        self.i += 1
        negated = self.i < n and text[self.i] == "^"
        if negated:
            self.i += 1
        ranges: set[tuple[int, int]] = set()
        while self.i < n and text[self.i] != "]":
            lo, self.i = _grammar_char(text, self.i)
            hi = lo
            if self.i + 1 < n and text[self.i] == "-" and text[self.i + 1] != "]":
                hi, self.i = _grammar_char(text, self.i + 1)
                if ord(lo) > ord(hi):
                    raise self.error(f"the character range [{lo}-{hi}] is empty, it matches nothing")
            ranges.add((ord(lo), ord(hi)))
        self.i += 1
        chars = None if negated or len(ranges) > _MAX_RANGES else frozenset(ranges)
        return ("t", False, chars, chars)

    def number(self) -> str | None:
        m = _DIGITS.match(self.text, self.i)
        assert m is not None
        self.i = m.end()
        return m.group() or None

    def bounds(self) -> tuple[int, int | None] | None:
        """``{m}``, ``{m,}`` or ``{m,n}`` at self.i (spaces allowed inside, as llama.cpp's parser allows them); None
        for anything else, which llama.cpp refuses with its own message."""
        text = self.text
        self.i += 1
        self.skip_space()
        lo_text = self.number()
        self.skip_space()
        if lo_text is None or self.i >= self.n or text[self.i] not in ",}":
            return None
        hi_text: str | None = lo_text
        shown = lo_text
        if text[self.i] == ",":
            self.i += 1
            self.skip_space()
            hi_text = self.number()
            self.skip_space()
            shown = f"{lo_text},{hi_text or ''}"
            if self.i >= self.n or text[self.i] != "}":
                return None
        self.i += 1

        def value(digits: str) -> int:  # past the limit whatever its digits: no int() of a megabyte
            digits = digits.lstrip("0") or "0"
            return int(digits) if len(digits) <= len(str(GRAMMAR_MAX_REPETITION)) else GRAMMAR_MAX_REPETITION + 1

        shown = "{" + (shown if len(shown) <= 40 else shown[:37] + "...") + "}"
        lo, hi = value(lo_text), None if hi_text is None else value(hi_text)
        if hi is not None and lo > hi:
            raise self.error(f"the repetition {shown} has its minimum above its maximum")
        if max(lo, hi or 0) > GRAMMAR_MAX_REPETITION:
            raise self.error(f"the repetition {shown} is above {GRAMMAR_MAX_REPETITION} (GRAMMAR_MAX_REPETITION): "
                             "use * or {m,} for an unbounded count")
        return lo, hi

    @staticmethod
    def repeat(item: _Item, factor: int, zero: bool) -> _Item:
        if item[0] != "x":
            return ("x", item, [factor], zero)
        if factor > 1:  # a factor of 1 (*, +, ?) changes no count; "a"**** ... adds nothing to check
            item[2].append(factor)
        return item if item[3] or not zero else ("x", item[1], item[2], True)

    def parse(self) -> None:
        text, n = self.text, self.n
        stack: list[tuple[str, list[list[_Item]]]] = []  # the groups open around the position: rule, alternatives
        name = self.rule  # the rule or group being read, and its alternatives so far
        alts: list[list[_Item]] = [[]]
        groups = 0
        while True:
            self.skip_space(newlines=bool(stack))
            if self.i >= n:
                break
            c = text[self.i]
            seq = alts[-1]
            if c in "\r\n":  # the end of a rule's line
                self.i += 1
            elif c == '"':
                seq.append(self.literal())
            elif c == "[":
                seq.append(self.char_class())
            elif c == "(":
                if len(stack) >= GRAMMAR_MAX_DEPTH:
                    raise GrammarError(f"grammar: nested more than {GRAMMAR_MAX_DEPTH} levels deep")
                self.i += 1
                groups += 1
                stack.append((name, alts))
                name, alts = f"({self.rule})#{groups}", [[]]
                self.owner[name] = self.rule
            elif c == ")":
                self.i += 1
                if stack:
                    self.rules[name] = alts
                    group = name
                    name, alts = stack.pop()
                    alts[-1].append(("r", group))
            elif c == "|":
                self.i += 1
                alts.append([])
            elif c in "*+?" and seq:
                self.i += 1
                seq[-1] = self.repeat(seq[-1], 1, c != "+")
            elif c == "{" and seq:
                b = self.bounds()
                if b is not None:
                    lo, hi = b
                    seq[-1] = self.repeat(seq[-1], hi if hi is not None else max(lo, 1), lo == 0)
            elif c in "<!":  # a token, <[id]> or <name>, maybe negated
                end = text.find(">", self.i)
                self.i = n if end < 0 else end + 1
                seq.append(("t", False, None, None))
            elif c == ".":
                self.i += 1
                seq.append(("t", False, None, None))
            elif c in _WORD:
                start = self.i
                while self.i < n and text[self.i] in _WORD:
                    self.i += 1
                word = text[start:self.i]
                self.skip_space(newlines=False)
                if not stack and text.startswith("::=", self.i):  # a rule's definition begins
                    self.i += 3
                    self.rules.setdefault(name, []).extend(a for a in alts if a)
                    self.rule = name = word
                    alts = [[]]
                else:
                    seq.append(("r", word))
            else:
                self.i += 1  # llama.cpp refuses it, with its own message
        while stack:  # unclosed groups: llama.cpp says so; what they hold counts
            self.rules[name] = alts
            group = name
            name, alts = stack.pop()
            alts[-1].append(("r", group))
        self.rules.setdefault(name, []).extend(a for a in alts if a)

    def item_cost(self, item: _Item, costs: dict[str, _Cost], rule: str) -> _Cost:
        kind = item[0]
        if kind == "t":
            return _Cost(1, 1, 1, item[1], item[2], item[3])
        if kind == "r":
            return costs.get(item[1], _UNKNOWN)
        c = self.item_cost(item[1], costs, rule)
        # copies of an item that can end with what it starts with (or be empty) can be cut in several ways: each
        # cut multiplies with the repetitions at the item's edges; otherwise the copies only add theirs
        ambiguous = c.nullable or _overlap(c.ends, c.starts)
        for factor in item[2]:
            copies = factor * max(c.first, c.last) if ambiguous else max(factor, c.first, c.last)
            if copies > GRAMMAR_MAX_REPETITION_PRODUCT:
                raise self.error(f"repetitions nested in one another come to {copies} copies, above "
                                 f"{GRAMMAR_MAX_REPETITION_PRODUCT} (GRAMMAR_MAX_REPETITION_PRODUCT)", rule)
            c = c._replace(most=max(c.most, copies), first=copies, last=copies)
        return c._replace(nullable=c.nullable or item[3])

    def rule_cost(self, rule: str, costs: dict[str, _Cost]) -> _Cost:
        most = first = last = 1
        nullable = False
        starts: _Chars = frozenset()
        ends: _Chars = frozenset()
        for seq in self.rules[rule]:
            items = [self.item_cost(x, costs, rule) for x in seq]
            for c in items:  # the start: up to the first item that cannot be empty
                first, starts = max(first, c.first), _union(starts, c.starts)
                if not c.nullable:
                    break
            for c in reversed(items):
                last, ends = max(last, c.last), _union(ends, c.ends)
                if not c.nullable:
                    break
            most = max([most] + [c.most for c in items])
            nullable = nullable or all(c.nullable for c in items)
        return _Cost(most, first, last, nullable, starts, ends)

    def check(self) -> None:
        self.parse()
        deps = {r: [x[1] if x[0] == "r" else x[1][1] for seq in alts for x in seq
                    if x[0] == "r" or (x[0] == "x" and x[1][0] == "r")] for r, alts in self.rules.items()}
        costs: dict[str, _Cost] = {}
        busy: set[str] = set()
        for top in self.rules:  # depth first, each rule after those it refers to
            if top in costs:
                continue
            busy.add(top)
            stack = [(top, iter(deps[top]))]
            while stack:
                rule, todo = stack[-1]
                for d in todo:
                    if d in self.rules and d not in costs and d not in busy:
                        busy.add(d)
                        stack.append((d, iter(deps[d])))
                        break
                else:
                    stack.pop()
                    costs[rule] = self.rule_cost(rule, costs)
                    busy.discard(rule)


def check_grammar(text: str) -> None:
    """GrammarError (a ValueError) naming the rule, before llama.cpp parses a grammar that would crash it, run away
    or can match nothing: longer than GRAMMAR_MAX_BYTES, nested deeper than GRAMMAR_MAX_DEPTH, an empty character
    range (``[z-a]``), a repetition whose minimum is above its maximum (``{3,1}``) or whose bound is above
    GRAMMAR_MAX_REPETITION, or nested repetitions whose product is above GRAMMAR_MAX_REPETITION_PRODUCT. One pass
    over the text, and one over its rules: milliseconds for a megabyte."""
    if len(text.encode("utf-8", errors="surrogatepass")) > GRAMMAR_MAX_BYTES:
        raise GrammarError(f"grammar: longer than {GRAMMAR_MAX_BYTES} bytes")
    _GrammarCheck(text).check()
