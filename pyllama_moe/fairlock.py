"""``FairRLock``: the Llama's lock, re-entrant like ``threading.RLock``, handed over in the order the threads asked.

A ``threading.RLock`` is not fair: a thread that releases it and asks again at once gets it back before a thread
that was already waiting. The parallel slots' worker does that at every step (each step holds the lock around a
decode that releases the interpreter), so on a GPU a request's ``submit_completion`` waited for the lock until the
steps stopped, that is until every running request had ended: four clients ran two at a time, then one by one
(docs/performance.md, 2026-12-06). Here a thread that asks while others wait goes behind them.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any


class FairRLock:
    """A re-entrant lock granted first come, first served; usable as ``threading.Condition``'s lock."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._owner: int | None = None
        self._count = 0
        self._queue: deque[int] = deque()  # the threads waiting, in the order they asked

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        me = threading.get_ident()
        with self._cond:
            if self._owner == me:
                self._count += 1
                return True
            if self._owner is None and not self._queue:
                self._owner, self._count = me, 1
                return True
            if not blocking:
                return False
            self._queue.append(me)
            if not self._cond.wait_for(lambda: self._owner is None and self._queue[0] == me,
                                       None if timeout < 0 else timeout):
                self._queue.remove(me)
                self._cond.notify_all()  # the thread behind it may be first now
                return False
            self._queue.popleft()
            self._owner, self._count = me, 1
            return True

    def release(self) -> None:
        with self._cond:
            if self._owner != threading.get_ident():
                raise RuntimeError("cannot release a FairRLock this thread does not hold")
            self._count -= 1
            if self._count == 0:
                self._owner = None
                self._cond.notify_all()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()

    # what threading.Condition uses to release the lock whole while it waits, and to take it back as it was
    def _is_owned(self) -> bool:
        return self._owner == threading.get_ident()

    def _release_save(self) -> int:
        with self._cond:
            if self._owner != threading.get_ident():
                raise RuntimeError("cannot wait on a FairRLock this thread does not hold")
            count, self._owner, self._count = self._count, None, 0
            self._cond.notify_all()
            return count

    def _acquire_restore(self, count: int) -> None:
        self.acquire()
        self._count = count
