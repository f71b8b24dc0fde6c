"""The OpenAI-compatible HTTP API: completions, chat, embeddings, models, tokenizer extras, health, metrics."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from pyllama_moe.chat.vision import image_urls, inline_images
from pyllama_moe.errors import ContextLengthError
from pyllama_moe.server import limits, sse
from pyllama_moe.server.model import ModelNotServedError, ModelPool, QueueFullError, ServedModel
from pyllama_moe.server.settings import ModelSettings, ServerSettings


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")  # OpenAI clients send fields we do not use

    model: str | None = None
    n: int = Field(default=1, ge=1, le=1, description="one choice per request")
    user: str | None = None


class _Sampling(_Request):
    """What completions and chat share (their defaults differ in temperature and max_tokens)."""

    top_p: float = 0.95
    min_p: float = 0.05
    typical_p: float = 1.0
    top_k: int = 40
    stop: str | list[str] | None = None
    stream: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repeat_penalty: float = 1.1
    seed: int | None = None
    logit_bias: dict[str, float] | None = None
    grammar: str | None = None


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] = ""
    suffix: str | None = None
    max_tokens: int | None = Field(default=16, ge=0)
    temperature: float = 0.8
    logprobs: int | None = Field(default=None, ge=0)
    echo: bool = False
    best_of: int = Field(default=1, ge=1, le=1, description="one completion per request")


class ChatRequest(_Sampling):
    messages: list[dict[str, Any]] = Field(min_length=1)
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_tokens: int | None = Field(default=None, ge=0)
    temperature: float = 0.2
    logprobs: bool | None = None
    top_logprobs: int | None = None
    response_format: dict[str, Any] | None = None


class EmbeddingRequest(_Request):
    input: str | list[str]


class TokenizeRequest(_Request):
    input: str


class DetokenizeRequest(_Request):
    tokens: list[int]


def _error(status: int, message: str, kind: str = "invalid_request_error", code: str | None = None,
           param: str | None = None) -> JSONResponse:
    """OpenAI's error object: ``message``, ``type``, ``param`` and ``code`` (a string where OpenAI has one)."""
    return JSONResponse(status_code=status,
                        content={"error": {"message": message, "type": kind, "param": param, "code": code}})


def _error_of(e: BaseException, param: str | None = None) -> JSONResponse:
    """The OpenAI-shaped error for an exception of a request: a bad value is the client's (400), the rest ours."""
    if isinstance(e, ContextLengthError):  # OpenAI's (and llama-cpp-python's) wording and code
        return _error(400, f"This model's maximum context length is {e.n_ctx} tokens. However, you requested "
                           f"{'at least ' if e.at_least else ''}{e.n_requested} tokens. Please reduce the length "
                           f"of the {param or 'prompt'}.",
                      code="context_length_exceeded", param=param)
    if isinstance(e, PermissionError):
        return _error(401, str(e), "authentication_error")
    if isinstance(e, ModelNotServedError):
        return _error(404, str(e).strip("'\""), "invalid_request_error", code="model_not_found", param="model")
    if isinstance(e, QueueFullError):  # OpenAI's rate limit answer: clients retry it later
        return _error(429, str(e), "requests", code="rate_limit_exceeded")
    if isinstance(e, limits.RequestLimitError):
        return _error(400, str(e), param=e.param)
    if isinstance(e, ValueError):
        return _error(400, str(e))
    if isinstance(e, RecursionError):  # a body nested deeper than Python's json reads
        return _error(400, "the request is nested too deeply")
    return _error(500, f"{type(e).__name__}: {e}", "server_error")


def _bias(bias: dict[str, float] | None) -> dict[int, float] | None:
    if bias is None:
        return None
    try:
        return {int(k): v for k, v in bias.items()}
    except ValueError:
        raise ValueError("logit_bias keys must be token ids") from None


def _completion_args(body: CompletionRequest) -> dict[str, Any]:
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        if len(prompt) != 1:
            raise ValueError("one prompt per request")
        prompt = prompt[0]
    # the model named in the request goes through, as llama-cpp-python's server passes it: the response's ``model``
    # is that name, or the model's path when the request names none
    args = body.model_dump(exclude={"n", "best_of", "user", "prompt", "logit_bias", "grammar"}, exclude_none=True)
    args["logit_bias"] = _bias(body.logit_bias)
    if body.grammar is not None:
        args["grammar"] = body.grammar
    return {"prompt": prompt, **args}


def _chat_args(body: ChatRequest) -> dict[str, Any]:
    args = body.model_dump(exclude={"n", "user", "logit_bias"}, exclude_none=True)
    args["logit_bias"] = _bias(body.logit_bias)
    return args


def _slot_metrics(m: ServedModel, label: str, cache: Any) -> list[str]:
    """Slots busy, the queue, and with parallel slots their aggregate and per-request speed, the time to the first
    token and the MoE cache's hit rate since the last read of ``/metrics`` (``cache``: its counts now, or None)."""
    info = m.slot_info()
    lines = [f"pyllama_moe_slots_total{label} {info['n_parallel']}",
             f"pyllama_moe_slots_busy{label} {info['slots_busy']}",
             f"pyllama_moe_queue_length{label} {info['queued']}",
             f"pyllama_moe_requests_in_flight{label} {m.in_flight}"]
    slots = getattr(m.llama, "slots", None) if m.parallel else None
    if slots is None:
        return lines
    s = slots.stats
    lines += [
        f"pyllama_moe_steps_total{label} {s.steps}",
        f"pyllama_moe_step_seconds_total{label} {s.busy_seconds:.6f}",
        f"pyllama_moe_aggregate_tokens_per_second{label} "
        f"{s.tokens_generated / s.busy_seconds if s.busy_seconds else 0:.3f}",
        f"pyllama_moe_slot_requests_total{label} {s.requests}",
        f"pyllama_moe_request_tokens_per_second_mean{label} {s.request_tps_sum / s.requests if s.requests else 0:.3f}",
        f"pyllama_moe_request_tokens_per_second_last{label} {s.last_request_tps:.3f}",
        f"pyllama_moe_time_to_first_token_seconds_mean{label} "
        f"{s.ttft_seconds_sum / s.requests if s.requests else 0:.6f}",
    ]
    rate = m.moe_hit_rate_since_read(cache)
    if rate is not None:
        lines.append(f"pyllama_moe_moe_cache_step_hit_rate{label} {rate:.4f}")
    return lines


def _moe_cache_metrics(label: str, cache: Any) -> list[str]:
    """The MoE cache's counts since the start (``cache``: ``moe_cache_stats()``, None without a cache): the hit rate
    over every lookup path, and the hybrid decode's (``moe_hybrid``) experts computed on the CPU instead of uploaded
    and the CPU's busy time in them (both 0 with the hybrid off)."""
    if cache is None:
        return []
    lines = []
    hits, misses = cache.hits("small", "large", "device")
    if hits + misses:
        lines.append(f"pyllama_moe_moe_cache_hit_rate{label} {hits / (hits + misses):.4f}")
    lines += [f"pyllama_moe_moe_cache_host_experts_total{label} {cache.n_host}",
              f"pyllama_moe_moe_cache_host_busy_seconds_total{label} {cache.host_busy_us / 1e6:.6f}"]
    return lines


def create_app(server: ServerSettings, models: list[ModelSettings],
               factory: Callable[..., Any] | None = None) -> FastAPI:
    """The app; the models are loaded here (a model that fails to load fails the start)."""
    pool = ModelPool(models, factory)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        pool.close()

    async def authorize(request: Request) -> None:
        if server.api_key is None:
            return
        got = request.headers.get("authorization", "")
        if not secrets.compare_digest(got.encode(), f"Bearer {server.api_key}".encode()):
            raise PermissionError("missing or wrong API key (Authorization: Bearer <key>)")

    app = FastAPI(title="pyllama-moe", lifespan=lifespan, dependencies=[Depends(authorize)])
    app.state.pool = pool

    @app.exception_handler(Exception)
    async def _failed(_: Request, e: Exception) -> JSONResponse:
        return _error_of(e)

    for handled in (ValueError, LookupError, PermissionError, QueueFullError):
        # answered by the app's own handler, not Starlette's last-resort one, which re-raises to the server
        # after answering (a logged traceback, the keep-alive connection closed)
        @app.exception_handler(handled)
        async def _client_error(request: Request, e: Exception) -> JSONResponse:
            return _error_of(e, "messages" if request.url.path.endswith("/chat/completions") else "prompt")

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, e: StarletteHTTPException) -> JSONResponse:
        # unknown endpoints and methods, undecodable bodies: the same shape as every other error
        kind = {401: "authentication_error", 404: "not_found_error"}.get(e.status_code, "invalid_request_error")
        return _error(e.status_code, str(e.detail), kind)

    @app.middleware("http")
    async def _limit_body(request: Request, call_next: Callable[[Request], Any]) -> Any:
        size = request.headers.get("content-length")
        if size is not None and (not size.isdigit() or int(size) > server.max_request_bytes):
            return _error(413, f"the request body is larger than {server.max_request_bytes} bytes "
                               "(max_request_bytes)")
        return await call_next(request)

    @app.exception_handler(RequestValidationError)
    async def _bad_request(_: Request, e: RequestValidationError) -> JSONResponse:
        parts = [f"{'.'.join(str(x) for x in err.get('loc', ()))}: {err.get('msg')}" for err in e.errors()]
        return _error(400, "; ".join(parts) or "malformed request")

    async def call(model: ServedModel, fn: Callable[[Any], Any]) -> Any:
        if server.interrupt_requests and not model.parallel:  # slots run side by side: nothing to interrupt
            model.stop.set()
        return await anyio.to_thread.run_sync(model.run, fn)

    async def stream(model: ServedModel, make: Callable[[Any], Iterator[dict[str, Any]]],
                     done: Callable[[], None]) -> Any:
        if server.interrupt_requests and not model.parallel:
            model.stop.set()
        return await sse.stream(model, make, _error_of, done)

    async def generate(model: ServedModel, make: Callable[[Any], Any], streaming: bool) -> Any:
        release = model.admit()  # QueueFullError (429) past n_parallel + max_queue
        try:
            if streaming:
                # released when the stream's generator ends
                return await stream(model, make, release)
            result = await call(model, make)
        finally:
            if not streaming:
                release()
        model.count(result.get("usage"))
        return result

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest) -> Any:
        model = pool.get(body.model)
        # before the request waits for its model (a grammar's check can take a few milliseconds: off the loop)
        await anyio.to_thread.run_sync(limits.check_completion, body, model.n_ctx, server)
        args = _completion_args(body)
        return await generate(model, lambda llama: llama.create_completion(**args), body.stream)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest) -> Any:
        if len(body.messages) > server.max_messages:
            raise ValueError(f"more than {server.max_messages} messages (max_messages)")
        model = pool.get(body.model)
        if image_urls(body.messages, None):
            if model.settings.clip_model_path is None:
                raise ValueError(f"model {model.settings.alias!r} was started without clip_model_path: it cannot "
                                 "read the image_url parts of the messages")
            # read and checked before the request waits for its model: a slow URL does not hold it
            body.messages = await anyio.to_thread.run_sync(
                lambda: inline_images(body.messages, local_files=False, max_bytes=server.max_request_bytes))
        await anyio.to_thread.run_sync(limits.check_chat, body, model.n_ctx, server)
        args = _chat_args(body)
        return await generate(model, lambda llama: llama.create_chat_completion(**args), body.stream)

    @app.post("/v1/embeddings")
    async def embeddings(body: EmbeddingRequest) -> Any:
        model = pool.get(body.model)
        if not model.settings.embedding:
            raise ValueError(f"model {model.settings.alias!r} was not started with embedding=True: "
                             "it has no embeddings")
        return await call(model, lambda llama: llama.create_embedding(body.input, model=body.model))

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": [
            {"id": alias, "object": "model", "owned_by": "me", "permissions": [], "meta": m.slot_info()}
            for alias, m in pool.models.items()]}

    async def tokens(body: TokenizeRequest) -> list[int]:
        return await call(pool.get(body.model), lambda llama: llama.tokenize(body.input.encode(), special=True))

    @app.post("/extras/tokenize")
    async def tokenize(body: TokenizeRequest) -> dict[str, Any]:
        return {"tokens": await tokens(body)}

    @app.post("/extras/tokenize/count")
    async def tokenize_count(body: TokenizeRequest) -> dict[str, Any]:
        return {"count": len(await tokens(body))}

    @app.post("/extras/detokenize")
    async def detokenize(body: DetokenizeRequest) -> dict[str, Any]:
        model = pool.get(body.model)
        text = await call(model, lambda llama: llama.detokenize(body.tokens))
        return {"text": text.decode("utf-8", errors="ignore")}

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "models": list(pool.models),
                "slots": {alias: m.slot_info() for alias, m in pool.models.items()}}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        lines = []
        for alias, m in pool.models.items():
            s, label = m.stats, f'{{model="{alias}"}}'
            slots = getattr(m.llama, "slots", None) if m.parallel else None
            busy = slots.stats.busy_seconds if slots is not None else s.busy_seconds  # the steps, with slots
            lines += [
                f"pyllama_moe_requests_total{label} {s.requests}",
                f"pyllama_moe_prompt_tokens_total{label} {s.prompt_tokens}",
                f"pyllama_moe_completion_tokens_total{label} {s.completion_tokens}",
                f"pyllama_moe_busy_seconds_total{label} {busy:.6f}",
                f"pyllama_moe_tokens_per_second{label} {s.completion_tokens / busy if busy else 0:.3f}",
            ]
            stats = getattr(m.llama, "moe_cache_stats", None)
            cache = stats() if callable(stats) else None
            lines += _slot_metrics(m, label, cache)
            lines += _moe_cache_metrics(label, cache)
        return PlainTextResponse("\n".join(lines) + "\n")

    return app
