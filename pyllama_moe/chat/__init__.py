"""Chat completion for ``Llama.create_chat_completion``: chat formats, GGUF chat templates, JSON grammars, tools.

``Llama.create_chat_completion(messages=..., **kw)`` calls :func:`create_chat_completion` with the
``Llama``, which picks the handler as llama-cpp-python 0.3.36 does (``chat_handler``, then
``chat_format``, then the GGUF's ``tokenizer.chat_template``, then ``"llama-2"``; see
:mod:`pyllama_moe.chat.dispatch`) and returns the same ``chat.completion`` /
``chat.completion.chunk`` dicts.

- :mod:`~pyllama_moe.chat.formats`: the registry (:func:`register_chat_format`,
  :func:`register_chat_completion_handler`) and the built-in formats ("chatml", "llama-2",
  "llama-3", "mistral-instruct", "gemma", "qwen", "phi-3", and llama-cpp-python's older ones:
  :func:`list_chat_formats`);
- :mod:`~pyllama_moe.chat.template`: :class:`Jinja2ChatFormatter`, sandboxed Jinja2 rendering of
  chat templates;
- :mod:`~pyllama_moe.chat.handler`: formatter -> handler, completion -> chat results,
  ``response_format`` and ``tool_choice`` grammars;
- JSON grammars and :func:`json_schema_to_gbnf` come from :mod:`pyllama_moe.json_schema`;
- :mod:`~pyllama_moe.chat.functions`: the "chatml-function-calling" handler;
- :mod:`~pyllama_moe.chat.vision`: the vision handlers (``Llava15ChatHandler``, ``MTMDChatHandler``, ...): images
  through a projector, passed as ``Llama(chat_handler=...)``.
"""

from __future__ import annotations

from pyllama_moe.chat import functions as _functions  # noqa: F401  (registers chatml-function-calling)
from pyllama_moe.chat.dispatch import (
    create_chat_completion,
    guess_chat_format_from_gguf_metadata,
    resolve_chat_handler,
    template_formatter,
)
from pyllama_moe.chat.formats import (
    ChatFormatNotFoundError,
    LlamaChatCompletionHandlerNotFoundException,
    get_chat_completion_handler,
    list_chat_formats,
    register_chat_completion_handler,
    register_chat_format,
    unregister_chat_handler,
)
from pyllama_moe.chat.handler import (
    ChatFormatter,
    ChatFormatterResponse,
    LlamaChatCompletionHandler,
    chat_formatter_to_chat_completion_handler,
)
from pyllama_moe.chat.template import Jinja2ChatFormatter
from pyllama_moe.json_schema import (
    JSON_GBNF,
    JSON_VALUE_GBNF,
    SchemaError,
    json_schema_to_gbnf,
)

__all__ = [
    "JSON_GBNF",
    "JSON_VALUE_GBNF",
    "ChatFormatNotFoundError",
    "ChatFormatter",
    "ChatFormatterResponse",
    "Jinja2ChatFormatter",
    "LlamaChatCompletionHandler",
    "LlamaChatCompletionHandlerNotFoundException",
    "SchemaError",
    "chat_formatter_to_chat_completion_handler",
    "create_chat_completion",
    "get_chat_completion_handler",
    "guess_chat_format_from_gguf_metadata",
    "json_schema_to_gbnf",
    "list_chat_formats",
    "register_chat_completion_handler",
    "register_chat_format",
    "resolve_chat_handler",
    "template_formatter",
    "unregister_chat_handler",
]
