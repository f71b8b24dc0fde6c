"""``chat_format="chatml-function-calling"``: tool calls for ChatML models, as llama-cpp-python does them.

The prompt is ChatML; with tools it lists each function's parameter schema in the system turn and
asks for either ``message:`` followed by text or ``functions.<name>:`` followed by JSON arguments.

- no tools, or ``tool_choice="none"``: a plain ChatML completion (``response_format`` applies);
- ``tool_choice={"type": "function", "function": {"name": ...}}``: the prompt ends with
  ``functions.<name>:\\n`` and the arguments are generated under the grammar of that function's
  parameter schema; the result carries ``tool_calls`` (and the legacy ``function_call``), also
  when streaming;
- ``tool_choice="auto"``: a grammar makes the model choose ``message:`` or one of the functions; a
  chosen function is called, then the model may call more (``finish_reason="tool_calls"``), or
  writes a message. Like llama-cpp-python, streaming is not supported with automatic choice.
"""

from __future__ import annotations

from typing import Any

from pyllama_moe.chat.formats import register_chat_completion_handler
from pyllama_moe.chat.handler import (
    completion_kwargs,
    convert_completion_to_chat,
    convert_completion_to_chat_function,
    convert_logprobs_to_chat,
    grammar_for_response_format,
    grammar_for_tool,
    tools_and_choice,
)
from pyllama_moe.chat.template import compile_template
from pyllama_moe.json_schema import gbnf_literal

__all__ = ["FUNCTION_CALLING_TEMPLATE", "chatml_function_calling"]

FUNCTION_CALLING_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message.role }}\n"
    "{% if message.role == 'system' %}"
    "{{ message.content }}"
    "{% if tool_calls %}"
    "\n\nYou have access to the following functions:\n"
    "{% for tool in tools %}"
    "\nfunctions.{{ tool.function.name }}:\n"
    "{{ tool.function.parameters | tojson }}"
    "\n{% endfor %}"
    "\n\nYou can respond to users messages with either a single message or one or more function calls."
    "\n\nTo respond with a message begin the message with 'message:', use the following format:"
    "\n\nmessage:"
    "\n<message>"
    "\n\nTo respond with one or more function calls begin the message with 'functions.<function_name>:', "
    "use the following format:"
    "\n\nfunctions.<function_name>:"
    '\n{ "arg1": "value1", "arg2": "value2" }'
    "\nfunctions.<function_name>:"
    '\n{ "arg1": "value1", "arg2": "value2" }'
    "{% endif %}"
    "<|im_end|>\n"
    "{% endif %}"
    "{% if message.role == 'user' %}"
    "{{ message.content }}"
    "<|im_end|>\n"
    "{% endif %}"
    "{% if message.role == 'assistant' %}"
    "{% if message.content and message.content | length > 0 %}"
    "{% if tool_calls %}"
    "message:\n"
    "{% endif %}"
    "{{ message.content }}"
    "<|im_end|>\n"
    "{% endif %}"
    "{% if 'tool_calls' in message %}"
    "{% for tool_call in message.tool_calls %}"
    "functions.{{ tool_call.function.name }}:\n"
    "{{ tool_call.function.arguments }}"
    "{% endfor %}"
    "<|im_end|>\n"
    "{% endif %}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _render(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
    return compile_template(FUNCTION_CALLING_TEMPLATE, trim=False).render(
        messages=messages, tools=tools or [], tool_calls=True if tools else None, add_generation_prompt=True)


def _tool(tools: list[dict[str, Any]], name: str) -> dict[str, Any] | None:
    return next((t for t in tools if t["function"]["name"] == name), None)


@register_chat_completion_handler("chatml-function-calling")
def chatml_function_calling(*, llama: Any, messages: list[dict[str, Any]], **kwargs: Any) -> Any:
    tools, tool_choice = tools_and_choice(kwargs)
    stop = kwargs.get("stop") or []
    stop = [stop, "<|im_end|>"] if isinstance(stop, str) else [*stop, "<|im_end|>"]
    stream = bool(kwargs.get("stream", False))

    # no tool to call
    if tool_choice is None or tool_choice == "none" or not tools:
        grammar = grammar_for_response_format(kwargs.get("response_format")) or kwargs.get("grammar")
        return convert_completion_to_chat(llama.create_completion(**completion_kwargs(
            kwargs, prompt=_render(messages, None), stream=stream, stop=stop, grammar=grammar)), stream=stream)

    # the caller names the function
    if isinstance(tool_choice, dict):
        name = tool_choice["function"]["name"]
        tool = _tool(tools, name)
        if tool is None:
            raise ValueError(f"Tool with name '{name}' not found in tools")
        prompt = _render(messages, tools) + f"functions.{name}:\n"
        completion_or_chunks = llama.create_completion(**completion_kwargs(
            kwargs, prompt=prompt, stream=stream, stop=stop, grammar=grammar_for_tool(tool)))
        return convert_completion_to_chat_function(name, completion_or_chunks, stream)

    if tool_choice != "auto":
        raise ValueError(f"tool_choice must be 'none', 'auto' or a function, got {tool_choice!r}")
    if stream:
        raise ValueError("Automatic streaming tool choice is not supported")

    # the model chooses: a message, or one function call after another
    names = " | ".join(gbnf_literal(f"functions.{t['function']['name']}:") for t in tools)
    first_choice = f'root ::= functions | "message:"\nfunctions ::= {names}\n'
    next_choice = f'root ::= functions | "<|im_end|>"\nfunctions ::= {names}\n'
    prompt = _render(messages, tools)
    choose = completion_kwargs(kwargs, stream=False, max_tokens=None)
    chosen = llama.create_completion(**{**choose, "prompt": prompt, "temperature": 0, "stop": [":"],
                                        "grammar": first_choice, "logprobs": None})
    text = chosen["choices"][0]["text"]
    if "message" in text:
        return convert_completion_to_chat(llama.create_completion(**completion_kwargs(
            kwargs, prompt=prompt + "message:\n", stream=False, stop=["<|im_end|>"], max_tokens=None,
            grammar=None)), stream=False)

    calls: list[tuple[str, dict[str, Any]]] = []
    name = text[len("functions."):]
    tool = _tool(tools, name)
    while tool is not None:
        prompt += f"functions.{name}:\n"
        completion = llama.create_completion(**completion_kwargs(
            kwargs, prompt=prompt, stream=False, stop=stop, max_tokens=None, grammar=grammar_for_tool(tool)))
        calls.append((name, completion))
        prompt += completion["choices"][0]["text"] + "\n"
        following = llama.create_completion(**{**choose, "prompt": prompt, "stop": stop, "grammar": next_choice})
        name = following["choices"][0]["text"][len("functions."):].rstrip(":")
        tool = _tool(tools, name)

    if not calls:  # the grammar allows only known names, so this is a model that stopped early
        raise ValueError(f"the model chose neither a message nor a known function: {text!r}")
    first = calls[0][1]
    # as llama-cpp-python: the id, time and model of the choice, the usage of the calls
    message: dict[str, Any] = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": f"call__{i}_{n}_{c['id']}", "type": "function",
             "function": {"name": n, "arguments": c["choices"][0]["text"]}}
            for i, (n, c) in enumerate(calls)
        ],
    }
    if len(calls) == 1:
        message["function_call"] = {"name": calls[0][0], "arguments": first["choices"][0]["text"]}
    return {
        "id": "chat" + chosen["id"],
        "object": "chat.completion",
        "created": chosen["created"],
        "model": chosen["model"],
        "choices": [{"finish_reason": "tool_calls", "index": 0,
                     "logprobs": convert_logprobs_to_chat(chosen["choices"][0].get("logprobs")), "message": message}],
        "usage": {key: sum(c.get("usage", {}).get(key, 0) for _, c in calls)
                  for key in ("completion_tokens", "prompt_tokens", "total_tokens")},
    }
