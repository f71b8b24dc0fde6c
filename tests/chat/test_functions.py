"""pyllama_moe.chat.functions: ``chat_format="chatml-function-calling"``, tool calls for ChatML models."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pyllama_moe import chat
from pyllama_moe.json_schema import json_schema_to_gbnf

from fixtures.chat import CONVERSATION, EXPECTED, NO_SYSTEM, WEATHER_TOOL, StubLlama, completion


def test_forced_tool_call_stream_shape() -> None:
    llama = StubLlama([['{"city": ', '"Oslo", "unit": "celsius"}']], chat_format="chatml-function-calling")
    out = list(chat.create_chat_completion(llama, messages=NO_SYSTEM, tools=[WEATHER_TOOL], stream=True,
                                           tool_choice={"type": "function", "function": {"name": "get_weather"}}))
    assert out[0]["choices"][0]["delta"] == {"role": "assistant", "content": None, "function_call": None,
                                             "tool_calls": None}
    deltas = [c["choices"][0]["delta"] for c in out[1:-1]]
    assert "".join(d["tool_calls"][0]["function"]["arguments"] for d in deltas) == '{"city": "Oslo", "unit": "celsius"}'
    assert all(d["tool_calls"][0]["id"] == "call__0_get_weather_cmpl-123" and d["tool_calls"][0]["index"] == 0
               for d in deltas)
    assert out[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == "chatcmpl-123" for c in out)


def test_chatml_function_calling_prompts() -> None:
    # no tools: plain ChatML
    llama = StubLlama(chat_format="chatml-function-calling")
    chat.create_chat_completion(llama, messages=CONVERSATION, stop="END")
    assert llama.prompt() == EXPECTED["chatml"][0]
    assert llama.calls[0]["stop"] == ["END", "<|im_end|>"]

    # forced: the functions are listed in the system turn and the prompt opens the call
    llama = StubLlama([completion('{"city": "Rome", "unit": "celsius"}')], chat_format="chatml-function-calling")
    out = chat.create_chat_completion(llama, messages=CONVERSATION, tools=[WEATHER_TOOL],
                                      tool_choice={"type": "function", "function": {"name": "get_weather"}})
    prompt = llama.prompt()
    assert prompt.startswith("<|im_start|>system\nBe brief.\n\nYou have access to the following functions:\n"
                             "\nfunctions.get_weather:\n" + json.dumps(WEATHER_TOOL["function"]["parameters"]) + "\n")
    assert prompt.endswith("<|im_start|>user\nHow are you?<|im_end|>\n<|im_start|>assistant\nfunctions.get_weather:\n")
    assert llama.calls[0]["grammar"] == json_schema_to_gbnf(WEATHER_TOOL["function"]["parameters"])
    assert out["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"


def test_chatml_function_calling_auto() -> None:
    clock: dict[str, Any] = {"type": "function",
                             "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
    # the model chooses a function, calls it, then a second one, then stops
    llama = StubLlama([completion("functions.get_weather"), completion('{"city": "Oslo", "unit": "celsius"}'),
                       completion("functions.get_time:"), completion("{}"), completion("")],
                      chat_format="chatml-function-calling")
    out = chat.create_chat_completion(llama, messages=NO_SYSTEM, tools=[WEATHER_TOOL, clock], tool_choice="auto")
    choose = llama.calls[0]
    assert choose["stop"] == [":"] and choose["temperature"] == 0
    assert choose["grammar"] == ('root ::= functions | "message:"\n'
                                 'functions ::= "functions.get_weather:" | "functions.get_time:"\n')
    assert llama.prompt(1).endswith("<|im_start|>assistant\nfunctions.get_weather:\n")
    assert llama.prompt(3).endswith(
        'functions.get_weather:\n{"city": "Oslo", "unit": "celsius"}\nfunctions.get_time:\n')
    assert llama.calls[3]["grammar"] == json_schema_to_gbnf(clock["function"]["parameters"])
    message = out["choices"][0]["message"]
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_weather", "get_time"]
    assert [c["id"] for c in message["tool_calls"]] == ["call__0_get_weather_cmpl-123", "call__1_get_time_cmpl-123"]
    assert "function_call" not in message and out["choices"][0]["finish_reason"] == "tool_calls"
    assert out["usage"] == {"completion_tokens": 4, "prompt_tokens": 10, "total_tokens": 14}

    # or writes a message
    llama = StubLlama([completion("message"), completion("Sunny.")], chat_format="chatml-function-calling")
    out = chat.create_chat_completion(llama, messages=NO_SYSTEM, tools=[WEATHER_TOOL], tool_choice="auto")
    assert out["choices"][0]["message"] == {"role": "assistant", "content": "Sunny."}
    assert llama.calls[1]["prompt"].endswith("<|im_start|>assistant\nmessage:\n")
    with pytest.raises(ValueError, match="streaming"):
        chat.create_chat_completion(StubLlama(chat_format="chatml-function-calling"), messages=NO_SYSTEM,
                                    tools=[WEATHER_TOOL], tool_choice="auto", stream=True)
