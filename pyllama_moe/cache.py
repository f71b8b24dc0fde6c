"""llama-cpp-python's prompt caches (``Llama.set_cache``): saved states looked up by longest token prefix."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

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


class LlamaRAMCache(BaseLlamaCache):
    """States kept in memory, least recently used dropped beyond ``capacity_bytes``."""

    def __init__(self, capacity_bytes: int = 2 << 30) -> None:
        super().__init__(capacity_bytes)
        self.cache_state: OrderedDict[tuple[int, ...], LlamaState] = OrderedDict()

    @property
    def cache_size(self) -> int:
        return sum(state.llama_state_size for state in self.cache_state.values())

    def _find_longest_prefix_key(self, key: tuple[int, ...]) -> tuple[int, ...] | None:
        best, best_len = None, 0
        for k in self.cache_state:
            n = longest_token_prefix(k, key)
            if n > best_len:
                best, best_len = k, n
        return best

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
