"""Server-sent events: a generator of chunks run alone on a model's worker thread, streamed to the client."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from fastapi.responses import JSONResponse, StreamingResponse

from pyllama_moe.server.model import ServedModel

_DONE = object()


async def stream(model: ServedModel, make: Callable[[Any], Iterator[dict[str, Any]]],
                 error_of: Callable[[BaseException], JSONResponse], done: Callable[[], None] | None = None) -> Any:
    """The chunks of ``make(llama)`` as events; a gone client stops the generator (with parallel slots: its slot is
    free at the next step). A request that fails before its first chunk (a bad value) gets ``error_of``'s response,
    not a stream; a failure after it ends the stream with an error event and [DONE]. ``done`` is called when the
    generator has ended."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Any] = asyncio.Queue()
    gone = threading.Event()

    def produce(llama: Any) -> None:
        it: Any = None
        try:
            it = make(llama)
            for chunk in it:
                loop.call_soon_threadsafe(queue.put_nowait, chunk)
                model.stats.completion_tokens += 1
                if gone.is_set() or model.stop.is_set():
                    break
        except Exception as e:  # noqa: BLE001 - reported to the client as an SSE error event
            loop.call_soon_threadsafe(queue.put_nowait, e)
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                try:
                    close()
                except Exception:  # noqa: BLE001 - the stream is over either way
                    pass
            model.stats.requests += 1
            if done is not None:
                done()
            loop.call_soon_threadsafe(queue.put_nowait, _DONE)

    worker = loop.run_in_executor(model.executor, model.run, produce)
    first = await queue.get()
    if isinstance(first, Exception):
        await queue.get()  # _DONE
        await worker
        return error_of(first)

    async def events() -> AsyncIterator[str]:
        item = first
        try:
            while item is not _DONE:
                if isinstance(item, Exception):
                    error = error_of(item).body
                    yield f"data: {bytes(error).decode()}\n\n"
                    break
                yield f"data: {json.dumps(item)}\n\n"
                item = await queue.get()
            yield "data: [DONE]\n\n"
        finally:
            gone.set()
            await asyncio.shield(worker)

    return StreamingResponse(events(), media_type="text/event-stream")
