"""``Batch``: owns one ``llama_batch`` (``llama_batch_init`` / ``llama_batch_free``) for one sequence.

Its arrays are also numpy views, so filling a prompt is a few slice assignments and a one-token
step writes three numbers: no call into the library.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from pyllama_moe.errors import check_closed
from pyllama_moe.ffi import ffi, lib


class Batch:
    def __init__(self, capacity: int, n_seq_max: int = 1) -> None:
        self._p: Any = None
        if capacity < 1:
            raise ValueError(f"n_batch must be >= 1, got {capacity}")
        self.capacity = capacity
        self._p = ffi.new("struct llama_batch *", lib.llama_batch_init(capacity, 0, n_seq_max))
        p = self._p
        self.token = np.frombuffer(ffi.buffer(p.token, 4 * capacity), dtype=np.int32)
        self.pos = np.frombuffer(ffi.buffer(p.pos, 4 * capacity), dtype=np.int32)
        self.logits = np.frombuffer(ffi.buffer(p.logits, capacity), dtype=np.int8)
        np.frombuffer(ffi.buffer(p.n_seq_id, 4 * capacity), dtype=np.int32)[:] = 1
        self.set_seq(0)

    @property
    def value(self) -> Any:
        """The ``struct llama_batch`` to pass to ``llama_decode``."""
        return check_closed(self._p, "batch")[0]

    def set_seq(self, seq_id: int) -> None:
        """Every token of the batch in sequence ``seq_id``."""
        p = check_closed(self._p, "batch")
        for i in range(self.capacity):
            p.seq_id[i][0] = seq_id

    def set_tokens(self, tokens: Sequence[int] | np.ndarray, pos0: int, all_logits: bool,
                   last_logits: bool = True) -> None:
        """``tokens`` at positions ``pos0...``; outputs for all of them, only the last, or (``last_logits=False``)
        none."""
        check_closed(self._p, "batch")
        n = len(tokens)
        if not 0 < n <= self.capacity:
            raise ValueError(f"a batch holds 1..{self.capacity} tokens, got {n}")
        self.token[:n] = tokens
        self.pos[:n] = np.arange(pos0, pos0 + n, dtype=np.int32)
        self.logits[:n] = 1 if all_logits else 0
        self.logits[n - 1] = 1 if all_logits or last_logits else 0
        self._p.n_tokens = n

    def set_one(self, token: int, pos: int) -> None:
        """One token with its output: the generation step."""
        p = check_closed(self._p, "batch")
        p.n_tokens = 1
        p.token[0] = token
        p.pos[0] = pos
        p.logits[0] = 1

    def set_entries(self, tokens: Sequence[int], pos: Sequence[int], seq_id: Sequence[int],
                    logits: Sequence[bool]) -> None:
        """Tokens of several sequences, named as ``llama_batch``'s fields: token ``i`` at position ``pos[i]`` of
        sequence ``seq_id[i]``, with an output where ``logits[i]`` (the parallel slots' step)."""
        p = check_closed(self._p, "batch")
        n = len(tokens)
        if not 0 < n <= self.capacity:
            raise ValueError(f"a batch holds 1..{self.capacity} tokens, got {n}")
        self.token[:n] = tokens
        self.pos[:n] = pos
        self.logits[:n] = logits
        for i, s in enumerate(seq_id):
            p.seq_id[i][0] = s
        p.n_tokens = n

    def close(self) -> None:
        p, self._p = self._p, None
        if p is not None:
            # views of memory about to be freed
            self.token, self.pos, self.logits = np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0, np.int8)
            lib.llama_batch_free(p[0])

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001  # pragma: no cover - interpreter shutdown
            pass
