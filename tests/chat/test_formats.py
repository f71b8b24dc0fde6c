"""pyllama_moe.chat.formats: the built-in chat formats and their registry.

The oracles are exact strings: what llama-cpp-python 0.3.36's formats render, and llama.cpp's own C++
renderer (``llama_chat_apply_template``) for the formats both know.
"""

from __future__ import annotations

from typing import Any

import pytest

from pyllama_moe import chat
from pyllama_moe.chat import formats

from fixtures.chat import CONVERSATION, EXPECTED, NO_SYSTEM, StubLlama, builtin_template


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
    "oasst_llama": ("[INST] <<SYS>>\nS\n<</SYS>>\n\n<|prompter|>U1</s><|assistant|>A1</s><|prompter|>U2</s>"
                    "<|assistant|>", None),
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
               "detailed, and polite answers to the user's questions. USER: U1 ASSISTANT: A1</s>USER: U2 "
               "ASSISTANT:"), None),
    "zephyr": ("<|system|>\nS</s>\n<|user|>\n\nU1</s>\n<|assistant|>\n\nA1</s>\n<|user|>\n\nU2</s>\n"
               "<|assistant|>\n\n", "</s>"),
    "openchat": (("S<|end_of_turn|><|end_of_turn|>\nGPT4 Correct User: \nU1<|end_of_turn|>\n<|end_of_turn|>"
                 "GPT4 Correct Assistant: \nA1<|end_of_turn|>\nGPT4 Correct User: \nU2<|end_of_turn|>\n"
                 "<|end_of_turn|>GPT4 Correct Assistant: \n"), "<|end_of_turn|>"),
}


@pytest.mark.parametrize("name", sorted(MORE_FORMATS))
def test_more_llama_cpp_python_formats(name: str) -> None:
    llama = StubLlama(chat_format=name)
    chat.create_chat_completion(llama, messages=[{"role": "system", "content": "S"}, {"role": "user", "content": "U1"},
                                                 {"role": "assistant", "content": "A1"},
                                                 {"role": "user", "content": "U2"}])
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
    assert formats.format_chatml(messages=parts).prompt.endswith(
        "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n")
    # the caller's stop strings come first
    llama = StubLlama(chat_format="chatml")
    chat.create_chat_completion(llama, messages=NO_SYSTEM, stop="END")
    assert llama.calls[0]["stop"] == ["END", "<|im_end|>"]


def test_registry() -> None:
    names = chat.list_chat_formats()
    for name in ("chatml", "llama-2", "llama-3", "mistral-instruct", "gemma", "qwen", "phi-3",
                 "chatml-function-calling"):
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
