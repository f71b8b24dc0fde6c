"""llama-cpp-python's ``llama_cpp.llama_chat_format`` names, over :mod:`pyllama_moe.chat` (the vision handlers:
:mod:`pyllama_moe.chat.vision`)."""

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
from pyllama_moe.chat.vision import (
    Gemma4ChatHandler,
    Llama3VisionAlpha,
    Llama3VisionAlphaChatHandler,
    Llava15ChatHandler,
    Llava16ChatHandler,
    MiniCPMv26ChatHandler,
    MoondreamChatHandler,
    MTMDChatHandler,
    NanoLlavaChatHandler,
    ObsidianChatHandler,
    Qwen25VLChatHandler,
)

__all__ = [
    "ChatFormatNotFoundError", "ChatFormatter", "ChatFormatterResponse", "Gemma4ChatHandler", "Jinja2ChatFormatter",
    "Llama3VisionAlpha", "Llama3VisionAlphaChatHandler", "LlamaChatCompletionHandler",
    "LlamaChatCompletionHandlerNotFoundException", "Llava15ChatHandler", "Llava16ChatHandler", "MTMDChatHandler",
    "MiniCPMv26ChatHandler", "MoondreamChatHandler", "NanoLlavaChatHandler", "ObsidianChatHandler",
    "Qwen25VLChatHandler",
    "chat_formatter_to_chat_completion_handler", "format_alpaca", "format_baichuan", "format_baichuan2",
    "format_chatglm3", "format_chatml", "format_gemma", "format_llama2", "format_llama3", "format_mistral_instruct",
    "format_mistrallite", "format_oasst_llama", "format_openchat", "format_phi3", "format_phind", "format_pygmalion",
    "format_qwen", "format_redpajama_incite", "format_snoozy", "format_vicuna", "format_zephyr",
    "get_chat_completion_handler", "guess_chat_format_from_gguf_metadata",
    "hf_tokenizer_config_to_chat_completion_handler", "hf_tokenizer_config_to_chat_formatter", "list_chat_formats",
    "register_chat_completion_handler", "register_chat_format", "unregister_chat_handler",
]
