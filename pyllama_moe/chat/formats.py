"""The registry of chat handlers by name, and the built-in chat formats.

``register_chat_format(name)`` registers a formatter (``messages`` -> :class:`ChatFormatterResponse`)
as the handler ``name``; ``register_chat_completion_handler(name)`` registers a whole handler. Both
refuse to replace a name unless asked (``overwrite=True``), as llama-cpp-python's registry does.

The built-in formats render exactly what llama-cpp-python 0.3.36's formats of the same name render
(prompt and stop strings), so a model used with ``chat_format="chatml"`` there sees the same tokens
here (its "openbuddy", "intel", "open-orca", "saiga" and "functionary" formats are not
provided). ``"phi-3"`` (which llama-cpp-python lacks) follows the template that Phi-3 GGUFs carry, with
Phi-3.5's ``<|system|>`` turn. Message contents that are lists of parts contribute their text parts.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from pyllama_moe.chat.handler import (
    ChatFormatter,
    ChatFormatterResponse,
    LlamaChatCompletionHandler,
    chat_formatter_to_chat_completion_handler,
)
from pyllama_moe.errors import ChatFormatNotFoundError

__all__ = [
    "ChatFormatNotFoundError",
    "LlamaChatCompletionHandlerNotFoundException",
    "get_chat_completion_handler",
    "list_chat_formats",
    "register_chat_completion_handler",
    "register_chat_format",
    "unregister_chat_handler",
]


# llama-cpp-python's name for it
LlamaChatCompletionHandlerNotFoundException = ChatFormatNotFoundError

_lock = threading.Lock()
_handlers: dict[str, LlamaChatCompletionHandler] = {}


def _register(name: str, handler: LlamaChatCompletionHandler, overwrite: bool) -> None:
    with _lock:
        if not overwrite and name in _handlers:
            raise ValueError(f"Formatter with name '{name}' is already registered. "
                             "Use `overwrite=True` to overwrite it.")
        _handlers[name] = handler


def register_chat_completion_handler(name: str, *, overwrite: bool = False) -> Callable[[Any], Any]:
    """Decorator: register a handler (llama-cpp-python's ``LlamaChatCompletionHandler``) as ``name``."""

    def decorator(handler: LlamaChatCompletionHandler) -> LlamaChatCompletionHandler:
        _register(name, handler, overwrite)
        return handler

    return decorator


def register_chat_format(name: str, *, overwrite: bool = False) -> Callable[[Any], Any]:
    """Decorator: register a chat formatter as the chat format ``name``; returns the formatter."""

    def decorator(formatter: ChatFormatter) -> ChatFormatter:
        _register(name, chat_formatter_to_chat_completion_handler(formatter), overwrite)
        return formatter

    return decorator


def unregister_chat_handler(name: str) -> None:
    with _lock:
        if name not in _handlers:
            raise ValueError(f"No formatter registered under the name '{name}'.")
        del _handlers[name]


def get_chat_completion_handler(name: str) -> LlamaChatCompletionHandler:
    """The handler registered as ``name``; :class:`ChatFormatNotFoundError` names the valid ones."""
    try:
        return _handlers[name]
    except KeyError:
        raise ChatFormatNotFoundError(f"Invalid chat handler: {name} (valid formats: {list(_handlers)})") from None


def list_chat_formats() -> list[str]:
    """The registered names, in registration order."""
    return list(_handlers)


# -- helpers shared by the formats


def _text(content: Any) -> str | None:
    """A message's content as text: a string, the text parts of a list, or None."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        return "".join(parts) if parts else None
    return None


def _system_message(messages: list[dict[str, Any]]) -> str:
    """The first system message's text, or ""."""
    for m in messages:
        if m["role"] == "system":
            return _text(m.get("content")) or ""
    return ""


def _turns(messages: list[dict[str, Any]], prefixes: dict[str, str]) -> list[tuple[str, str | None]]:
    """``(prefix, text)`` for each message whose role is in ``prefixes`` (others are left out)."""
    return [(prefixes[m["role"]], _text(m.get("content"))) for m in messages if m["role"] in prefixes]


def _join_plain(turns: list[tuple[str, str | None]], sep: str, start: str = "") -> str:
    """prefix + text + sep per turn; a turn without text contributes its prefix only."""
    out = start
    for prefix, text in turns:
        out += prefix + text + sep if text else prefix
    return out


def _join_chatml(system: str, turns: list[tuple[str, str | None]], sep: str) -> str:
    """ChatML-style: the system block and each turn as prefix \\n text sep \\n."""
    out = "" if system == "" else system + sep + "\n"
    for prefix, text in turns:
        out += prefix + "\n" + text + sep + "\n" if text else prefix + "\n"
    return out


def _join_colon(system: str, turns: list[tuple[str, str | None]], seps: tuple[str, str]) -> str:
    """"Role: text" turns after the system text, separators alternating between ``seps``."""
    out = system + seps[0]
    for i, (prefix, text) in enumerate(turns):
        out += f"{prefix}: {text}{seps[i % 2]}" if text else prefix + ":"
    return out


# -- formats


@register_chat_format("llama-2")
def format_llama2(messages: list[dict[str, Any]], **kwargs: Any) -> ChatFormatterResponse:
    """Llama 2 chat: ``<s>[INST] ... [/INST] answer </s>``; the system prompt opens the first turn."""
    system = _system_message(messages)
    if system:
        system = f"[INST] <<SYS>>\n{system}\n<</SYS>>"
    turns = _turns(messages, {"user": "<s>[INST]", "assistant": "[/INST]"})
    seps = (" ", "</s>")
    out = system + seps[0]
    for i, (prefix, text) in enumerate(turns):
        if system and i == 0:
            out += (text or "") + seps[i % 2]
        elif text:
            out += prefix + text + " " + seps[i % 2]
        else:
            out += prefix + " "
    return ChatFormatterResponse(prompt=out + "[/INST]")


@register_chat_format("llama-3")
def format_llama3(messages: list[dict[str, Any]], **kwargs: Any) -> ChatFormatterResponse:
    """Llama 3 instruct: header-delimited turns ending in ``<|eot_id|>``."""
    prefixes = {role: f"<|start_header_id|>{role}<|end_header_id|>\n\n" for role in ("system", "user", "assistant")}
    turns = _turns(messages, prefixes) + [(prefixes["assistant"], None)]
    return ChatFormatterResponse(prompt=_join_plain(turns, "<|eot_id|>"), stop="<|eot_id|>")


@register_chat_format("alpaca")
def format_alpaca(messages: list[dict[str, Any]], **kwargs: Any) -> ChatFormatterResponse:
    turns = _turns(messages, {"user": "### Instruction", "assistant": "### Response"})
    return ChatFormatterResponse(prompt=_join_colon(_system_message(messages), turns, ("\n\n", "</s>")))


@register_chat_format("qwen")
def format_qwen(messages: list[dict[str, Any]], **kwargs: Any) -> ChatFormatterResponse:
    """Qwen (ChatML with a default system prompt); stops at ``<|endoftext|>``."""
    system = "<|im_start|>system\n" + (_system_message(messages) or "You are a helpful assistant.")
    turns = _turns(messages, {"user": "<|im_start|>user", "assistant": "<|im_start|>assistant"})
    turns.append(("<|im_start|>assistant", None))
    return ChatFormatterResponse(prompt=_join_chatml(system, turns, "<|im_end|>"), stop="<|endoftext|>")


@register_chat_format("vicuna")
def format_vicuna(messages: list[dict[str, Any]], **kwargs: Any) -> ChatFormatterResponse:
    system = ("A chat between a curious user and an artificial intelligence assistant. The assistant gives "
              "helpful, detailed, and polite answers to the user's questions.")
    turns = _turns(messages, {"user": "USER", "assistant": "ASSISTANT"}) + [("ASSISTANT", None)]
    return ChatFormatterResponse(prompt=_join_colon(system, turns, (" ", "</s>")))


@register_chat_format("zephyr")
def format_zephyr(messages: list[dict[str, Any]], **kwargs: Any) -> ChatFormatterResponse:
    system = "<|system|>\n" + _system_message(messages)
    turns = _turns(messages, {"user": "<|user|>\n", "assistant": "<|assistant|>\n"}) + [("<|assistant|>\n", None)]
    return ChatFormatterResponse(prompt=_join_chatml(system, turns, "</s>"), stop="</s>")


@register_chat_format("chatml")
def format_chatml(messages: list[dict[str, Any]], **kwargs: Any) -> ChatFormatterResponse:
    """ChatML: ``<|im_start|>role\\ntext<|im_end|>`` turns (the system turn is always there)."""
    system = "<|im_start|>system\n" + _system_message(messages)
    turns = _turns(messages, {"user": "<|im_start|>user", "assistant": "<|im_start|>assistant"})
    turns.append(("<|im_start|>assistant", None))
    return ChatFormatterResponse(prompt=_join_chatml(system, turns, "<|im_end|>"), stop="<|im_end|>")


@register_chat_format("mistral-instruct")
def format_mistral_instruct(messages: list[dict[str, Any]], **kwargs: Any) -> ChatFormatterResponse:
    """Mistral instruct: ``[INST] question [/INST]answer</s>``; system messages are left out."""
    prompt = ""
    for m in messages:
        content = m.get("content")
        if m["role"] == "user" and isinstance(content, str):
            prompt += "[INST] " + content
        elif m["role"] == "assistant" and content is not None:
            prompt += " [/INST]" + (_text(content) or "") + "</s>"
    return ChatFormatterResponse(prompt=prompt + " [/INST]", stop="</s>")


@register_chat_format("openchat")
def format_openchat(messages: list[dict[str, Any]], **kwargs: Any) -> ChatFormatterResponse:
    system = _system_message(messages) + "<|end_of_turn|>"
    assistant = "<|end_of_turn|>GPT4 Correct Assistant: "
    turns = _turns(messages, {"user": "GPT4 Correct User: ", "assistant": assistant}) + [(assistant, None)]
    return ChatFormatterResponse(prompt=_join_chatml(system, turns, "<|end_of_turn|>"), stop="<|end_of_turn|>")


@register_chat_format("gemma")
def format_gemma(messages: list[dict[str, Any]], **kwargs: Any) -> ChatFormatterResponse:
    """Gemma: ``<start_of_turn>user|model`` turns; Gemma has no system role (system messages are left out)."""
    turns = _turns(messages, {"user": "<start_of_turn>user\n", "assistant": "<start_of_turn>model\n"})
    turns.append(("<start_of_turn>model\n", None))
    return ChatFormatterResponse(prompt=_join_plain(turns, "<end_of_turn>\n"), stop="<end_of_turn>\n")


@register_chat_format("phi-3")
def format_phi3(messages: list[dict[str, Any]], **kwargs: Any) -> ChatFormatterResponse:
    """Phi-3 / Phi-3.5 instruct: ``<|role|>\\ntext<|end|>\\n`` turns, then ``<|assistant|>\\n``."""
    prefixes = {"system": "<|system|>\n", "user": "<|user|>\n", "assistant": "<|assistant|>\n"}
    prompt = "".join(prefix + (text or "") + "<|end|>\n" for prefix, text in _turns(messages, prefixes))
    return ChatFormatterResponse(prompt=prompt + "<|assistant|>\n", stop=["<|end|>", "<|endoftext|>"])


# -- older formats of llama-cpp-python, kept so that scripts naming them run unchanged


def _join_colon_single(system: str, turns: list[tuple[str, str | None]], sep: str) -> str:
    """"Role: text" turns after the system text, one separator."""
    out = system + sep
    for prefix, text in turns:
        out += f"{prefix}: {text}{sep}" if text else prefix + ":"
    return out


@register_chat_format("oasst_llama")
def format_oasst_llama(messages: list[dict[str, Any]], **kwargs: Any) -> ChatFormatterResponse:
    system = f"[INST] <<SYS>>\n{_system_message(messages)}\n<</SYS>>\n\n"
    turns = _turns(messages, {"user": "<|prompter|>", "assistant": "<|assistant|>"}) + [("<|assistant|>", None)]
    return ChatFormatterResponse(prompt=_join_plain(turns, "</s>", start=system))


@register_chat_format("baichuan-2")
def format_baichuan2(messages: list[dict[str, Any]], **kwargs: Any) -> ChatFormatterResponse:
    turns = _turns(messages, {"user": "<reserved_106>", "assistant": "<reserved_107>"}) + [("<reserved_107>", None)]
    return ChatFormatterResponse(prompt=_join_plain(turns, "", start=_system_message(messages)))


@register_chat_format("baichuan")
def format_baichuan(messages: list[dict[str, Any]], **kwargs: Any) -> ChatFormatterResponse:
    turns = _turns(messages, {"user": "<reserved_102>", "assistant": "<reserved_103>"}) + [("<reserved_103>", None)]
    return ChatFormatterResponse(prompt=_join_plain(turns, "", start=_system_message(messages)))


@register_chat_format("redpajama-incite")
def format_redpajama_incite(messages: list[dict[str, Any]], **kwargs: Any) -> ChatFormatterResponse:
    turns = _turns(messages, {"user": "<human>", "assistant": "<bot>"}) + [("<bot>", None)]
    return ChatFormatterResponse(prompt=_join_colon_single(_system_message(messages), turns, "\n"), stop="<human>")


@register_chat_format("snoozy")
def format_snoozy(messages: list[dict[str, Any]], **kwargs: Any) -> ChatFormatterResponse:
    system = _system_message(messages) or (
        "The prompt below is a question to answer, a task to complete, or a conversation to respond to; "
        "decide which and write an appropriate response.")
    turns = _turns(messages, {"user": "### Prompt", "assistant": "### Response"}) + [("### Response", None)]
    return ChatFormatterResponse(prompt=_join_colon_single(system, turns, "\n"), stop="###")


@register_chat_format("phind")
def format_phind(messages: list[dict[str, Any]], **kwargs: Any) -> ChatFormatterResponse:
    system = "### System Prompt\nYou are an intelligent programming assistant."
    turns = _turns(messages, {"user": "### User Message", "assistant": "### Assistant"}) + [("### Assistant", None)]
    return ChatFormatterResponse(prompt=_join_colon_single(system, turns, "\n\n"))


@register_chat_format("mistrallite")
def format_mistrallite(messages: list[dict[str, Any]], **kwargs: Any) -> ChatFormatterResponse:
    system = f"<|system|>{_system_message(messages)}</s>"
    assistant = "</s>\n<|assistant|>"
    turns = _turns(messages, {"user": "<|prompter|>", "assistant": assistant}) + [(assistant, None)]
    return ChatFormatterResponse(prompt=_join_plain(turns, " ", start=system))


@register_chat_format("pygmalion")
def format_pygmalion(messages: list[dict[str, Any]], **kwargs: Any) -> ChatFormatterResponse:
    system = "<|system|>" + _system_message(messages)
    turns = _turns(messages, {"user": "<|user|>", "assistant": "<|model|>"}) + [("<|model|>", None)]
    return ChatFormatterResponse(prompt=_join_chatml(system, turns, "\n"), stop="\n")


@register_chat_format("chatglm3")
def format_chatglm3(messages: list[dict[str, Any]], **kwargs: Any) -> ChatFormatterResponse:
    out = "<|system|>\n" + _system_message(messages)
    turns = _turns(messages, {"user": "<|user|>", "assistant": "<|assistant|>"}) + [("<|assistant|>", None)]
    for prefix, text in turns:
        out += f"{prefix}\n {text}" if text else prefix
    return ChatFormatterResponse(prompt=out, stop="</s>")
