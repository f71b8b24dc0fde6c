"""llama-cpp-python's prompt caches (``Llama.set_cache``): saved states looked up by longest token prefix."""

from __future__ import annotations

import hashlib
import os
import pickle
import tempfile
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from pathlib import Path

from pyllama_moe.llama_types import LlamaState


def longest_token_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class BaseLlamaCache:
    """A mapping from token sequences to ``LlamaState``; a lookup returns the longest-prefix entry."""

    def __init__(self, capacity_bytes: int = 2 << 30) -> None:
        self.capacity_bytes = capacity_bytes

    @property
    def cache_size(self) -> int:
        raise NotImplementedError

    def __getitem__(self, key: Sequence[int]) -> LlamaState:
        raise NotImplementedError

    def __contains__(self, key: Sequence[int]) -> bool:
        raise NotImplementedError

    def __setitem__(self, key: Sequence[int], value: LlamaState) -> None:
        raise NotImplementedError


def _longest_prefix_key(keys: Iterable[tuple[int, ...]], key: tuple[int, ...]) -> tuple[int, ...] | None:
    """The key sharing the longest (non-empty) prefix with ``key``; None if none shares a token."""
    best, best_len = None, 0
    for k in keys:
        n = longest_token_prefix(k, key)
        if n > best_len:
            best, best_len = k, n
    return best


class LlamaRAMCache(BaseLlamaCache):
    """States kept in memory, least recently used dropped beyond ``capacity_bytes``."""

    def __init__(self, capacity_bytes: int = 2 << 30) -> None:
        super().__init__(capacity_bytes)
        self.cache_state: OrderedDict[tuple[int, ...], LlamaState] = OrderedDict()

    @property
    def cache_size(self) -> int:
        return sum(state.llama_state_size for state in self.cache_state.values())

    def _find_longest_prefix_key(self, key: tuple[int, ...]) -> tuple[int, ...] | None:
        return _longest_prefix_key(self.cache_state, key)

    def __getitem__(self, key: Sequence[int]) -> LlamaState:
        found = self._find_longest_prefix_key(tuple(key))
        if found is None:
            raise KeyError("Key not found")
        self.cache_state.move_to_end(found)
        return self.cache_state[found]

    def __contains__(self, key: Sequence[int]) -> bool:
        return self._find_longest_prefix_key(tuple(key)) is not None

    def __setitem__(self, key: Sequence[int], value: LlamaState) -> None:
        key = tuple(key)
        self.cache_state.pop(key, None)
        self.cache_state[key] = value
        while self.cache_size > self.capacity_bytes and len(self.cache_state) > 0:
            self.cache_state.popitem(last=False)


LlamaCache = LlamaRAMCache  # llama-cpp-python's alias


class LlamaDiskCache(BaseLlamaCache):
    """States pickled in the folder ``cache_dir``, kept across processes; the least recently used files are removed
    beyond ``capacity_bytes``. Each entry is two files named by the hash of its tokens: ``.key`` (the tokens) and
    ``.state``. The files are unpickled: keep the folder where only you can write."""

    def __init__(self, cache_dir: str | os.PathLike[str] = ".cache/llama_cache", capacity_bytes: int = 2 << 30) -> None:
        super().__init__(capacity_bytes)
        self.cache_dir = Path(cache_dir)
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self._keys: dict[tuple[int, ...], Path] = {}
        for f in self.cache_dir.glob("*.key"):
            try:
                key = tuple(pickle.loads(f.read_bytes()))
            except (OSError, pickle.UnpicklingError, EOFError, TypeError, ValueError):
                continue  # a file being written or not ours
            if f.with_suffix(".state").is_file():
                self._keys[key] = f.with_suffix(".state")

    @property
    def cache_size(self) -> int:
        return sum(p.stat().st_size for p in self._keys.values() if p.exists())

    def _path(self, key: tuple[int, ...]) -> Path:
        return self.cache_dir / hashlib.sha256(repr(key).encode()).hexdigest()[:32]

    def __getitem__(self, key: Sequence[int]) -> LlamaState:
        found = _longest_prefix_key(self._keys, tuple(key))
        if found is None:
            raise KeyError("Key not found")
        path = self._keys[found]
        try:
            state = pickle.loads(path.read_bytes())
        except (OSError, pickle.UnpicklingError, EOFError) as e:  # removed or cut by another process
            self._keys.pop(found, None)
            raise KeyError(f"cached state {path} cannot be read: {e}") from None
        os.utime(path)  # recently used
        if not isinstance(state, LlamaState):
            raise KeyError(f"{path} does not hold a LlamaState")
        return state

    def __contains__(self, key: Sequence[int]) -> bool:
        return _longest_prefix_key(self._keys, tuple(key)) is not None

    def __setitem__(self, key: Sequence[int], value: LlamaState) -> None:
        key = tuple(int(t) for t in key)
        base = self._path(key)
        for suffix, data in ((".state", pickle.dumps(value)), (".key", pickle.dumps(key))):
            fd, tmp = tempfile.mkstemp(dir=self.cache_dir, suffix=".partial")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, base.with_suffix(suffix))  # readers see a whole file or none
        self._keys[key] = base.with_suffix(".state")
        stats = {k: p.stat() for k, p in self._keys.items() if p.exists()}  # one stat per file for this store
        size = sum(st.st_size for st in stats.values())
        for old, st in sorted(stats.items(), key=lambda kv: kv[1].st_mtime):  # the least recently used first
            if size <= self.capacity_bytes:
                break
            path = self._keys.pop(old)
            path.unlink(missing_ok=True)
            path.with_suffix(".key").unlink(missing_ok=True)
            size -= st.st_size
