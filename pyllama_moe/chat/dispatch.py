"""Which handler serves ``Llama.create_chat_completion``, chosen as llama-cpp-python chooses it.

1. ``llama.chat_handler`` when set;
2. ``llama.chat_format`` when set: a handler in ``llama._chat_handlers`` (llama-cpp-python's
   per-model handlers), a registered name, or ``"chat_template.default"`` /
   ``"chat_template.<name>"`` for the GGUF's ``tokenizer.chat_template`` / ``tokenizer.chat_template.<name>``;
3. otherwise, when the GGUF has ``tokenizer.chat_template``: the built-in format that template is
   known to be (chatml, mistral-instruct, llama-3), else the template itself, rendered with the
   vocabulary's BOS and EOS texts (and stopping at the EOS text);
4. otherwise ``"llama-2"``.
"""

from __future__ import annotations

from typing import Any

from pyllama_moe.chat.formats import (
    ChatFormatNotFoundError,
    get_chat_completion_handler,
)
from pyllama_moe.chat.handler import LlamaChatCompletionHandler, check_tools
from pyllama_moe.chat.template import Jinja2ChatFormatter

__all__ = [
    "chat_completion_defaults",
    "create_chat_completion",
    "guess_chat_format_from_gguf_metadata",
    "resolve_chat_handler",
    "template_formatter",
]

TEMPLATE_KEY = "tokenizer.chat_template"

# Hugging Face chat templates that are a built-in format (tokenizer_config.json of the models named)
# teknium/OpenHermes-2.5-Mistral-7B
CHATML_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# mistralai/Mistral-7B-Instruct-v0.1
MISTRAL_INSTRUCT_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token + ' ' }}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"
)
# mistralai/Mixtral-8x7B-Instruct-v0.1
MIXTRAL_INSTRUCT_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"
)
# meta-llama/Meta-Llama-3-8B-Instruct
LLAMA3_INSTRUCT_CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim"
    " + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)


def guess_chat_format_from_gguf_metadata(metadata: dict[str, str]) -> str | None:
    """The built-in format whose template the GGUF carries verbatim, or None."""
    template = metadata.get(TEMPLATE_KEY)
    if template is None:
        return None
    if template == CHATML_CHAT_TEMPLATE:
        return "chatml"
    if template in (MISTRAL_INSTRUCT_CHAT_TEMPLATE, MIXTRAL_INSTRUCT_CHAT_TEMPLATE):
        return "mistral-instruct"
    if template == LLAMA3_INSTRUCT_CHAT_TEMPLATE:
        return "llama-3"
    return None


def _token_text(llama: Any, token: int) -> str:
    """The text of a special token (BOS/EOS) as the template should see it; "" for none."""
    if token is None or token < 0:
        return ""
    try:
        raw = llama.detokenize([token], special=True)
    except TypeError:  # a detokenize without the special keyword
        raw = llama.detokenize([token])
    return raw.decode("utf-8", errors="ignore") if isinstance(raw, bytes) else str(raw)


def template_formatter(llama: Any, key: str = TEMPLATE_KEY) -> Jinja2ChatFormatter:
    """A formatter for the chat template stored under ``key`` in ``llama.metadata``."""
    metadata = getattr(llama, "metadata", None) or {}
    if key not in metadata:
        raise ChatFormatNotFoundError(f"the model has no {key} in its metadata")
    eos_id = llama.token_eos()
    return Jinja2ChatFormatter(
        template=metadata[key],
        eos_token=_token_text(llama, eos_id),
        bos_token=_token_text(llama, llama.token_bos()),
        stop_token_ids=[eos_id] if eos_id is not None and eos_id >= 0 else None,
    )


def resolve_chat_handler(llama: Any) -> LlamaChatCompletionHandler:
    """The handler for ``llama`` (see the module docstring)."""
    handler = getattr(llama, "chat_handler", None)
    if handler is not None:
        return handler
    name = getattr(llama, "chat_format", None)
    registered = getattr(llama, "_chat_handlers", None) or {}  # llama-cpp-python's per-model handlers
    if name in registered:
        return registered[name]
    metadata = getattr(llama, "metadata", None) or {}
    if name is None:
        if TEMPLATE_KEY in metadata:
            name = guess_chat_format_from_gguf_metadata(metadata) or "chat_template.default"
        else:
            name = "llama-2"
    if name == "chat_template.default":
        return template_formatter(llama).to_chat_handler()
    if name.startswith("chat_template.") and TEMPLATE_KEY + "." + name[len("chat_template."):] in metadata:
        return template_formatter(llama, TEMPLATE_KEY + "." + name[len("chat_template."):]).to_chat_handler()
    return get_chat_completion_handler(name)


def chat_completion_defaults() -> dict[str, Any]:
    """The defaults of llama-cpp-python's ``Llama.create_chat_completion``, which hands every keyword
    to the handler (so a handler's own defaults apply only when it is called directly)."""
    return {
        "functions": None, "function_call": None, "tools": None, "tool_choice": None,
        "temperature": 0.2, "top_p": 0.95, "top_k": 40, "min_p": 0.05, "typical_p": 1.0,
        "logprobs": None, "top_logprobs": None, "stream": False, "stop": [], "seed": None,
        "response_format": None, "max_tokens": None, "presence_penalty": 0.0, "frequency_penalty": 0.0,
        "repeat_penalty": 1.0, "tfs_z": 1.0, "mirostat_mode": 0, "mirostat_tau": 5.0, "mirostat_eta": 0.1,
        "model": None, "logits_processor": None, "grammar": None, "logit_bias": None,
    }


def create_chat_completion(llama: Any, messages: list[dict[str, Any]], **kwargs: Any) -> Any:
    """``Llama.create_chat_completion``: the chosen handler's ``chat.completion`` or chunk iterator.

    ``kwargs`` are llama-cpp-python's ``create_chat_completion`` keywords; the handler receives all
    of them, those left out with :func:`chat_completion_defaults`.
    """
    check_messages(messages)
    check_tools(kwargs)
    return resolve_chat_handler(llama)(llama=llama, messages=messages, **{**chat_completion_defaults(), **kwargs})


def check_messages(messages: Any) -> None:
    """ValueError for messages no chat format can render: not a list of dicts with a string ``role`` and a
    ``content`` that is a string, a list of parts or None (an assistant's tool calls)."""
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"messages must be a non-empty list of messages, got {type(messages).__name__}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ValueError(f"messages[{i}] must be a dict with 'role' and 'content', got {type(m).__name__}")
        if not isinstance(m.get("role"), str):
            raise ValueError(f"messages[{i}].role must be a string, got {m.get('role')!r}")
        if "content" not in m and not (m["role"] == "assistant" and ("tool_calls" in m or "function_call" in m)):
            raise ValueError(f"messages[{i}] has no content")
        content = m.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise ValueError(f"messages[{i}].content must be a string, a list of parts or null, "
                             f"got {type(content).__name__}")
        if isinstance(content, list) and not all(isinstance(part, (dict, str)) for part in content):
            raise ValueError(f"messages[{i}].content: each part must be a dict (or a string)")
