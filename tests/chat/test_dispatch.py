"""pyllama_moe.chat.dispatch: which handler serves a request (a chat handler, a format, a template guessed
from the GGUF metadata, llama-2 by default) and the keywords it gets."""

from __future__ import annotations

from typing import Any

from pyllama_moe import chat

from fixtures.chat import CONVERSATION, EXPECTED, NO_SYSTEM, StubLlama


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
    assert chat.guess_chat_format_from_gguf_metadata(
        {"tokenizer.chat_template": dispatch.CHATML_CHAT_TEMPLATE}) == "chatml"
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
