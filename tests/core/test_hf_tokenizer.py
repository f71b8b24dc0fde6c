"""``Llama(tokenizer=...)``: llama-cpp-python's ``LlamaHFTokenizer`` (and any ``BaseLlamaTokenizer``) tokenizes the
prompts and the ``tokenize`` / ``detokenize`` calls (#31)."""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from pyllama_moe import Llama
from pyllama_moe.llama_tokenizer import BaseLlamaTokenizer, LlamaHFTokenizer

from fixtures.models import model_path


class FakeHF:
    """A Hugging Face tokenizer's ``encode`` / ``decode`` over a Llama's own vocabulary (no transformers needed)."""

    def __init__(self, llm: Llama) -> None:
        self.llm = llm
        self.calls: list[str] = []

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self.calls.append("encode")
        return self.llm.tokenize(text.encode(), add_bos=add_special_tokens, special=add_special_tokens)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        self.calls.append("decode")
        return self.llm.detokenize(list(ids), special=not skip_special_tokens).decode("utf-8", errors="ignore")


@pytest.fixture(scope="module")
def plain() -> Iterator[Llama]:
    with Llama(str(model_path("qwen3moe")), n_ctx=256, verbose=False) as m:
        yield m


def test_the_prompt_goes_through_the_tokenizer(plain: Llama) -> None:
    hf = FakeHF(plain)
    with Llama(str(model_path("qwen3moe")), n_ctx=256, verbose=False, tokenizer=LlamaHFTokenizer(hf)) as llm:
        assert isinstance(llm.tokenizer_, LlamaHFTokenizer)
        text = "The quick brown fox"
        assert llm.tokenize(text.encode()) == plain.tokenize(text.encode(), special=True)
        assert "encode" in hf.calls
        hf.calls.clear()
        out = llm.create_completion(text, max_tokens=8, temperature=0)
        assert hf.calls == ["encode"]  # the prompt, once
        expected = plain.create_completion(text, max_tokens=8, temperature=0)["choices"][0]["text"]
        assert out["choices"][0]["text"] == expected
        ids = plain.tokenize(b"hello world", add_bos=False)
        assert llm.detokenize(ids) == plain.detokenize(ids)
        # after earlier tokens: what the new ones add to the text
        assert llm.detokenize(ids[1:], prev_tokens=ids[:1]) == plain.detokenize(ids)[len(plain.detokenize(ids[:1])):]


def test_a_tokenizer_outside_the_vocabulary_is_an_error(plain: Llama) -> None:
    class Wide(BaseLlamaTokenizer):
        def tokenize(self, text: bytes, add_bos: bool = True, special: bool = True) -> list[int]:
            return [plain.n_vocab() + 5]

        def detokenize(self, tokens: Sequence[int], prev_tokens: Sequence[int] | None = None,
                       special: bool = False) -> bytes:
            return b""

    with Llama(str(model_path("qwen3moe")), n_ctx=64, verbose=False, tokenizer=Wide()) as llm:
        with pytest.raises(ValueError, match="not in the model's vocabulary"):
            llm.create_completion("x", max_tokens=1)
    with pytest.raises(ValueError, match="BaseLlamaTokenizer"):
        Llama(str(model_path("qwen3moe")), verbose=False, tokenizer="gpt2")


def test_from_pretrained_needs_transformers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers now fails, installed or not
    with pytest.raises(ImportError, match="pip install transformers"):
        LlamaHFTokenizer.from_pretrained("any/model")

    class Auto:
        @staticmethod
        def from_pretrained(pretrained_model_name_or_path: str) -> Any:
            return ("tokenizer of", pretrained_model_name_or_path)

    fake = type(sys)("transformers")
    fake.AutoTokenizer = Auto  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "transformers", fake)
    assert LlamaHFTokenizer.from_pretrained("org/name").hf_tokenizer == ("tokenizer of", "org/name")
