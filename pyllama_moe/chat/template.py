"""Chat templates (Jinja2, as in a GGUF's ``tokenizer.chat_template``) rendered as Hugging Face renders them.

The environment is sandboxed and immutable (a template cannot reach Python internals or change the
messages), with ``trim_blocks`` / ``lstrip_blocks`` and the loop controls (``{% break %}``) that
transformers enables. Templates see ``messages``, ``bos_token``, ``eos_token``,
``add_generation_prompt``, ``tools``, ``tool_choice``, ``functions``, ``function_call``, and the
functions ``raise_exception(message)`` (raises ValueError) and ``strftime_now(format)``. The
``tojson`` filter is transformers' (no key sorting, no HTML escaping, ``indent`` allowed), not
Jinja's HTML-safe one, so that tool schemas appear in the prompt as the model was trained on them.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from pyllama_moe.chat.handler import (
    ChatFormatter,
    ChatFormatterResponse,
    LlamaChatCompletionHandler,
    chat_formatter_to_chat_completion_handler,
)

__all__ = ["Jinja2ChatFormatter", "compile_template", "hf_tokenizer_config_to_chat_completion_handler",
           "hf_tokenizer_config_to_chat_formatter", "raise_exception", "strftime_now", "tojson"]


def raise_exception(message: str) -> None:
    """What a template calls to reject a conversation (e.g. roles that do not alternate)."""
    raise ValueError(message)


def strftime_now(fmt: str) -> str:
    """The current local time formatted with ``fmt`` (templates put the date in system prompts)."""
    return datetime.now().strftime(fmt)


def tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
           separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """transformers' ``tojson`` filter."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _environment(trim: bool) -> jinja2.Environment:
    env = ImmutableSandboxedEnvironment(
        loader=jinja2.BaseLoader(),
        trim_blocks=trim,
        lstrip_blocks=trim,
        extensions=["jinja2.ext.loopcontrols"],
        undefined=jinja2.Undefined if trim else jinja2.StrictUndefined,
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


@functools.lru_cache(maxsize=32)
def compile_template(source: str, trim: bool = True) -> jinja2.Template:
    """``source`` compiled in the sandbox (cached: a GGUF's template is compiled once per process).

    ``trim=False`` keeps the newlines after block tags and makes undefined names errors: the
    environment of templates written for it (``chatml-function-calling``'s).
    """
    return _environment(trim).from_string(source)


class Jinja2ChatFormatter:
    """A chat formatter that renders a Jinja2 chat template (llama-cpp-python's class of that name).

    The prompt it returns holds the template's own special tokens (``added_special=True``: no BOS is
    added when tokenizing) and stops at ``eos_token``. ``stop_token_ids`` is kept for
    compatibility; generation already ends at the vocabulary's end-of-generation tokens.
    """

    def __init__(self, template: str, eos_token: str, bos_token: str, add_generation_prompt: bool = True,
                 stop_token_ids: list[int] | None = None) -> None:
        self.template = template
        self.eos_token = eos_token
        self.bos_token = bos_token
        self.add_generation_prompt = add_generation_prompt
        self.stop_token_ids = set(stop_token_ids) if stop_token_ids is not None else None
        self._template = compile_template(template)

    def render(self, messages: list[dict[str, Any]], **variables: Any) -> str:
        """The template's text for ``messages`` (``variables`` override the defaults). A ``null`` content (an
        assistant's message of tool calls, which OpenAI allows) is rendered as empty text: templates concatenate it."""
        messages = [{**m, "content": ""} if isinstance(m, dict) and m.get("content", "") is None else m
                    for m in messages]
        context: dict[str, Any] = {
            "messages": messages,
            "eos_token": self.eos_token,
            "bos_token": self.bos_token,
            "add_generation_prompt": self.add_generation_prompt,
            "raise_exception": raise_exception,
            "strftime_now": strftime_now,
            "functions": None,
            "function_call": None,
            "tools": None,
            "tool_choice": None,
        }
        context.update(variables)
        try:
            return self._template.render(**context)
        except jinja2.exceptions.SecurityError:
            raise  # the template tried what the sandbox forbids: its own fault, kept as it is
        except (jinja2.TemplateError, TypeError) as e:
            # the messages do not fit the template (a missing field, a role it refuses, a value of the wrong type it
            # adds to a string): the request's fault
            raise ValueError(f"the chat template cannot render these messages: {e}") from e

    def __call__(self, *, messages: list[dict[str, Any]], functions: Any = None, function_call: Any = None,
                 tools: Any = None, tool_choice: Any = None, **kwargs: Any) -> ChatFormatterResponse:
        prompt = self.render(messages, functions=functions, function_call=function_call, tools=tools,
                             tool_choice=tool_choice)
        stop = [self.eos_token] if self.eos_token else None
        return ChatFormatterResponse(prompt=prompt, stop=stop, added_special=True)

    def to_chat_handler(self) -> LlamaChatCompletionHandler:
        return chat_formatter_to_chat_completion_handler(self)


def _token_text(token: Any) -> str:
    """A special token of a Hugging Face ``tokenizer_config.json``: a string or ``{"content": ...}``."""
    if isinstance(token, dict):
        token = token.get("content")
    return token if isinstance(token, str) else ""


class _HFConfigFormatter:
    """The chat formatter of a Hugging Face tokenizer config (:func:`hf_tokenizer_config_to_chat_formatter`)."""

    def __init__(self, formatter: Jinja2ChatFormatter) -> None:
        self.formatter = formatter

    def __call__(self, *, messages: list[dict[str, Any]], **kwargs: Any) -> ChatFormatterResponse:
        # as llama-cpp-python 0.3.36 renders it (its tests pin it): the messages and an empty assistant turn, so
        # that a template without a generation prompt still ends where the answer starts
        prompt = self.formatter.render([*messages, {"role": "assistant", "content": ""}], add_generation_prompt=False)
        eos = self.formatter.eos_token
        return ChatFormatterResponse(prompt=prompt, stop=[eos] if eos else None, added_special=True)


def hf_tokenizer_config_to_chat_formatter(tokenizer_config: dict[str, Any],
                                          add_generation_prompt: bool = True) -> ChatFormatter:
    """A chat formatter from a Hugging Face ``tokenizer_config.json`` (as a dict): its ``chat_template``,
    ``bos_token`` and ``eos_token``."""
    if not isinstance(tokenizer_config, dict) or not isinstance(tokenizer_config.get("chat_template"), str):
        raise ValueError("the tokenizer config has no chat_template string")
    return _HFConfigFormatter(Jinja2ChatFormatter(
        tokenizer_config["chat_template"], eos_token=_token_text(tokenizer_config.get("eos_token")),
        bos_token=_token_text(tokenizer_config.get("bos_token")), add_generation_prompt=add_generation_prompt))


def hf_tokenizer_config_to_chat_completion_handler(tokenizer_config: dict[str, Any],
                                                   add_generation_prompt: bool = True) -> LlamaChatCompletionHandler:
    """:func:`hf_tokenizer_config_to_chat_formatter` as a chat completion handler."""
    return chat_formatter_to_chat_completion_handler(
        hf_tokenizer_config_to_chat_formatter(tokenizer_config, add_generation_prompt))
