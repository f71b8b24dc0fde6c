"""Server-sent events: a generator of chunks run alone on a model's worker thread, streamed to the client."""

from __future__ import annotations

import asyncio
import json
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from fastapi.responses import JSONResponse, StreamingResponse

from pyllama_moe.server.model import ServedModel

_DONE = object()


class _Handoff:
    """Items from the producers' threads to their queues on the event loop, with one wake-up of the loop for all
    those that came since it last ran: with parallel slots every stream gets its token at the end of the same step,
    and a wake-up (and a turn of the loop) per token would take the interpreter from the step that follows."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.lock = threading.Lock()
        self.items: list[tuple[asyncio.Queue[Any], Any]] = []

    def put(self, queue: asyncio.Queue[Any], item: Any) -> None:
        with self.lock:
            self.items.append((queue, item))
            if len(self.items) > 1:  # a wake-up is on its way
                return
        self.loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        with self.lock:
            items, self.items = self.items, []
        for queue, item in items:
            queue.put_nowait(item)


_handoffs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Handoff] = weakref.WeakKeyDictionary()


def _handoff(loop: asyncio.AbstractEventLoop) -> _Handoff:
    """The loop's ``_Handoff`` (called on the loop's thread)."""
    h = _handoffs.get(loop)
    if h is None:
        h = _handoffs[loop] = _Handoff(loop)
    return h


async def stream(model: ServedModel, make: Callable[[Any], Iterator[dict[str, Any]]],
                 error_of: Callable[[BaseException], JSONResponse], done: Callable[[], None] | None = None) -> Any:
    """The chunks of ``make(llama)`` as events; a gone client stops the generator (with parallel slots: its slot is
    free at the next step). A request that fails before its first chunk (a bad value) gets ``error_of``'s response,
    not a stream; a failure after it ends the stream with an error event and [DONE]. ``done`` is called when the
    generator has ended."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Any] = asyncio.Queue()
    gone = threading.Event()
    handoff = _handoff(loop)

    def produce(llama: Any) -> None:
        it: Any = None
        n_chunks, usage = 0, None
        try:
            it = iter(make(llama))
            while True:
                try:
                    chunk = next(it)
                except StopIteration as end:  # a completion's stream returns its usage
                    usage = end.value
                    break
                handoff.put(queue, chunk)
                n_chunks += 1
                if gone.is_set() or model.stop.is_set():
                    break
        except Exception as e:  # noqa: BLE001 - reported to the client as an SSE error event
            handoff.put(queue, e)
        finally:
            # the tokens by the stream's usage; a stream that ended early (or a handler's that returns none) counts
            # its chunks, nearly a token each
            if isinstance(usage, dict):
                model.stats.prompt_tokens += int(usage.get("prompt_tokens", 0))
                model.stats.completion_tokens += int(usage.get("completion_tokens", 0))
            else:
                model.stats.completion_tokens += n_chunks
            close = getattr(it, "close", None)
            if close is not None:
                try:
                    close()
                except Exception:  # noqa: BLE001 - the stream is over either way
                    pass
            model.stats.requests += 1
            if done is not None:
                done()
            handoff.put(queue, _DONE)

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
