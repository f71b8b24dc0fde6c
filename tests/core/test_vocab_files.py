"""Tokenization against upstream's vocabularies (vendor/llama.cpp/models/ggml-vocab-*.gguf).

Mirrors upstream's tests through the low-level binding:

- ``tests/test-tokenizer-0.cpp``: each ``<vocab>.gguf.inp`` holds test strings separated by the line
  ``__ggml_vocab_test__``; line ``i`` of ``<vocab>.gguf.out`` holds the expected token ids of string
  ``i``. The vocabulary is loaded with ``vocab_only = true`` and every string is tokenized with
  ``add_special = false, parse_special = false``.
- ``tests/test-tokenizer-1-spm.cpp`` / ``-1-bpe.cpp``: every token detokenizes (``special = true``)
  to a text that tokenizes (``parse_special = true``) and detokenizes back to the same text, and
  every Unicode code point survives tokenize + detokenize. Upstream runs this on llama-spm (the BPE
  variant is disabled there for slowness); we also run it on qwen2 (the vocabulary of our synthetic
  models) and a few cheap ones, and walk code points with a stride to stay fast.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pyllama_moe import backend
from pyllama_moe.errors import ModelLoadError, check_ptr
from pyllama_moe.ffi import ffi, lib

MODELS = Path(__file__).resolve().parents[2] / "vendor" / "llama.cpp" / "models"
SEPARATOR = b"\n__ggml_vocab_test__\n"
VOCABS = sorted(p.name[: -len(".gguf.inp")].removeprefix("ggml-vocab-")
                for p in MODELS.glob("ggml-vocab-*.gguf.inp") if p.with_suffix(".out").is_file())
ROUND_TRIP = ["llama-spm", "phi-3", "qwen2", "gpt-2", "llama-bpe"]
CODEPOINT_STRIDE = 7  # upstream walks all 0x110000; a stride keeps the Python loop at a fraction of a second

pytestmark = pytest.mark.skipif(
    not VOCABS, reason="vendor/llama.cpp/models has no .inp/.out pairs (run scripts/vendor.py apply)")


def vocab_path(name: str) -> Path:
    return MODELS / f"ggml-vocab-{name}.gguf"


def read_tests(path: Path) -> list[tuple[bytes, list[int]]]:
    """``(text, expected tokens)`` pairs of ``path.inp`` / ``path.out``, read as test-tokenizer-0.cpp reads them."""
    raw = Path(f"{path}.inp").read_bytes()
    texts = raw.split(SEPARATOR)
    if texts and texts[-1] == b"":  # the file ends with a separator
        texts.pop()
    lines = Path(f"{path}.out").read_text(encoding="utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    assert len(texts) == len(lines), f"{path}: {len(texts)} inputs but {len(lines)} expected outputs"
    return [(t, [int(x) for x in line.split()]) for t, line in zip(texts, lines, strict=True)]


@pytest.fixture(scope="module")
def vocabs() -> Iterator[dict[str, Any]]:
    """Loads each vocabulary once (``vocab_only``), frees them all at the end of the module."""
    backend.init()
    models: dict[str, Any] = {}
    loaded: dict[str, Any] = {}

    def get(name: str) -> Any:
        if name not in loaded:
            params = lib.llama_model_default_params()
            params.vocab_only = True
            path = vocab_path(name)
            m = check_ptr(lib.llama_model_load_from_file(str(path).encode(), params), ModelLoadError,
                          f"cannot load {path}")
            models[name] = m
            loaded[name] = lib.llama_model_get_vocab(m)
        return loaded[name]

    try:
        yield {"get": get}
    finally:
        for m in models.values():
            lib.llama_model_free(m)


def tokenize(vocab: Any, text: bytes, add_special: bool, parse_special: bool) -> list[int]:
    """common_tokenize: ask with a guess, retry with the size llama_tokenize reports."""
    n = len(text) + 2 * add_special
    buf = ffi.new("llama_token[]", max(n, 1))
    k = lib.llama_tokenize(vocab, text, len(text), buf, n, add_special, parse_special)
    if k < 0:
        buf = ffi.new("llama_token[]", -k)
        k = lib.llama_tokenize(vocab, text, len(text), buf, -k, add_special, parse_special)
        assert k >= 0
    return list(buf[0:k])


def detokenize(vocab: Any, tokens: list[int], special: bool = True) -> bytes:
    """common_detokenize (``remove_special = false``)."""
    toks = ffi.new("llama_token[]", tokens or [0])
    n = max(len(tokens), 16)
    out = ffi.new("char[]", n)
    k = lib.llama_detokenize(vocab, toks, len(tokens), out, n, False, special)
    if k < 0:
        n = -k
        out = ffi.new("char[]", n)
        k = lib.llama_detokenize(vocab, toks, len(tokens), out, n, False, special)
        assert 0 <= k <= n
    return ffi.buffer(out, k)[:]


def test_every_vocab_with_expectations_is_covered() -> None:
    # the list upstream's tests/CMakeLists.txt runs test-tokenizer-0 on
    assert {"llama-spm", "llama-bpe", "qwen2", "phi-3", "gpt-2", "bert-bge"} <= set(VOCABS)


@pytest.mark.parametrize("name", VOCABS)
def test_tokenize_matches_upstream_expectations(vocabs: dict[str, Any], name: str) -> None:
    vocab = vocabs["get"](name)
    tests = read_tests(vocab_path(name))
    assert len(tests) > 30
    failed = []
    for text, expected in tests:
        got = tokenize(vocab, text, add_special=False, parse_special=False)
        if got != expected:
            failed.append(f"{text!r}: got {got}, expected {expected}")
    assert not failed, f"{name}: {len(failed)} of {len(tests)} differ:\n" + "\n".join(failed[:5])


@pytest.mark.parametrize("name", ROUND_TRIP)
def test_every_token_round_trips(vocabs: dict[str, Any], name: str) -> None:
    vocab = vocabs["get"](name)
    spm = lib.llama_vocab_type(vocab) == lib.LLAMA_VOCAB_TYPE_SPM
    failed = []
    for i in range(lib.llama_vocab_n_tokens(vocab)):
        text = detokenize(vocab, [i])
        if not spm:
            try:  # test-tokenizer-1-bpe skips pieces that are not valid UTF-8 (partial byte tokens)
                text.decode("utf-8")
            except UnicodeDecodeError:
                continue
        check = detokenize(vocab, tokenize(vocab, text, add_special=False, parse_special=True))
        if check != text:
            failed.append(f"token {i}: {text!r} -> {check!r}")
    assert not failed, f"{name}: {len(failed)} tokens do not round-trip: " + "; ".join(failed[:5])


@pytest.mark.parametrize("name", ROUND_TRIP)
def test_code_points_round_trip(vocabs: dict[str, Any], name: str) -> None:
    vocab = vocabs["get"](name)
    spm = lib.llama_vocab_type(vocab) == lib.LLAMA_VOCAB_TYPE_SPM
    failed = []
    for cp in range(0, 0x110000, CODEPOINT_STRIDE):
        if 0xD800 <= cp <= 0xDFFF or 0x40000 <= cp <= 0xE0000:  # surrogates, unassigned planes
            continue
        text = chr(cp).encode()
        # upstream: the spm test parses special tokens, the bpe test does not; 9601 is U+2581 (spm's space marker)
        check = detokenize(vocab, tokenize(vocab, text, add_special=False, parse_special=spm))
        if check != text and cp != 9601:
            failed.append(f"U+{cp:04X} -> {check!r}")
    assert not failed, f"{name}: {len(failed)} code points do not round-trip: " + "; ".join(failed[:5])
