"""pyllama_moe.chat.handler: the handler made from a format; its results shaped like llama-cpp-python's,
the grammar a response_format or a forced tool call sets (checked by llama.cpp's grammar engine)."""

from __future__ import annotations

from typing import Any

import pytest

from pyllama_moe import chat
from pyllama_moe.json_schema import JSON_GBNF, json_schema_to_gbnf

from fixtures.chat import NO_SYSTEM, WEATHER_TOOL, Grammar, StubLlama, completion

# --------------------------------------------------------------------------------------------
# result shapes


def test_chat_completion_shape() -> None:
    logprobs = {"tokens": ["a", "b"], "token_logprobs": [-0.1, -0.2],
                "top_logprobs": [{"a": -0.1}, {"b": -0.2, "c": -3.0}], "text_offset": [0, 1]}
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
                {"token": "a", "bytes": None, "logprob": -0.1,
                 "top_logprobs": [{"token": "a", "logprob": -0.1, "bytes": None}]},
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
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}},
         json_schema_to_gbnf(schema)),
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
        chat.create_chat_completion(StubLlama(chat_format="chatml"), messages=NO_SYSTEM,
                                    response_format={"type": "yaml"})


def test_unsupported_schema_falls_back_to_json(caplog: pytest.LogCaptureFixture) -> None:
    llama = StubLlama(chat_format="chatml")
    with caplog.at_level("WARNING", logger="pyllama_moe"):
        chat.create_chat_completion(llama, messages=NO_SYSTEM, response_format={
            "type": "json_object", "schema": {"type": "object", "properties": {"a": {"not": {"type": "string"}}}}})
    assert llama.calls[0]["grammar"] == JSON_GBNF
    assert "not" in caplog.text


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
# requests no handler can use (issue #48): a ValueError naming the argument, never a TypeError or a KeyError


def test_a_null_content_renders_as_empty_text() -> None:
    # OpenAI's assistant message of tool calls has "content": null; a template that adds it to a string raised
    # TypeError (a 500 from the server)
    template = "{% for m in messages %}{{ m['role'] + ': ' + m['content'] }}|{% endfor %}"
    formatter = chat.Jinja2ChatFormatter(template, eos_token="</s>", bos_token="")
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "content": "sunny", "tool_call_id": "c1"}]
    assert formatter.render(messages) == "user: hi|assistant: |tool: sunny|"
    assert messages[1]["content"] is None  # the caller's message is left as it was
    llama = StubLlama()
    llama.chat_handler = formatter.to_chat_handler()
    assert chat.create_chat_completion(llama, messages=messages)["choices"][0]["message"]["content"] == "ok"
    with pytest.raises(ValueError, match="cannot render"):  # another value a template cannot add: the request's
        formatter.render([{"role": "user", "content": [{"type": "text", "text": "x"}]}])


@pytest.mark.parametrize("kwargs, match", [
    ({"functions": [{"foo": 1}]}, r"functions\[0\] must be a dict with a 'name'"),
    ({"functions": {"name": "f"}}, "functions must be a list"),
    ({"functions": [{"name": "f", "parameters": "x"}]}, r"functions\[0\].parameters"),
    ({"tools": [{"type": "function"}]}, r"tools\[0\].function must be a dict"),
    ({"tools": [{"type": "retrieval"}]}, r"tools\[0\] must be a dict with 'type': 'function'"),
    ({"tools": [WEATHER_TOOL], "tool_choice": {"function": {}}}, "tool_choice must be"),
    ({"tools": [WEATHER_TOOL], "tool_choice": "always"}, "tool_choice must be"),
    ({"functions": [WEATHER_TOOL["function"]], "function_call": {"name": "g"}}, "function_call: the function 'g'"),
    ({"functions": [WEATHER_TOOL["function"]], "function_call": 5}, "function_call must be"),
    ({"response_format": {"type": "json_object", "schema": {"type": "array", "minItems": 3, "maxItems": 1}}},
     "response_format: invalid JSON schema: root: minItems 3 is above maxItems 1"),
    ({"response_format": {"type": "json_object", "schema": {"type": "foo"}}}, "unknown type"),
    ({"response_format": {"type": "json_object", "schema": 5}}, "must be an object or a boolean"),
    ({"response_format": ["json"]}, "response_format must be a dict"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string", "maxLength": -1}}}],
      "tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool 'f': invalid JSON schema"),
])
@pytest.mark.parametrize("chat_format", ["chatml", "chatml-function-calling"])
def test_malformed_tools_and_schemas_name_the_argument(kwargs: dict[str, Any], match: str, chat_format: str) -> None:
    llama = StubLlama(chat_format=chat_format)
    with pytest.raises(ValueError, match=match):
        chat.create_chat_completion(llama, messages=NO_SYSTEM, **kwargs)
    assert llama.calls == []  # refused before any completion


def test_a_schema_beyond_the_converter_still_falls_back_to_plain_json() -> None:
    llama = StubLlama(chat_format="chatml")
    chat.create_chat_completion(llama, messages=NO_SYSTEM, response_format={"type": "json_object", "schema": {
        "type": "object", "properties": {"a": {"not": {}}}}})
    assert llama.calls[0]["grammar"] == JSON_GBNF
