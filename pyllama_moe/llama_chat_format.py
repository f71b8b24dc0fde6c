"""llama-cpp-python's ``llama_cpp.llama_chat_format`` names, over :mod:`pyllama_moe.chat` (no vision handlers)."""

from __future__ import annotations

from pyllama_moe.chat.dispatch import guess_chat_format_from_gguf_metadata
from pyllama_moe.chat.formats import (
    ChatFormatNotFoundError,
    LlamaChatCompletionHandlerNotFoundException,
    format_alpaca,
    format_baichuan,
    format_baichuan2,
    format_chatglm3,
    format_chatml,
    format_gemma,
    format_llama2,
    format_llama3,
    format_mistral_instruct,
    format_mistrallite,
    format_oasst_llama,
    format_openchat,
    format_phi3,
    format_phind,
    format_pygmalion,
    format_qwen,
    format_redpajama_incite,
    format_snoozy,
    format_vicuna,
    format_zephyr,
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
from pyllama_moe.chat.template import (
    Jinja2ChatFormatter,
    hf_tokenizer_config_to_chat_completion_handler,
    hf_tokenizer_config_to_chat_formatter,
)

__all__ = [
    "ChatFormatNotFoundError", "ChatFormatter", "ChatFormatterResponse", "Jinja2ChatFormatter",
    "LlamaChatCompletionHandler", "LlamaChatCompletionHandlerNotFoundException",
    "chat_formatter_to_chat_completion_handler", "format_alpaca", "format_baichuan", "format_baichuan2",
    "format_chatglm3", "format_chatml", "format_gemma", "format_llama2", "format_llama3", "format_mistral_instruct",
    "format_mistrallite", "format_oasst_llama", "format_openchat", "format_phi3", "format_phind", "format_pygmalion",
    "format_qwen", "format_redpajama_incite", "format_snoozy", "format_vicuna", "format_zephyr",
    "get_chat_completion_handler", "guess_chat_format_from_gguf_metadata",
    "hf_tokenizer_config_to_chat_completion_handler", "hf_tokenizer_config_to_chat_formatter", "list_chat_formats",
    "register_chat_completion_handler", "register_chat_format", "unregister_chat_handler",
]
