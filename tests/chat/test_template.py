"""pyllama_moe.chat.template: Jinja2 chat templates, as GGUF files carry them.

The templates come from a real model, a synthetic GGUF (random weights) whose tokenizer and chat template
are qwen2's, read through the low-level binding, and from upstream's vocab GGUFs.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pyllama_moe import chat
from pyllama_moe.chat import formats
from pyllama_moe.ffi import ffi, lib

from fixtures.chat import (
    CONVERSATION,
    EXPECTED,
    NO_SYSTEM,
    WEATHER_TOOL,
    builtin_template,
    completion,
    detokenize,
    load_vocab_only,
    tokenize,
)

MODELS = Path(__file__).resolve().parents[2] / "vendor" / "llama.cpp" / "models"


class LowLevelLlama:
    """The part of ``Llama`` that the chat module reads, over a vocab loaded by the binding.

    ``create_completion`` records its arguments and answers with a fixed completion.
    """

    def __init__(self, path: Path) -> None:
        self.model = load_vocab_only(path)
        self.vocab = lib.llama_model_get_vocab(self.model)
        self.metadata = self._metadata()
        self.chat_format: str | None = None
        self.chat_handler: Any = None
        self.verbose = False
        self.calls: list[dict[str, Any]] = []

    def _metadata(self) -> dict[str, str]:
        out = {}
        for i in range(lib.llama_model_meta_count(self.model)):
            key = ffi.new("char[]", 256)
            lib.llama_model_meta_key_by_index(self.model, i, key, 256)
            n = lib.llama_model_meta_val_str_by_index(self.model, i, ffi.NULL, 0)
            val = ffi.new("char[]", n + 1)
            lib.llama_model_meta_val_str_by_index(self.model, i, val, n + 1)
            out[ffi.string(key).decode()] = ffi.string(val).decode("utf-8", errors="replace")
        return out

    def close(self) -> None:
        if self.model is not None:
            lib.llama_model_free(self.model)
            self.model = None

    def token_bos(self) -> int:
        return lib.llama_vocab_bos(self.vocab)

    def token_eos(self) -> int:
        return lib.llama_vocab_eos(self.vocab)

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        return tokenize(self.vocab, text, add_bos, special)

    def detokenize(self, tokens: list[int], prev_tokens: Any = None, special: bool = False) -> bytes:
        return detokenize(self.vocab, list(tokens), special)

    def create_completion(self, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(kwargs)
        return completion("ok")


@pytest.fixture(scope="module")
def low(tiny_model: Path) -> Iterator[LowLevelLlama]:
    llama = LowLevelLlama(tiny_model)
    try:
        yield llama
    finally:
        llama.close()


def test_template_environment() -> None:
    def render(source: str, **kw: Any) -> str:
        return chat.Jinja2ChatFormatter(source, "</s>", "<s>").render([], **kw)

    with pytest.raises(ValueError, match="roles must alternate"):
        render("{{ raise_exception('roles must alternate') }}")
    assert render("{{ strftime_now('%Y') }}").isdigit()
    # transformers' tojson: key order kept, no HTML escaping, indent allowed
    assert render("{{ {'b': '<x>', 'a': 'é'} | tojson }}") == '{"b": "<x>", "a": "é"}'
    assert render("{{ [1] | tojson(indent=2) }}") == "[\n  1\n]"
    assert render("{% for i in [1, 2, 3] %}{% if i == 2 %}{% break %}{% endif %}{{ i }}{% endfor %}") == "1"
    assert render("{{ bos_token }}{{ eos_token }}{{ add_generation_prompt }}") == "<s></s>True"
    # sandboxed and immutable
    import jinja2.exceptions

    with pytest.raises(jinja2.exceptions.SecurityError):
        render("{{ ''.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(jinja2.exceptions.SecurityError):
        render("{{ messages.append(1) }}")
    # trim_blocks / lstrip_blocks
    assert render("{% if true %}\n  x\n{% endif %}\n") == "  x\n"


def test_gguf_template_path_with_a_real_model(low: LowLevelLlama) -> None:
    """The synthetic model carries qwen2's chat template; llama.cpp reads it from the file."""
    template = low.metadata["tokenizer.chat_template"]
    assert "<|im_start|>" in template and chat.guess_chat_format_from_gguf_metadata(low.metadata) is None
    assert ffi.string(lib.llama_model_chat_template(low.model, ffi.NULL)).decode() == template
    eos = low.token_eos()
    assert detokenize(low.vocab, [eos], special=True) == b"<|endoftext|>"

    low.chat_format, low.calls = None, []
    out = chat.create_chat_completion(low, messages=[{"role": "user", "content": "Hi there"}])
    call = low.calls[0]
    prompt = detokenize(low.vocab, call["prompt"], special=True).decode()
    assert prompt == ("<|im_start|>system\nYou are a helpful assistant<|im_end|>\n"
                      "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n")
    im_start = tokenize(low.vocab, b"<|im_start|>", parse_special=True)
    assert len(im_start) == 1 and call["prompt"][0] == im_start[0]  # special tokens parsed, no BOS added
    assert call["prompt"].count(im_start[0]) == 3
    assert call["stop"] == ["<|endoftext|>"]  # the EOS text
    assert out["object"] == "chat.completion" and out["choices"][0]["message"]["content"] == "ok"

    # the explicit name of the default template renders the same; with a system message it is ChatML,
    # which llama.cpp's own renderer produces too
    low.chat_format, low.calls = "chat_template.default", []
    chat.create_chat_completion(low, messages=CONVERSATION)
    prompt = detokenize(low.vocab, low.calls[0]["prompt"], special=True).decode()
    assert prompt == builtin_template("chatml", CONVERSATION) == EXPECTED["chatml"][0]


@pytest.mark.parametrize("name", ["phi-3", "command-r", "gemma-4"])
def test_upstream_vocab_templates_render(name: str) -> None:
    """Real templates from upstream's vocab GGUFs, rendered by our sandbox with their BOS/EOS texts."""
    path = MODELS / f"ggml-vocab-{name}.gguf"
    if not path.is_file():
        pytest.skip(f"{path} is not vendored")
    llama = LowLevelLlama(path)
    try:
        formatter = chat.template_formatter(llama)
        tools = [WEATHER_TOOL]
        result = formatter(messages=CONVERSATION if name != "phi-3" else NO_SYSTEM, tools=tools)
        assert result.added_special and result.stop == [formatter.eos_token]
        assert formatter.bos_token and result.prompt.startswith(formatter.bos_token)
        assert "How are you?" in result.prompt
        body = result.prompt[len(formatter.bos_token):]
        if name == "phi-3":  # the GGUF's template and our phi-3 format agree (BOS aside)
            assert body == formats.format_phi3(messages=NO_SYSTEM).prompt
        elif name == "command-r":
            assert body == builtin_template("command-r", CONVERSATION)
        else:
            assert "get_weather" in body  # gemma-4's template lists the tools
    finally:
        llama.close()
