"""Chat completion handlers: a prompt from a chat formatter, a completion from ``llama``, chat-shaped results.

A *handler* has llama-cpp-python's ``LlamaChatCompletionHandler`` signature: it is called with
``llama=`` and the keywords of ``create_chat_completion`` and returns a ``chat.completion`` dict, or
an iterator of ``chat.completion.chunk`` dicts when ``stream=True``. A *formatter* turns
``messages`` into a :class:`ChatFormatterResponse`; :func:`chat_formatter_to_chat_completion_handler`
makes a handler of it. The result dicts have exactly the keys and values llama-cpp-python 0.3.36
gives them (ids ``"chat" + <completion id>``, a first chunk carrying only the role, ...).

``llama`` is used only through ``tokenize`` and ``create_completion``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Generator, Iterable, Iterator
from typing import Any, Protocol

from pyllama_moe.json_schema import JSON_GBNF, InvalidSchemaError, SchemaError, json_schema_to_gbnf

__all__ = [
    "ChatFormatter",
    "ChatFormatterResponse",
    "LlamaChatCompletionHandler",
    "chat_formatter_to_chat_completion_handler",
    "check_tools",
    "complete_chat",
    "completion_kwargs",
    "convert_completion_to_chat",
    "convert_completion_to_chat_function",
    "convert_logprobs_to_chat",
    "grammar_for_response_format",
    "grammar_for_tool",
    "tools_and_choice",
]

logger = logging.getLogger("pyllama_moe")


@dataclasses.dataclass
class ChatFormatterResponse:
    """What a chat formatter returns: the prompt and the completion parameters that go with it.

    ``stop`` is added to the caller's stop strings. ``added_special`` says the prompt already holds
    the BOS text, so the tokenizer must not add one. ``stopping_criteria`` is passed on to
    ``create_completion`` when set.
    """

    prompt: str
    stop: str | list[str] | None = None
    stopping_criteria: Any = None
    added_special: bool = False


class ChatFormatter(Protocol):
    def __call__(self, *, messages: list[dict[str, Any]], **kwargs: Any) -> ChatFormatterResponse: ...


class LlamaChatCompletionHandler(Protocol):
    def __call__(self, *, llama: Any, messages: list[dict[str, Any]], **kwargs: Any) -> Any: ...


# the sampling keywords of create_chat_completion that go to create_completion unchanged, with
# llama-cpp-python's handler defaults
_SAMPLING_DEFAULTS: dict[str, Any] = {
    "temperature": 0.2,
    "top_p": 0.95,
    "top_k": 40,
    "min_p": 0.05,
    "typical_p": 1.0,
    "seed": None,
    "max_tokens": None,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repeat_penalty": 1.1,
    "tfs_z": 1.0,
    "mirostat_mode": 0,
    "mirostat_tau": 5.0,
    "mirostat_eta": 0.1,
    "model": None,
    "logits_processor": None,
    "logit_bias": None,
}


def completion_kwargs(kwargs: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    """The ``create_completion`` keywords for a chat request: sampling settings, then ``overrides``.

    ``logprobs``/``top_logprobs`` become ``logprobs=top_logprobs`` (or None) as llama-cpp-python
    does; ``stopping_criteria`` is passed only when set.
    """
    out = {k: kwargs.get(k, v) for k, v in _SAMPLING_DEFAULTS.items()}
    out["logprobs"] = kwargs.get("top_logprobs") if kwargs.get("logprobs") else None
    out.update(overrides)
    if out.get("stopping_criteria", None) is None:
        out.pop("stopping_criteria", None)
    return out


def _stop_list(stop: str | list[str] | None) -> list[str]:
    if stop is None:
        return []
    return [stop] if isinstance(stop, str) else list(stop)


def _check_function(what: str, f: Any) -> None:
    if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not f["name"]:
        raise ValueError(f"{what} must be a dict with a 'name' string (and 'parameters', a JSON schema), "
                         f"got {f!r:.100}")
    params = f.get("parameters")
    if params is not None and not isinstance(params, (dict, bool)):
        raise ValueError(f"{what}.parameters must be a JSON schema (a dict), got {params!r:.100}")


def check_tools(kwargs: dict[str, Any]) -> None:
    """ValueError naming the argument for ``functions``, ``tools``, ``function_call`` or ``tool_choice`` in a shape no
    handler can use (a function without a name, a choice that is neither a mode nor a function's name)."""
    for key in ("functions", "tools"):
        value = kwargs.get(key)
        if value is not None and not isinstance(value, list):
            raise ValueError(f"{key} must be a list, got {value!r:.100}")
    for i, f in enumerate(kwargs.get("functions") or []):
        _check_function(f"functions[{i}]", f)
    for i, t in enumerate(kwargs.get("tools") or []):
        if not isinstance(t, dict) or t.get("type", "function") != "function":
            raise ValueError(f"tools[{i}] must be a dict with 'type': 'function' and a 'function', got {t!r:.100}")
        _check_function(f"tools[{i}].function", t.get("function"))
    function_call = kwargs.get("function_call")
    if isinstance(function_call, dict):
        _check_function("function_call", function_call)
    elif function_call not in (None, "none", "auto"):
        raise ValueError(f"function_call must be 'none', 'auto' or {{'name': ...}}, got {function_call!r:.100}")
    tool_choice = kwargs.get("tool_choice")
    if tool_choice is not None and tool_choice not in ("none", "auto", "required"):
        if not isinstance(tool_choice, dict) or not isinstance(tool_choice.get("function"), dict) \
                or not isinstance(tool_choice["function"].get("name"), str):
            raise ValueError("tool_choice must be 'none', 'auto', 'required' or "
                             f"{{'type': 'function', 'function': {{'name': ...}}}}, got {tool_choice!r:.100}")
    names = {f["name"] for f in kwargs.get("functions") or []}
    names |= {t["function"]["name"] for t in kwargs.get("tools") or []}
    chosen = (("function_call", function_call.get("name") if isinstance(function_call, dict) else None),
              ("tool_choice", tool_choice["function"]["name"] if isinstance(tool_choice, dict) else None))
    for key, name in chosen:  # (without any, the handlers pass over a choice)
        if name is not None and names and name not in names:  # llama-cpp-python's words for tool_choice
            raise ValueError(f"Tool choice '{name}' not found in tools." if key == "tool_choice" else
                             f"function_call: the function {name!r} is not among the functions given")


def tools_and_choice(kwargs: dict[str, Any]) -> tuple[list[dict[str, Any]] | None, Any]:
    """``tools`` and ``tool_choice``, with the legacy ``functions`` / ``function_call`` turned into them (checked
    first: :func:`check_tools`)."""
    check_tools(kwargs)
    tools = kwargs.get("tools")
    tool_choice = kwargs.get("tool_choice")
    functions = kwargs.get("functions")
    function_call = kwargs.get("function_call")
    if functions is not None:
        tools = [{"type": "function", "function": f} for f in functions]
    if function_call is not None:
        if function_call in ("none", "auto"):
            tool_choice = function_call
        elif isinstance(function_call, dict) and "name" in function_call:
            tool_choice = {"type": "function", "function": {"name": function_call["name"]}}
    return tools, tool_choice


def _forced_tool(tools: list[dict[str, Any]] | None, tool_choice: Any) -> dict[str, Any] | None:
    if not isinstance(tool_choice, dict) or tools is None:
        return None
    name = tool_choice["function"]["name"]
    tool = next((t for t in tools if t["function"]["name"] == name), None)
    if tool is None:
        raise ValueError(f"Tool choice '{name}' not found in tools.")
    return tool


def grammar_for_schema(schema: Any, what: str = "response_format") -> str:
    """The GBNF of ``schema``; plain JSON (with a warning) where the schema is beyond the converter. A schema that is
    wrong, or whose grammar is past the grammar bounds, is a ValueError naming ``what`` (a 400 from the server)."""
    try:
        return json_schema_to_gbnf(schema)
    except InvalidSchemaError as e:
        raise InvalidSchemaError(f"{what}: invalid JSON schema: {e}") from None
    except SchemaError as e:
        logger.warning("JSON schema not converted to a grammar (%s); constraining to any JSON object", e)
        return JSON_GBNF


def grammar_for_tool(tool: dict[str, Any]) -> str:
    """The grammar for a call of ``tool``: its ``parameters`` schema (any JSON object without one)."""
    params = tool["function"].get("parameters")
    if params is None:
        return JSON_GBNF
    return grammar_for_schema(params, f"the parameters of tool {tool['function'].get('name')!r}")


def grammar_for_response_format(response_format: dict[str, Any] | None) -> str | None:
    """The grammar a ``response_format`` asks for, or None.

    ``{"type": "json_object"}``: any JSON object; with ``"schema"``: that schema;
    ``{"type": "json_schema", "json_schema": {"schema": ...}}``: that schema (OpenAI's form);
    ``{"type": "text"}`` or None: no grammar.
    """
    if response_format is None:
        return None
    if not isinstance(response_format, dict):
        raise ValueError("response_format must be a dict such as {'type': 'json_object'}, "
                         f"got {response_format!r:.100}")
    kind = response_format.get("type")
    if kind == "json_object":
        if response_format.get("schema") is not None:
            return grammar_for_schema(response_format["schema"])
        return JSON_GBNF
    if kind == "json_schema":
        spec = response_format.get("json_schema") or {}
        if not isinstance(spec, dict):
            raise ValueError(f"response_format: json_schema must be a dict with a 'schema', got {spec!r:.100}")
        schema = spec.get("schema", response_format.get("schema"))
        return JSON_GBNF if schema is None else grammar_for_schema(schema)
    if kind in ("text", None):
        return None
    raise ValueError(f"response_format type must be 'text', 'json_object' or 'json_schema', got {kind!r}")


def chat_formatter_to_chat_completion_handler(chat_formatter: ChatFormatter) -> LlamaChatCompletionHandler:
    """A handler that formats with ``chat_formatter`` and completes with ``llama.create_completion``.

    As llama-cpp-python's: the prompt is tokenized with special tokens parsed (BOS added unless the
    formatter says the prompt holds it), the formatter's stop strings are added to the caller's,
    ``response_format`` JSON sets the grammar, and a ``tool_choice`` naming a function forces a call
    of it whose arguments follow the function's parameter schema.
    """

    def chat_completion_handler(*, llama: Any, messages: list[dict[str, Any]], **kwargs: Any) -> Any:
        check_tools(kwargs)
        result = chat_formatter(
            messages=messages,
            functions=kwargs.get("functions"),
            function_call=kwargs.get("function_call"),
            tools=kwargs.get("tools"),
            tool_choice=kwargs.get("tool_choice"),
        )
        prompt = llama.tokenize(result.prompt.encode("utf-8"), add_bos=not result.added_special, special=True)
        return complete_chat(llama, prompt, kwargs, stop=result.stop, stopping_criteria=result.stopping_criteria)

    return chat_completion_handler


def complete_chat(llama: Any, prompt: list[int], kwargs: dict[str, Any], *, stop: str | list[str] | None = None,
                  stopping_criteria: Any = None) -> Any:
    """The chat result of completing ``prompt`` (tokens) with ``llama.create_completion``: the caller's stop strings
    and then ``stop``, ``response_format`` JSON as the grammar, and a ``tool_choice`` naming a function forcing a
    call of it whose arguments follow the function's parameter schema. ``kwargs`` are ``create_chat_completion``'s."""
    tools, tool_choice = tools_and_choice(kwargs)
    stops = _stop_list(kwargs.get("stop", [])) + _stop_list(stop)
    grammar = kwargs.get("grammar")
    rf_grammar = grammar_for_response_format(kwargs.get("response_format"))
    if rf_grammar is not None:
        grammar = rf_grammar
    tool = _forced_tool(tools, tool_choice)
    if tool is not None:
        grammar = grammar_for_tool(tool)
    stream = bool(kwargs.get("stream", False))
    completion_or_chunks = llama.create_completion(**completion_kwargs(
        kwargs, prompt=prompt, stream=stream, stop=stops, grammar=grammar, stopping_criteria=stopping_criteria))
    if tool is not None:
        return convert_completion_to_chat_function(tool["function"]["name"], completion_or_chunks, stream)
    return convert_completion_to_chat(completion_or_chunks, stream=stream)


# -- results


def convert_logprobs_to_chat(logprobs: dict[str, Any] | None) -> dict[str, Any] | None:
    """A text completion's ``logprobs`` in the chat form (``{"content": [...], "refusal": None}``)."""
    if logprobs is None:
        return None
    return {
        "content": [
            {
                "token": token,
                "bytes": None,
                "logprob": logprob,
                "top_logprobs": [{"token": t, "logprob": lp, "bytes": None} for t, lp in (top or {}).items()],
            }
            for token, logprob, top in zip(logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"],
                                           strict=True)
        ],
        "refusal": None,
    }


def _chat_completion(completion: dict[str, Any], message: dict[str, Any], finish_reason: Any) -> dict[str, Any]:
    """The ``chat.completion`` of a ``text_completion`` with one choice that says ``message``."""
    return {
        "id": "chat" + completion["id"],
        "object": "chat.completion",
        "created": completion["created"],
        "model": completion["model"],
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": convert_logprobs_to_chat(completion["choices"][0].get("logprobs")),
                "finish_reason": finish_reason,
            }
        ],
        "usage": completion["usage"],
    }


def _chunk_head(chunk: dict[str, Any]) -> dict[str, Any]:
    """The fields of a ``chat.completion.chunk`` that come from the completion chunk."""
    return {"id": "chat" + chunk["id"], "object": "chat.completion.chunk", "created": chunk["created"],
            "model": chunk["model"]}


def _completion_to_chat(completion: dict[str, Any]) -> dict[str, Any]:
    choice = completion["choices"][0]
    return _chat_completion(completion, {"role": "assistant", "content": choice["text"]}, choice["finish_reason"])


def _returning(chunks: Iterable[dict[str, Any]], ret: list[Any]) -> Generator[dict[str, Any], None, None]:
    """The chunks of a completion's stream, what the stream returns (its usage) appended to ``ret``, so that a
    stream converted from it returns it too (closing this closes the stream)."""
    stream: Generator[dict[str, Any], None, Any] = (
        chunks if isinstance(chunks, Generator) else (c for c in chunks))  # a list of chunks returns nothing
    ret.append((yield from stream))


def _chunks_to_chat(chunks: Iterator[dict[str, Any]]) -> Generator[dict[str, Any], None, Any]:
    ret: list[Any] = []
    for i, chunk in enumerate(_returning(chunks, ret)):
        head = _chunk_head(chunk)
        choice = chunk["choices"][0]
        if i == 0:
            yield {**head, "choices": [{"index": 0, "delta": {"role": "assistant"}, "logprobs": None,
                                        "finish_reason": None}]}
        yield {**head, "choices": [{
            "index": 0,
            "delta": {"content": choice["text"]} if choice["finish_reason"] is None else {},
            "logprobs": convert_logprobs_to_chat(choice.get("logprobs")),
            "finish_reason": choice["finish_reason"],
        }]}
    return ret[0] if ret else None


def convert_completion_to_chat(completion_or_chunks: Any, stream: bool = False) -> Any:
    """A ``text_completion`` as a ``chat.completion``, or its chunks as ``chat.completion.chunk``s."""
    if stream:
        return _chunks_to_chat(completion_or_chunks)
    return _completion_to_chat(completion_or_chunks)


def convert_completion_to_chat_function(tool_name: str, completion_or_chunks: Any, stream: bool) -> Any:
    """A completion of a forced call of ``tool_name`` as an assistant message with ``tool_calls``."""
    if not stream:
        completion = completion_or_chunks
        call = {"name": tool_name, "arguments": completion["choices"][0]["text"]}
        message = {
            "role": "assistant",
            "content": None,
            "function_call": call,
            "tool_calls": [{"id": "call__0_" + tool_name + "_" + completion["id"], "type": "function",
                            "function": dict(call)}],
        }
        return _chat_completion(completion, message, "tool_calls")
    return _function_chunks(tool_name, completion_or_chunks)


def _function_chunks(tool_name: str, chunks: Iterator[dict[str, Any]]) -> Generator[dict[str, Any], None, Any]:
    head: dict[str, Any] | None = None
    tool_id = None
    ret: list[Any] = []
    for chunk in _returning(chunks, ret):
        if head is None:
            head = _chunk_head(chunk)
            tool_id = "call__0_" + tool_name + "_" + chunk["id"]
            yield {**head, "choices": [{"index": 0, "finish_reason": None, "logprobs": None, "delta": {
                "role": "assistant", "content": None, "function_call": None, "tool_calls": None}}]}
        text = chunk["choices"][0]["text"]
        yield {
            **_chunk_head(chunk),
            "choices": [{
                "index": 0,
                "finish_reason": None,
                "logprobs": convert_logprobs_to_chat(chunk["choices"][0].get("logprobs")),
                "delta": {
                    "role": None,
                    "content": None,
                    "function_call": {"name": tool_name, "arguments": text},
                    "tool_calls": [{"index": 0, "id": tool_id, "type": "function",
                                    "function": {"name": tool_name, "arguments": text}}],
                },
            }],
        }
    if head is not None:
        yield {**head, "choices": [{"index": 0, "finish_reason": "tool_calls", "logprobs": None, "delta": {
            "role": None, "content": None, "function_call": None, "tool_calls": None}}]}
    return ret[0] if ret else None

