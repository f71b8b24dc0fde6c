"""pyllama_moe.chat: chat formats, GGUF chat templates, result shapes, JSON grammars, tool calls.

Three kinds of oracle:
- exact strings: what llama-cpp-python 0.3.36's formats render, and llama.cpp's own C++ renderer
  (``llama_chat_apply_template``) for the formats both know;
- llama.cpp's grammar engine on a real vocabulary: every grammar we make is parsed by
  ``llama_sampler_init_grammar``, and texts are checked against it token by token (:class:`Grammar`);
- a real model: a synthetic GGUF (random weights) whose tokenizer and chat template are qwen2's,
  read through the low-level binding (template path) and, when ``pyllama_moe.Llama`` is importable,
  generated from (JSON output, tool calls).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pyllama_moe import backend, chat, synth
from pyllama_moe.chat import formats, grammar
from pyllama_moe.chat.grammar import (
    JSON_GBNF,
    JSON_VALUE_GBNF,
    SchemaError,
    json_schema_to_gbnf,
)
from pyllama_moe.errors import ModelLoadError, check_ptr
from pyllama_moe.ffi import ffi, lib

MODELS = Path(__file__).resolve().parent.parent / "vendor" / "llama.cpp" / "models"

SYSTEM = {"role": "system", "content": "Be brief."}
CONVERSATION = [
    SYSTEM,
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "How are you?"},
]
NO_SYSTEM = CONVERSATION[1:]

WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "unit": {"enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 0},
            },
            "required": ["city", "unit"],
        },
    },
}


# --------------------------------------------------------------------------------------------
# helpers: the low-level binding


def load_vocab_only(path: Path) -> Any:
    backend.init()
    params = lib.llama_model_default_params()
    params.vocab_only = True
    return check_ptr(lib.llama_model_load_from_file(str(path).encode(), params), ModelLoadError, f"cannot load {path}")


def tokenize(vocab: Any, text: bytes, add_special: bool = False, parse_special: bool = False) -> list[int]:
    n = len(text) + 8
    buf = ffi.new("llama_token[]", n)
    k = lib.llama_tokenize(vocab, text, len(text), buf, n, add_special, parse_special)
    assert k >= 0
    return list(buf[0:k])


def detokenize(vocab: Any, tokens: list[int], special: bool) -> bytes:
    toks = ffi.new("llama_token[]", tokens or [0])
    n = 16 + 64 * len(tokens)
    out = ffi.new("char[]", n)
    k = lib.llama_detokenize(vocab, toks, len(tokens), out, n, False, special)
    assert k >= 0
    return ffi.buffer(out, k)[:]


def builtin_template(name: str, messages: list[dict[str, str]]) -> str:
    """llama.cpp's own (C++) rendering of ``messages`` with its built-in template ``name``."""
    keep, arr = [], ffi.new("struct llama_chat_message[]", len(messages))
    for i, m in enumerate(messages):
        role, content = ffi.new("char[]", m["role"].encode()), ffi.new("char[]", m["content"].encode())
        keep += [role, content]
        arr[i].role, arr[i].content = role, content
    buf = ffi.new("char[]", 8192)
    k = lib.llama_chat_apply_template(name.encode(), arr, len(messages), True, buf, 8192)
    assert 0 < k <= 8192, name
    return ffi.buffer(buf, k)[:].decode()


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


class Grammar:
    """A GBNF grammar parsed by llama.cpp for a vocabulary; checks texts against it token by token."""

    def __init__(self, vocab: Any, text: str) -> None:
        self.vocab, self.text = vocab, text
        smpl = lib.llama_sampler_init_grammar(vocab, text.encode(), b"root")
        assert smpl != ffi.NULL, f"llama.cpp rejects the grammar:\n{text}"
        lib.llama_sampler_free(smpl)

    def _allowed(self, smpl: Any, token: int) -> bool:
        data = ffi.new("llama_token_data[1]", [{"id": token, "logit": 0.0, "p": 0.0}])
        arr = ffi.new("llama_token_data_array *", {"data": data, "size": 1, "selected": -1, "sorted": False})
        lib.llama_sampler_apply(smpl, arr)
        return not math.isinf(data[0].logit)

    def accepts(self, text: str, complete: bool = True) -> bool:
        """Whether ``text`` is in the language (``complete``) or a prefix of a sentence of it."""
        smpl = lib.llama_sampler_init_grammar(self.vocab, self.text.encode(), b"root")
        try:
            for token in tokenize(self.vocab, text.encode()):
                if not self._allowed(smpl, token):  # never accept a rejected token: llama.cpp would throw
                    return False
                lib.llama_sampler_accept(smpl, token)
            return not complete or self._allowed(smpl, lib.llama_vocab_eos(self.vocab))
        finally:
            lib.llama_sampler_free(smpl)


# --------------------------------------------------------------------------------------------
# helpers: a stub Llama and completions shaped like llama-cpp-python's


def completion(text: str, finish_reason: str = "stop", logprobs: Any = None) -> dict[str, Any]:
    return {
        "id": "cmpl-123",
        "object": "text_completion",
        "created": 1700000000,
        "model": "stub.gguf",
        "choices": [{"text": text, "index": 0, "logprobs": logprobs, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
    }


def chunks(texts: list[str], finish_reason: str = "stop") -> Iterator[dict[str, Any]]:
    for text in texts:
        yield {"id": "cmpl-123", "object": "text_completion", "created": 1700000000, "model": "stub.gguf",
               "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": None}]}
    yield {"id": "cmpl-123", "object": "text_completion", "created": 1700000000, "model": "stub.gguf",
           "choices": [{"text": "", "index": 0, "logprobs": None, "finish_reason": finish_reason}]}


class StubLlama:
    """``Llama`` as the chat module sees it: tokens are bytes (plus 1 for BOS); completions are scripted."""

    def __init__(self, replies: list[Any] | None = None, chat_format: str | None = None,
                 metadata: dict[str, str] | None = None) -> None:
        self.replies = list(replies or [])
        self.chat_format = chat_format
        self.chat_handler: Any = None
        self.metadata = metadata or {}
        self.verbose = False
        self.calls: list[dict[str, Any]] = []

    def token_bos(self) -> int:
        return 1

    def token_eos(self) -> int:
        return 2

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        return ([1] if add_bos else []) + list(text)

    def detokenize(self, tokens: list[int], prev_tokens: Any = None, special: bool = False) -> bytes:
        names = {1: b"<s>", 2: b"</s>"}
        return b"".join((names[t] if special else b"") if t in names else bytes([t]) for t in tokens)

    def create_completion(self, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        reply = self.replies.pop(0) if self.replies else completion("ok")
        if kwargs.get("stream"):
            return chunks(reply) if isinstance(reply, list) else reply
        return reply

    def prompt(self, i: int = -1) -> str:
        """The text of the prompt of call ``i``."""
        toks = self.calls[i]["prompt"]
        return toks if isinstance(toks, str) else bytes(t for t in toks if t > 2).decode()


# --------------------------------------------------------------------------------------------
# fixtures


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A synthetic GGUF: random weights, qwen2's tokenizer and chat template (copied from its vocab)."""
    return synth.write_model(tmp_path_factory.mktemp("chat") / "tiny.gguf", "tiny", seed=1)


@pytest.fixture(scope="module")
def low(tiny_model: Path) -> Iterator[LowLevelLlama]:
    llama = LowLevelLlama(tiny_model)
    try:
        yield llama
    finally:
        llama.close()


@pytest.fixture(scope="module")
def vocab() -> Iterator[Any]:
    model = load_vocab_only(synth.default_vocab_path())
    try:
        yield lib.llama_model_get_vocab(model)
    finally:
        lib.llama_model_free(model)


# --------------------------------------------------------------------------------------------
# built-in formats

EXPECTED = {
    "chatml": (("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
                "Hello!<|im_end|>\n<|im_start|>user\nHow are you?<|im_end|>\n<|im_start|>assistant\n"), "<|im_end|>"),
    "qwen": (("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
              "Hello!<|im_end|>\n<|im_start|>user\nHow are you?<|im_end|>\n<|im_start|>assistant\n"), "<|endoftext|>"),
    "llama-2": ("[INST] <<SYS>>\nBe brief.\n<</SYS>> Hi there [/INST]Hello! </s><s>[INST]How are you?  [/INST]", None),
    "llama-3": (("<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                 "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
                 "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
                 "<|start_header_id|>user<|end_header_id|>\n\nHow are you?<|eot_id|>"
                 "<|start_header_id|>assistant<|end_header_id|>\n\n"), "<|eot_id|>"),
    "mistral-instruct": ("[INST] Hi there [/INST]Hello!</s>[INST] How are you? [/INST]", "</s>"),
    "gemma": (("<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
               "<start_of_turn>user\nHow are you?<end_of_turn>\n<start_of_turn>model\n"), "<end_of_turn>\n"),
    "phi-3": (("<|system|>\nBe brief.<|end|>\n<|user|>\nHi there<|end|>\n<|assistant|>\nHello!<|end|>\n"
               "<|user|>\nHow are you?<|end|>\n<|assistant|>\n"), ["<|end|>", "<|endoftext|>"]),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_builtin_format_renders_a_two_turn_conversation(name: str) -> None:
    llama = StubLlama(chat_format=name)
    out = chat.create_chat_completion(llama, messages=CONVERSATION)
    prompt, stop = EXPECTED[name]
    assert llama.prompt() == prompt
    call = llama.calls[0]
    assert call["prompt"][0] == 1  # these formats leave BOS to the tokenizer
    assert call["stop"] == ([] if stop is None else [stop] if isinstance(stop, str) else stop)
    assert out["choices"][0]["message"] == {"role": "assistant", "content": "ok"}


@pytest.mark.parametrize(("name", "builtin", "messages"), [
    ("chatml", "chatml", CONVERSATION),
    ("llama-3", "llama3", CONVERSATION),
    ("phi-3", "phi3", CONVERSATION),
    ("gemma", "gemma", NO_SYSTEM),  # llama.cpp folds a system message into the first user turn; gemma has none
])
def test_builtin_format_matches_llama_cpp_renderer(name: str, builtin: str, messages: list[dict[str, str]]) -> None:
    handler_format = {"chatml": formats.format_chatml, "llama-3": formats.format_llama3,
                      "phi-3": formats.format_phi3, "gemma": formats.format_gemma}[name]
    assert handler_format(messages=messages).prompt == builtin_template(builtin, messages)


# llama-cpp-python's other formats, for [system S, user U1, assistant A1, user U2]: (prompt, stop)
MORE_FORMATS = {
    "oasst_llama": ("[INST] <<SYS>>\nS\n<</SYS>>\n\n<|prompter|>U1</s><|assistant|>A1</s><|prompter|>U2</s><|assistant|>", None),
    "baichuan-2": ("S<reserved_106>U1<reserved_107>A1<reserved_106>U2<reserved_107>", None),
    "baichuan": ("S<reserved_102>U1<reserved_103>A1<reserved_102>U2<reserved_103>", None),
    "redpajama-incite": ("S\n<human>: U1\n<bot>: A1\n<human>: U2\n<bot>:", "<human>"),
    "snoozy": ("S\n### Prompt: U1\n### Response: A1\n### Prompt: U2\n### Response:", "###"),
    "phind": (("### System Prompt\nYou are an intelligent programming assistant.\n\n### User Message: U1\n\n"
              "### Assistant: A1\n\n### User Message: U2\n\n### Assistant:"), None),
    "mistrallite": ("<|system|>S</s><|prompter|>U1 </s>\n<|assistant|>A1 <|prompter|>U2 </s>\n<|assistant|>", None),
    "pygmalion": ("<|system|>S\n\n<|user|>\nU1\n\n<|model|>\nA1\n\n<|user|>\nU2\n\n<|model|>\n", "\n"),
    "chatglm3": ("<|system|>\nS<|user|>\n U1<|assistant|>\n A1<|user|>\n U2<|assistant|>", "</s>"),
    "alpaca": ("S\n\n### Instruction: U1\n\n### Response: A1</s>### Instruction: U2\n\n", None),
    "vicuna": (("A chat between a curious user and an artificial intelligence assistant. The assistant gives helpful, "
               "detailed, and polite answers to the user's questions. USER: U1 ASSISTANT: A1</s>USER: U2 ASSISTANT:"), None),
    "zephyr": ("<|system|>\nS</s>\n<|user|>\n\nU1</s>\n<|assistant|>\n\nA1</s>\n<|user|>\n\nU2</s>\n<|assistant|>\n\n", "</s>"),
    "openchat": (("S<|end_of_turn|><|end_of_turn|>\nGPT4 Correct User: \nU1<|end_of_turn|>\n<|end_of_turn|>GPT4 Correct "
                 "Assistant: \nA1<|end_of_turn|>\nGPT4 Correct User: \nU2<|end_of_turn|>\n<|end_of_turn|>GPT4 Correct "
                 "Assistant: \n"), "<|end_of_turn|>"),
}


@pytest.mark.parametrize("name", sorted(MORE_FORMATS))
def test_more_llama_cpp_python_formats(name: str) -> None:
    llama = StubLlama(chat_format=name)
    chat.create_chat_completion(llama, messages=[{"role": "system", "content": "S"}, {"role": "user", "content": "U1"},
                                                 {"role": "assistant", "content": "A1"}, {"role": "user", "content": "U2"}])
    prompt, stop = MORE_FORMATS[name]
    assert llama.prompt() == prompt
    assert llama.calls[0]["stop"] == ([] if stop is None else [stop])


def test_format_details() -> None:
    # chatml always has its system turn; qwen has a default system prompt
    assert formats.format_chatml(messages=NO_SYSTEM).prompt.startswith("<|im_start|>system\n<|im_end|>\n")
    assert formats.format_qwen(messages=NO_SYSTEM).prompt.startswith(
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n")
    # content given as parts contributes its text
    parts = [{"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]}]
    assert formats.format_chatml(messages=parts).prompt.endswith("<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n")
    # the caller's stop strings come first
    llama = StubLlama(chat_format="chatml")
    chat.create_chat_completion(llama, messages=NO_SYSTEM, stop="END")
    assert llama.calls[0]["stop"] == ["END", "<|im_end|>"]


def test_registry() -> None:
    names = chat.list_chat_formats()
    for name in ("chatml", "llama-2", "llama-3", "mistral-instruct", "gemma", "qwen", "phi-3", "chatml-function-calling"):
        assert name in names

    @chat.register_chat_format("test-plain")
    def plain(messages: list[dict[str, Any]], **kwargs: Any) -> chat.ChatFormatterResponse:
        return chat.ChatFormatterResponse(prompt="|".join(m["content"] for m in messages), stop="#")

    try:
        assert plain(messages=NO_SYSTEM).prompt == "Hi there|Hello!|How are you?"  # the decorator returns the formatter
        llama = StubLlama(chat_format="test-plain")
        chat.create_chat_completion(llama, messages=NO_SYSTEM)
        assert llama.prompt() == "Hi there|Hello!|How are you?" and llama.calls[0]["stop"] == ["#"]
        with pytest.raises(ValueError, match="already registered"):
            chat.register_chat_format("test-plain")(plain)
        chat.register_chat_format("test-plain", overwrite=True)(plain)
    finally:
        chat.unregister_chat_handler("test-plain")
    with pytest.raises(chat.ChatFormatNotFoundError, match="valid formats:.*chatml"):
        chat.create_chat_completion(StubLlama(chat_format="no-such-format"), messages=NO_SYSTEM)
    assert issubclass(chat.LlamaChatCompletionHandlerNotFoundException, Exception)


def test_chat_handler_takes_precedence() -> None:
    seen: dict[str, Any] = {}

    def handler(*, llama: Any, messages: list[dict[str, Any]], **kwargs: Any) -> dict[str, Any]:
        seen.update(kwargs, messages=messages)
        return {"handled": True}

    llama = StubLlama(chat_format="chatml")
    llama.chat_handler = handler
    assert chat.create_chat_completion(llama, messages=NO_SYSTEM, temperature=0.5) == {"handled": True}
    assert seen["temperature"] == 0.5 and seen["messages"] == NO_SYSTEM and not llama.calls
    # as from llama-cpp-python's Llama.create_chat_completion: every keyword, with its defaults
    assert set(seen) == {*chat.dispatch.chat_completion_defaults(), "messages"}
    assert seen["repeat_penalty"] == 1.0 and seen["stop"] == [] and seen["stream"] is False
    # a per-model handler (llama-cpp-python's Llama._chat_handlers) serves its chat_format
    llama = StubLlama(chat_format="mine")
    llama._chat_handlers = {"mine": handler}  # type: ignore[attr-defined]
    assert chat.create_chat_completion(llama, messages=NO_SYSTEM) == {"handled": True}


def test_default_format_without_template_is_llama2() -> None:
    llama = StubLlama()
    chat.create_chat_completion(llama, messages=NO_SYSTEM)
    assert llama.prompt() == EXPECTED["llama-2"][0].replace("[INST] <<SYS>>\nBe brief.\n<</SYS>> Hi there [/INST]",
                                                            " <s>[INST]Hi there  [/INST]")


def test_known_templates_are_guessed() -> None:
    from pyllama_moe.chat import dispatch

    assert chat.guess_chat_format_from_gguf_metadata({}) is None
    assert chat.guess_chat_format_from_gguf_metadata({"tokenizer.chat_template": dispatch.CHATML_CHAT_TEMPLATE}) == "chatml"
    assert chat.guess_chat_format_from_gguf_metadata(
        {"tokenizer.chat_template": dispatch.LLAMA3_INSTRUCT_CHAT_TEMPLATE}) == "llama-3"
    assert chat.guess_chat_format_from_gguf_metadata(
        {"tokenizer.chat_template": dispatch.MIXTRAL_INSTRUCT_CHAT_TEMPLATE}) == "mistral-instruct"
    llama = StubLlama(metadata={"tokenizer.chat_template": dispatch.CHATML_CHAT_TEMPLATE})
    chat.create_chat_completion(llama, messages=CONVERSATION)
    assert llama.prompt() == EXPECTED["chatml"][0]
    # the guessed templates render what the format renders
    for name in ("chatml", "llama-3"):
        template = {"chatml": dispatch.CHATML_CHAT_TEMPLATE, "llama-3": dispatch.LLAMA3_INSTRUCT_CHAT_TEMPLATE}[name]
        rendered = chat.Jinja2ChatFormatter(template, eos_token="</s>", bos_token="").render(CONVERSATION)
        assert rendered == EXPECTED[name][0]


# --------------------------------------------------------------------------------------------
# Jinja2 templates


def test_template_environment() -> None:
    render = lambda source, **kw: chat.Jinja2ChatFormatter(source, "</s>", "<s>").render([], **kw)
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
    assert prompt == ("<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
                      "<|im_start|>assistant\n")
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


# --------------------------------------------------------------------------------------------
# result shapes


def test_chat_completion_shape() -> None:
    logprobs = {"tokens": ["a", "b"], "token_logprobs": [-0.1, -0.2], "top_logprobs": [{"a": -0.1}, {"b": -0.2, "c": -3.0}],
                "text_offset": [0, 1]}
    llama = StubLlama([completion("Fine.", "stop", logprobs)], chat_format="chatml")
    out = chat.create_chat_completion(llama, messages=NO_SYSTEM, logprobs=True, top_logprobs=2, max_tokens=5,
                                      temperature=0.3, seed=7)
    assert out == {
        "id": "chatcmpl-123",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "stub.gguf",
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": "Fine."},
            "logprobs": {"content": [
                {"token": "a", "bytes": None, "logprob": -0.1, "top_logprobs": [{"token": "a", "logprob": -0.1, "bytes": None}]},
                {"token": "b", "bytes": None, "logprob": -0.2, "top_logprobs": [
                    {"token": "b", "logprob": -0.2, "bytes": None}, {"token": "c", "logprob": -3.0, "bytes": None}]},
            ], "refusal": None},
            "finish_reason": "stop",
        }],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
    }
    call = llama.calls[0]
    assert call["logprobs"] == 2 and call["max_tokens"] == 5 and call["temperature"] == 0.3 and call["seed"] == 7
    assert call["grammar"] is None and call["stream"] is False
    # llama-cpp-python's Llama.create_chat_completion defaults for what the caller leaves out
    assert (call["top_p"], call["top_k"], call["min_p"], call["repeat_penalty"]) == (0.95, 40, 0.05, 1.0)
    # a handler called directly has the handler defaults
    direct = StubLlama()
    chat.get_chat_completion_handler("chatml")(llama=direct, messages=NO_SYSTEM)
    assert direct.calls[0]["repeat_penalty"] == 1.1 and direct.calls[0]["temperature"] == 0.2


def test_chat_completion_chunks_shape() -> None:
    llama = StubLlama([["Fi", "ne."]], chat_format="chatml")
    out = list(chat.create_chat_completion(llama, messages=NO_SYSTEM, stream=True))
    head = {"id": "chatcmpl-123", "model": "stub.gguf", "created": 1700000000, "object": "chat.completion.chunk"}
    assert out == [
        {**head, "choices": [{"index": 0, "delta": {"role": "assistant"}, "logprobs": None, "finish_reason": None}]},
        {**head, "choices": [{"index": 0, "delta": {"content": "Fi"}, "logprobs": None, "finish_reason": None}]},
        {**head, "choices": [{"index": 0, "delta": {"content": "ne."}, "logprobs": None, "finish_reason": None}]},
        {**head, "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}]},
    ]
    assert llama.calls[0]["stream"] is True


# --------------------------------------------------------------------------------------------
# response_format


def test_response_format_sets_the_grammar() -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    cases = [
        (None, None),
        ({"type": "text"}, None),
        ({"type": "json_object"}, JSON_GBNF),
        ({"type": "json_object", "schema": schema}, json_schema_to_gbnf(schema)),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}, json_schema_to_gbnf(schema)),
    ]
    for response_format, want in cases:
        llama = StubLlama(chat_format="chatml")
        chat.create_chat_completion(llama, messages=NO_SYSTEM, response_format=response_format)
        assert llama.calls[0]["grammar"] == want, response_format
    # the caller's own grammar passes through when no response_format is given
    llama = StubLlama(chat_format="chatml")
    chat.create_chat_completion(llama, messages=NO_SYSTEM, grammar='root ::= "x"')
    assert llama.calls[0]["grammar"] == 'root ::= "x"'
    with pytest.raises(ValueError, match="response_format type"):
        chat.create_chat_completion(StubLlama(chat_format="chatml"), messages=NO_SYSTEM, response_format={"type": "yaml"})


def test_unsupported_schema_falls_back_to_json(caplog: pytest.LogCaptureFixture) -> None:
    llama = StubLlama(chat_format="chatml")
    with caplog.at_level("WARNING", logger="pyllama_moe"):
        chat.create_chat_completion(llama, messages=NO_SYSTEM, response_format={
            "type": "json_object", "schema": {"type": "object", "properties": {"a": {"not": {"type": "string"}}}}})
    assert llama.calls[0]["grammar"] == JSON_GBNF
    assert "not" in caplog.text


# --------------------------------------------------------------------------------------------
# grammars, checked by llama.cpp's grammar engine on qwen2's vocabulary


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
    ("mixed", {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}, "z": {"type": "string"}},
               "required": ["y"]},
     ['{"y": 1}', '{"y": 1, "x": 2.5}', '{"y": 1, "z": "q"}', '{"y": 1, "x": 0, "z": ""}'],
     ['{"x": 2.5}', '{"x": 2.5, "y": 1}', '{"y": 1 "x": 2}']),
    ("additional properties", {"type": "object", "properties": {"id": {"type": "integer"}},
                               "additionalProperties": {"type": "string"}},
     ['{}', '{"id": 1}', '{"id": 1, "k": "v", "l": "w"}', '{"k": "v"}'],
     ['{"id": 1, "k": 2}', '{"k": 2}']),
    ("free object", {"type": "object"}, ['{}', '{"a": [1]}'], ['[]']),
    ("enum", {"enum": ["red", 1, None, {"a": [True]}]},
     ['"red"', "1", "null", '{"a":[true]}', '{ "a": [ true ] }'], ['"blue"', "2", '{"a": [false]}', '{"a": [true, true]}']),
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
        "$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
                                                             "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}},
                           "required": ["v", "next"]}},
        "$ref": "#/$defs/node"},
     ['{"v": 1, "next": null}', '{"v": 1, "next": {"v": 2, "next": null}}'], ['{"v": 1}', '{"v": 1, "next": {"v": 2}}']),
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
        return {"type": "array", "items": random_schema(rng, depth + 1), "minItems": lo, "maxItems": lo + rng.randint(0, 2)}
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


def test_gbnf_literals_escape(vocab: Any) -> None:
    text = 'q"uo\\te\n\t\x01é'
    g = Grammar(vocab, f"root ::= {grammar.gbnf_literal(text)}")
    assert g.accepts(text) and not g.accepts(text + "x")
    schema = {"enum": [text]}
    assert Grammar(vocab, json_schema_to_gbnf(schema)).accepts(json.dumps(text, ensure_ascii=False))


# --------------------------------------------------------------------------------------------
# tools


def test_forced_tool_call_with_a_builtin_format() -> None:
    args = '{"city": "Paris", "unit": "celsius"}'
    llama = StubLlama([completion(args)], chat_format="chatml")
    out = chat.create_chat_completion(llama, messages=NO_SYSTEM, tools=[WEATHER_TOOL],
                                      tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert llama.calls[0]["grammar"] == json_schema_to_gbnf(WEATHER_TOOL["function"]["parameters"])
    call = {"name": "get_weather", "arguments": args}
    assert out == {
        "id": "chatcmpl-123", "object": "chat.completion", "created": 1700000000, "model": "stub.gguf",
        "choices": [{"index": 0, "message": {
            "role": "assistant", "content": None, "function_call": call,
            "tool_calls": [{"id": "call__0_get_weather_cmpl-123", "type": "function", "function": call}]},
            "logprobs": None, "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
    }
    # the legacy functions / function_call keywords mean the same
    llama = StubLlama([completion(args)], chat_format="chatml")
    legacy = chat.create_chat_completion(llama, messages=NO_SYSTEM, functions=[WEATHER_TOOL["function"]],
                                         function_call={"name": "get_weather"})
    assert legacy == out
    with pytest.raises(ValueError, match="not found"):
        chat.create_chat_completion(StubLlama(chat_format="chatml"), messages=NO_SYSTEM, tools=[WEATHER_TOOL],
                                    tool_choice={"type": "function", "function": {"name": "nope"}})


def test_forced_tool_call_stream_shape() -> None:
    llama = StubLlama([['{"city": ', '"Oslo", "unit": "celsius"}']], chat_format="chatml-function-calling")
    out = list(chat.create_chat_completion(llama, messages=NO_SYSTEM, tools=[WEATHER_TOOL], stream=True,
                                           tool_choice={"type": "function", "function": {"name": "get_weather"}}))
    assert out[0]["choices"][0]["delta"] == {"role": "assistant", "content": None, "function_call": None, "tool_calls": None}
    deltas = [c["choices"][0]["delta"] for c in out[1:-1]]
    assert "".join(d["tool_calls"][0]["function"]["arguments"] for d in deltas) == '{"city": "Oslo", "unit": "celsius"}'
    assert all(d["tool_calls"][0]["id"] == "call__0_get_weather_cmpl-123" and d["tool_calls"][0]["index"] == 0
               for d in deltas)
    assert out[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == "chatcmpl-123" for c in out)


def test_chatml_function_calling_prompts() -> None:
    # no tools: plain ChatML
    llama = StubLlama(chat_format="chatml-function-calling")
    chat.create_chat_completion(llama, messages=CONVERSATION, stop="END")
    assert llama.prompt() == EXPECTED["chatml"][0]
    assert llama.calls[0]["stop"] == ["END", "<|im_end|>"]

    # forced: the functions are listed in the system turn and the prompt opens the call
    llama = StubLlama([completion('{"city": "Rome", "unit": "celsius"}')], chat_format="chatml-function-calling")
    out = chat.create_chat_completion(llama, messages=CONVERSATION, tools=[WEATHER_TOOL],
                                      tool_choice={"type": "function", "function": {"name": "get_weather"}})
    prompt = llama.prompt()
    assert prompt.startswith("<|im_start|>system\nBe brief.\n\nYou have access to the following functions:\n"
                             "\nfunctions.get_weather:\n" + json.dumps(WEATHER_TOOL["function"]["parameters"]) + "\n")
    assert prompt.endswith("<|im_start|>user\nHow are you?<|im_end|>\n<|im_start|>assistant\nfunctions.get_weather:\n")
    assert llama.calls[0]["grammar"] == json_schema_to_gbnf(WEATHER_TOOL["function"]["parameters"])
    assert out["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"


def test_chatml_function_calling_auto() -> None:
    clock: dict[str, Any] = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
    # the model chooses a function, calls it, then a second one, then stops
    llama = StubLlama([completion("functions.get_weather"), completion('{"city": "Oslo", "unit": "celsius"}'),
                       completion("functions.get_time:"), completion("{}"), completion("")],
                      chat_format="chatml-function-calling")
    out = chat.create_chat_completion(llama, messages=NO_SYSTEM, tools=[WEATHER_TOOL, clock], tool_choice="auto")
    choose = llama.calls[0]
    assert choose["stop"] == [":"] and choose["temperature"] == 0
    assert choose["grammar"] == 'root ::= functions | "message:"\nfunctions ::= "functions.get_weather:" | "functions.get_time:"\n'
    assert llama.prompt(1).endswith("<|im_start|>assistant\nfunctions.get_weather:\n")
    assert llama.prompt(3).endswith('functions.get_weather:\n{"city": "Oslo", "unit": "celsius"}\nfunctions.get_time:\n')
    assert llama.calls[3]["grammar"] == json_schema_to_gbnf(clock["function"]["parameters"])
    message = out["choices"][0]["message"]
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_weather", "get_time"]
    assert [c["id"] for c in message["tool_calls"]] == ["call__0_get_weather_cmpl-123", "call__1_get_time_cmpl-123"]
    assert "function_call" not in message and out["choices"][0]["finish_reason"] == "tool_calls"
    assert out["usage"] == {"completion_tokens": 4, "prompt_tokens": 10, "total_tokens": 14}

    # or writes a message
    llama = StubLlama([completion("message"), completion("Sunny.")], chat_format="chatml-function-calling")
    out = chat.create_chat_completion(llama, messages=NO_SYSTEM, tools=[WEATHER_TOOL], tool_choice="auto")
    assert out["choices"][0]["message"] == {"role": "assistant", "content": "Sunny."}
    assert llama.calls[1]["prompt"].endswith("<|im_start|>assistant\nmessage:\n")
    with pytest.raises(ValueError, match="streaming"):
        chat.create_chat_completion(StubLlama(chat_format="chatml-function-calling"), messages=NO_SYSTEM,
                                    tools=[WEATHER_TOOL], tool_choice="auto", stream=True)


def test_tool_grammars_are_valid_for_llama_cpp(vocab: Any) -> None:
    from pyllama_moe.chat.functions import chatml_function_calling  # noqa: F401  (registered)
    from pyllama_moe.chat.handler import grammar_for_tool

    g = Grammar(vocab, grammar_for_tool(WEATHER_TOOL))
    assert g.accepts('{"city": "Paris", "unit": "celsius"}')
    assert g.accepts('{"city": "Paris", "unit": "celsius", "days": 3}')
    assert not g.accepts('{"city": "Paris"}')
    assert not g.accepts('{"city": "A very long city name", "unit": "celsius"}')  # maxLength 12
    assert Grammar(vocab, grammar_for_tool({"function": {"name": "f"}})).accepts('{"anything": [1]}')
    choice = 'root ::= functions | "message:"\nfunctions ::= "functions.get_weather:"\n'
    c = Grammar(vocab, choice)
    assert c.accepts("message:") and c.accepts("functions.get_weather:") and not c.accepts("functions.other:")


# --------------------------------------------------------------------------------------------
# the real Llama


@pytest.fixture(scope="module")
def llm(tiny_model: Path) -> Iterator[Any]:
    llama_mod = pytest.importorskip("pyllama_moe.llama", reason="pyllama_moe.Llama is not there yet")
    llm = llama_mod.Llama(model_path=str(tiny_model), n_ctx=512, n_batch=512, verbose=False, seed=3)
    try:
        yield llm
    finally:
        llm.close()


def test_real_llama_chat_with_the_gguf_template(llm: Any) -> None:
    out = llm.create_chat_completion(messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0)
    assert out["object"] == "chat.completion" and out["id"].startswith("chatcmpl")
    assert out["choices"][0]["message"]["role"] == "assistant"
    assert out["usage"]["prompt_tokens"] == 19  # the qwen2 template's ChatML with its default system turn
    stream = list(llm.create_chat_completion(messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                             temperature=0, stream=True))
    assert stream[0]["choices"][0]["delta"] == {"role": "assistant"}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in stream)
    assert text == out["choices"][0]["message"]["content"]
    assert stream[-1]["choices"][0]["finish_reason"] == out["choices"][0]["finish_reason"] == "length"


def test_real_llama_json_schema_output_parses(llm: Any) -> None:
    schema = {"type": "object", "properties": {
        "ok": {"type": "boolean"}, "color": {"enum": ["red", "green", "blue"]}, "n": {"type": "integer"},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}, "note": {"type": "string", "maxLength": 4}},
        "required": ["ok", "color", "n"]}
    for seed, response_format in enumerate([
        {"type": "json_object", "schema": schema},
        {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}},
    ]):
        out = llm.create_chat_completion(messages=[{"role": "user", "content": "Answer in JSON"}],
                                         response_format=response_format, max_tokens=200, temperature=0.8, seed=seed)
        choice = out["choices"][0]
        assert choice["finish_reason"] == "stop", choice
        value = json.loads(choice["message"]["content"])
        assert {"ok", "color", "n"} <= set(value) and set(value) <= set(schema["properties"])
        assert isinstance(value["ok"], bool) and value["color"] in ("red", "green", "blue") and isinstance(value["n"], int)


def test_real_llama_json_object_output_is_json(llm: Any, vocab: Any) -> None:
    """Any JSON object: the output parses when complete, and is a prefix of JSON when cut by max_tokens."""
    g = Grammar(vocab, JSON_GBNF)
    for seed in (1, 2):
        out = llm.create_chat_completion(messages=[{"role": "user", "content": "JSON please"}],
                                         response_format={"type": "json_object"}, max_tokens=24, seed=seed)
        choice = out["choices"][0]
        text = choice["message"]["content"]
        assert text.startswith("{")
        if choice["finish_reason"] == "stop":
            assert isinstance(json.loads(text), dict)
        else:
            assert g.accepts(text, complete=False), text


def test_real_llama_forced_tool_call(llm: Any) -> None:
    for chat_format in ("chatml-function-calling", None):
        llm.chat_format, saved = chat_format or llm.chat_format, llm.chat_format
        try:
            out = llm.create_chat_completion(
                messages=[{"role": "user", "content": "Weather in Paris?"}], tools=[WEATHER_TOOL],
                tool_choice={"type": "function", "function": {"name": "get_weather"}}, max_tokens=160, seed=5)
        finally:
            llm.chat_format = saved
        choice = out["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        call = choice["message"]["tool_calls"][0]
        assert call["type"] == "function" and call["function"]["name"] == "get_weather"
        args = json.loads(call["function"]["arguments"])
        assert set(args) >= {"city", "unit"} and args["unit"] in ("celsius", "fahrenheit") and len(args["city"]) <= 12
