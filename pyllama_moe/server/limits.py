"""What one request may cost, checked before it waits for its model: a request past a bound is an OpenAI-shaped
400 at once, not minutes later (or never) from a model it held. docs/compat.md lists the bounds.

- the body: ``max_request_bytes`` (413, the app's middleware), the chat messages: ``max_messages``;
- ``max_tokens``: at most the model's context (a prompt and its completion share it; a completion that reaches
  its end stops there, ``finish_reason`` ``"length"``); the prompt's tokens: less than the context (400
  ``context_length_exceeded``, when the model tokenizes it);
- ``grammar``: at most ``max_grammar_bytes``, and the checks of :func:`pyllama_moe.gbnf.check_grammar` (repetition
  bounds and their nesting, depth, empty ranges); a ``response_format`` or tool schema: the same checks on the
  grammar it becomes, and a wrong schema is refused rather than relaxed to plain JSON;
- ``logprobs`` / ``top_logprobs``: at most ``max_logprobs``; ``n`` and ``best_of``: 1;
- ``functions`` / ``tools`` / ``function_call`` / ``tool_choice``: the shapes the chat handlers can use.
"""

from __future__ import annotations

from typing import Any

from pyllama_moe.chat.handler import check_tools, grammar_for_response_format, grammar_for_schema
from pyllama_moe.gbnf import check_grammar
from pyllama_moe.server.settings import ServerSettings


class RequestLimitError(ValueError):
    """A request past one of the bounds: a 400 naming the parameter (``param``)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def _check(param: str, fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except RequestLimitError:
        raise
    except ValueError as e:
        raise RequestLimitError(param, str(e)) from None


def _grammar(grammar: str | None, server: ServerSettings) -> None:
    if grammar is None:
        return
    size = len(grammar.encode("utf-8", errors="surrogatepass"))
    if size > server.max_grammar_bytes:
        raise RequestLimitError("grammar", f"grammar: {size} bytes, more than the {server.max_grammar_bytes} of "
                                           "max_grammar_bytes")
    _check("grammar", check_grammar, grammar)


def _max_tokens(max_tokens: int | None, n_ctx: int | None) -> None:
    if max_tokens is not None and n_ctx is not None and max_tokens > n_ctx:
        raise RequestLimitError("max_tokens", f"max_tokens is {max_tokens}, more than the model's context of "
                                              f"{n_ctx} tokens (which the prompt shares)")


def _logprobs(param: str, n: int | None, server: ServerSettings) -> None:
    if n is not None and n > server.max_logprobs:
        raise RequestLimitError(param, f"{param} is {n}, more than the {server.max_logprobs} of max_logprobs")


def check_completion(body: Any, n_ctx: int | None, server: ServerSettings) -> None:
    """A ``/v1/completions`` request (a ``CompletionRequest``) within the bounds, or RequestLimitError."""
    _max_tokens(body.max_tokens, n_ctx)
    _logprobs("logprobs", body.logprobs, server)
    _grammar(body.grammar, server)


def check_chat(body: Any, n_ctx: int | None, server: ServerSettings) -> None:
    """A ``/v1/chat/completions`` request (a ``ChatRequest``) within the bounds, or RequestLimitError."""
    _max_tokens(body.max_tokens, n_ctx)
    _logprobs("top_logprobs", body.top_logprobs, server)
    _grammar(body.grammar, server)
    kwargs = {"functions": body.functions, "tools": body.tools, "function_call": body.function_call,
              "tool_choice": body.tool_choice}
    try:
        check_tools(kwargs)
    except ValueError as e:  # its messages begin with the argument: "tools[0].function must ..."
        raise RequestLimitError(str(e).partition(" ")[0].partition("[")[0].partition(".")[0], str(e)) from None
    _check("response_format", grammar_for_response_format, body.response_format)
    for i, f in enumerate(body.functions or []):
        if f.get("parameters") is not None:
            _check("functions", grammar_for_schema, f["parameters"], f"functions[{i}].parameters")
    for i, t in enumerate(body.tools or []):
        if t["function"].get("parameters") is not None:
            _check("tools", grammar_for_schema, t["function"]["parameters"], f"tools[{i}].function.parameters")
