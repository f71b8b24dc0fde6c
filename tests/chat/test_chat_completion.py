"""Llama.create_chat_completion end to end: a synthetic GGUF (random weights) whose tokenizer and chat template
are qwen2's, generated from when ``pyllama_moe.Llama`` is importable (JSON output, tool calls)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pyllama_moe.json_schema import JSON_GBNF

from fixtures.chat import WEATHER_TOOL, Grammar


@pytest.fixture(scope="module")
def llm(tiny_model: Path) -> Iterator[Any]:
    llama_mod = pytest.importorskip("pyllama_moe.llama", reason="pyllama_moe.Llama is not there yet")
    llm = llama_mod.Llama(model_path=str(tiny_model), n_ctx=512, n_batch=512, verbose=False, seed=3)
    try:
        yield llm
    finally:
        llm.close()


def test_real_llama_chat_with_the_gguf_template(llm: Any) -> None:
    out = llm.create_chat_completion(messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0)
    assert out["object"] == "chat.completion" and out["id"].startswith("chatcmpl")
    assert out["choices"][0]["message"]["role"] == "assistant"
    assert out["usage"]["prompt_tokens"] == 19  # the qwen2 template's ChatML with its default system turn
    stream = list(llm.create_chat_completion(messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                             temperature=0, stream=True))
    assert stream[0]["choices"][0]["delta"] == {"role": "assistant"}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in stream)
    assert text == out["choices"][0]["message"]["content"]
    assert stream[-1]["choices"][0]["finish_reason"] == out["choices"][0]["finish_reason"] == "length"


def test_real_llama_json_schema_output_parses(llm: Any) -> None:
    schema = {"type": "object", "properties": {
        "ok": {"type": "boolean"}, "color": {"enum": ["red", "green", "blue"]}, "n": {"type": "integer"},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
        "note": {"type": "string", "maxLength": 4}},
        "required": ["ok", "color", "n"]}
    for seed, response_format in enumerate([
        {"type": "json_object", "schema": schema},
        {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}},
    ]):
        out = llm.create_chat_completion(messages=[{"role": "user", "content": "Answer in JSON"}],
                                         response_format=response_format, max_tokens=200, temperature=0.8, seed=seed)
        choice = out["choices"][0]
        assert choice["finish_reason"] == "stop", choice
        value = json.loads(choice["message"]["content"])
        assert {"ok", "color", "n"} <= set(value) and set(value) <= set(schema["properties"])
        assert (isinstance(value["ok"], bool) and value["color"] in ("red", "green", "blue")
                and isinstance(value["n"], int))


def test_real_llama_json_object_output_is_json(llm: Any, vocab: Any) -> None:
    """Any JSON object: the output parses when complete, and is a prefix of JSON when cut by max_tokens."""
    g = Grammar(vocab, JSON_GBNF)
    for seed in (1, 2):
        out = llm.create_chat_completion(messages=[{"role": "user", "content": "JSON please"}],
                                         response_format={"type": "json_object"}, max_tokens=24, seed=seed)
        choice = out["choices"][0]
        text = choice["message"]["content"]
        assert text.startswith("{")
        if choice["finish_reason"] == "stop":
            assert isinstance(json.loads(text), dict)
        else:
            assert g.accepts(text, complete=False), text


def test_real_llama_forced_tool_call(llm: Any) -> None:
    for chat_format in ("chatml-function-calling", None):
        llm.chat_format, saved = chat_format or llm.chat_format, llm.chat_format
        try:
            out = llm.create_chat_completion(
                messages=[{"role": "user", "content": "Weather in Paris?"}], tools=[WEATHER_TOOL],
                tool_choice={"type": "function", "function": {"name": "get_weather"}}, max_tokens=160, seed=5)
        finally:
            llm.chat_format = saved
        choice = out["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        call = choice["message"]["tool_calls"][0]
        assert call["type"] == "function" and call["function"]["name"] == "get_weather"
        args = json.loads(call["function"]["arguments"])
        assert set(args) >= {"city", "unit"} and args["unit"] in ("celsius", "fahrenheit") and len(args["city"]) <= 12
