"""``Context``: owns one ``llama_context *``: decode, logits, embeddings, memory (KV) and state."""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from pyllama_moe import backend
from pyllama_moe.batch import Batch
from pyllama_moe.errors import (
    ContextError,
    ContextSizeError,
    LlamaError,
    check_closed,
    check_decode,
    check_ptr,
    check_size,
    check_true,
    native_mark,
)
from pyllama_moe.ffi import ffi, lib
from pyllama_moe.model import Model
from pyllama_moe.moe import MoeCacheStats, available_memory
from pyllama_moe.params import ContextParams, check_threads


def check_kv_memory(model: Model, params: ContextParams, kv_cell: int) -> None:
    """Refuse an ``n_ctx`` whose KV cache is larger than the memory there is (the host's available memory and the
    GPUs' free memory), before llama.cpp tries: ``n_ctx=10**9`` took seconds and gigabytes to end in
    ``std::bad_alloc``. The cache is ``n_ctx`` cells of ``Model.kv_bytes_per_cell`` (the compute buffers are not
    counted; ``kv_cell``: the context's); models where that is no lower bound are left to llama.cpp."""
    if model.is_hybrid() or lib.llama_model_n_swa(model.ptr) > 0 or \
            f"{model.arch()}.attention.kv_lora_rank" in model.metadata():
        return  # only some layers' cells, a window's, or compressed rows: the estimate is no lower bound there
    p = params.ptr
    n_ctx = int(p.n_ctx) or model.n_ctx_train()
    need = n_ctx * kv_cell
    avail = available_memory()
    if avail is None or need <= avail:
        return
    avail += sum(d.memory_free for d in backend.devices() if d.type == "gpu")
    if need > avail:
        raise ContextSizeError(f"n_ctx={n_ctx} needs a KV cache of {need} bytes ({need >> 20} MiB), more than the "
                               f"{avail} bytes ({avail >> 20} MiB) of memory available: lower n_ctx (or use a "
                               "quantized type_k / type_v)")


class Context:
    def __init__(self, model: Model, params: ContextParams, *, verbose: bool = True) -> None:
        self._ptr: Any = None
        self._mem: Any = None
        self._abort: Any = None
        self.model = model  # freed after this context
        # what a state of this context may hold, read once (load_state checks every state against them)
        self._kv_cell = model.kv_bytes_per_cell(int(params.ptr.type_k), int(params.ptr.type_v))
        self._arch = model.arch().encode()
        self.verbose = verbose
        check_kv_memory(model, params, self._kv_cell)
        mark = native_mark()
        with backend.verbosity(verbose):
            ptr = lib.llama_init_from_model(model.ptr, params.ptr[0])
        self._ptr = check_ptr(ptr, ContextError, "cannot create the context", since=mark)
        self._mem = lib.llama_get_memory(ptr)
        self.n_vocab = model.vocab.n_tokens
        self.n_embd = model.n_embd()

    @property
    def ptr(self) -> Any:
        return check_closed(self._ptr, "context")

    @property
    def ctx(self) -> Any:
        """llama-cpp-python's ``LlamaContext.ctx``: the pointer, None once closed."""
        return self._ptr

    def close(self) -> None:
        ptr, self._ptr = self._ptr, None
        self._mem = None  # the context's memory goes with it
        if ptr is not None:
            with backend.verbosity(self.verbose):
                lib.llama_free(ptr)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001  # pragma: no cover - interpreter shutdown
            pass

    # sizes
    def n_ctx(self) -> int:
        return int(lib.llama_n_ctx(self.ptr))

    def n_ctx_seq(self) -> int:
        """The cells of one sequence: ``n_ctx`` split by ``n_seq_max`` (the KV cache is not unified)."""
        return int(lib.llama_n_ctx_seq(self.ptr))

    def n_batch(self) -> int:
        return int(lib.llama_n_batch(self.ptr))

    def n_ubatch(self) -> int:
        return int(lib.llama_n_ubatch(self.ptr))

    def n_seq_max(self) -> int:
        return int(lib.llama_n_seq_max(self.ptr))

    def pooling_type(self) -> int:
        return int(lib.llama_pooling_type(self.ptr))

    def set_n_threads(self, n_threads: int, n_threads_batch: int) -> None:
        lib.llama_set_n_threads(self.ptr, check_threads("n_threads", n_threads),
                                check_threads("n_threads_batch", n_threads_batch))

    # compute
    def decode(self, batch: Batch) -> None:
        check_decode(lib.llama_decode(self.ptr, batch.value))

    def logits_ith(self, i: int = -1) -> np.ndarray:
        """A copy of one output's logits (n_vocab floats)."""
        p = check_ptr(lib.llama_get_logits_ith(self.ptr, i), LlamaError, f"no logits for output {i}")
        return np.frombuffer(ffi.buffer(p, 4 * self.n_vocab), dtype=np.float32).copy()

    def logits_rows(self, n: int) -> np.ndarray:
        """A copy of the logits of the last decode's ``n`` outputs, in batch order (n x n_vocab)."""
        p = check_ptr(lib.llama_get_logits(self.ptr), LlamaError, "no logits")
        return np.frombuffer(ffi.buffer(p, 4 * self.n_vocab * n), dtype=np.float32).reshape(n, self.n_vocab).copy()

    def logits_view(self, n: int) -> np.ndarray:
        """The logits of the last decode's ``n`` outputs, in batch order (n x n_vocab): the context's own buffer, not
        a copy, valid until the next decode (the parallel slots read each output's row in place; never write it)."""
        p = check_ptr(lib.llama_get_logits(self.ptr), LlamaError, "no logits")
        return np.frombuffer(ffi.buffer(p, 4 * self.n_vocab * n), dtype=np.float32).reshape(n, self.n_vocab)

    def embeddings_ith(self, i: int) -> np.ndarray:
        p = check_ptr(lib.llama_get_embeddings_ith(self.ptr, i), LlamaError,
                      f"no embeddings for output {i} (create the Llama with embedding=True)")
        return np.frombuffer(ffi.buffer(p, 4 * self.n_embd), dtype=np.float32).copy()

    def embeddings_seq(self, seq_id: int) -> np.ndarray:
        p = check_ptr(lib.llama_get_embeddings_seq(self.ptr, seq_id), LlamaError,
                      f"no pooled embeddings for sequence {seq_id} (pooling_type is none?)")
        return np.frombuffer(ffi.buffer(p, 4 * self.n_embd), dtype=np.float32).copy()

    # memory (the KV cache): llama_memory_*
    @property
    def memory(self) -> Any:
        """The context's ``llama_memory_t`` (owned by the context): raises once the context is closed."""
        return check_closed(self._mem, "context")

    def memory_clear(self, data: bool = True) -> None:
        lib.llama_memory_clear(self.memory, data)

    def seq_rm(self, seq_id: int, p0: int, p1: int) -> bool:
        return bool(lib.llama_memory_seq_rm(self.memory, seq_id, p0, p1))

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        lib.llama_memory_seq_cp(self.memory, src, dst, p0, p1)

    def seq_keep(self, seq_id: int) -> None:
        lib.llama_memory_seq_keep(self.memory, seq_id)

    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        lib.llama_memory_seq_add(self.memory, seq_id, p0, p1, delta)

    def seq_pos_max(self, seq_id: int = 0) -> int:
        return int(lib.llama_memory_seq_pos_max(self.memory, seq_id))

    # state
    def state_get(self) -> bytes:
        size = lib.llama_state_get_size(self.ptr)
        buf = ffi.new("uint8_t[]", size)
        n = lib.llama_state_get_data(self.ptr, buf, size)
        if n > size:
            check_size(n, size, "llama_state_get_data")
        return ffi.buffer(buf, n)[:]

    def state_max_size(self) -> int | None:
        """More bytes than any state of this context can take: what it writes now, plus every cell of every stream
        full (its keys and values, estimated twice over, and the cell's position and sequence ids), plus each layer's
        row headers (types and sizes). A larger state is none of this context's. None for a model with recurrent
        layers, whose states (written only for the cells in use) are not counted here."""
        if self.model.is_recurrent() or self.model.is_hybrid():
            return None
        per_cell = 2 * self._kv_cell + 8 + 4 * self.n_seq_max()
        return int(lib.llama_state_get_size(self.ptr)) + self.n_ctx() * per_cell + 64 * self.model.n_layer() + 4096

    def check_state(self, data: bytes) -> None:
        """What llama.cpp would read first, checked before it reads it (a length read from a broken state made it
        allocate 4 GiB before it found the buffer too short): the size, the architecture's name, the KV cache's
        stream and cell counts. A ValueError names the field."""
        limit = self.state_max_size()
        if limit is not None and len(data) > limit:
            raise ValueError(f"load_state: llama_state is {len(data)} bytes, more than any state of this context "
                             f"(at most {limit}: n_ctx {self.n_ctx()})")
        arch = self._arch
        (n,) = struct.unpack_from("<I", data) if len(data) >= 4 else (-1,)
        if n != len(arch) or data[4:4 + n] != arch:
            got = repr(data[4:4 + n]) if 0 <= n <= 64 else f"a name of {n} bytes"
            raise ValueError(f"load_state: the state's architecture is {got}, this model's is {arch!r} (the "
                             "state is not one of this model's, or it is corrupt)")
        if self.model.is_recurrent():  # a recurrent model's memory writes no stream count first
            return
        head = 4 + n
        if len(data) < head + 8:
            raise ValueError(f"load_state: llama_state ends after {len(data)} bytes, in its KV cache's header")
        n_stream, n_cells = struct.unpack_from("<II", data, head)
        if not 1 <= n_stream <= self.n_seq_max():
            raise ValueError(f"load_state: the state's KV cache has n_stream {n_stream}, this context "
                             f"1..{self.n_seq_max()} (n_seq_max)")
        if n_cells > self.n_ctx():
            raise ValueError(f"load_state: the state's KV cache holds {n_cells} cells (cell_count), more than "
                             f"n_ctx {self.n_ctx()}")

    def state_set(self, data: bytes) -> None:
        self.check_state(data)
        mark = native_mark()  # llama.cpp logs why it refused a state ("error loading state: ...")
        n = lib.llama_state_set_data(self.ptr, data, len(data))
        if 0 < n < len(data):  # read whole, with bytes to spare: not what save_state wrote
            raise LlamaError(f"load_state: llama_state has {len(data) - n} bytes past the end of the state "
                             f"llama.cpp read ({n} bytes)")
        check_size(n, len(data), f"load_state: llama.cpp read {n} of the state's {len(data)} bytes and refused it",
                   since=mark)

    def state_save_file(self, path: str | os.PathLike[str], tokens: Sequence[int]) -> None:
        arr = ffi.new("llama_token[]", list(tokens))
        mark = native_mark()
        check_true(lib.llama_state_save_file(self.ptr, os.fsencode(path), arr, len(tokens)), LlamaError,
                   f"cannot save the state to {os.fspath(path)}", since=mark)

    def state_load_file(self, path: str | os.PathLike[str], capacity: int) -> list[int]:
        arr = ffi.new("llama_token[]", capacity)
        count = ffi.new("size_t *")
        mark = native_mark()
        check_true(lib.llama_state_load_file(self.ptr, os.fsencode(path), arr, capacity, count), LlamaError,
                   f"cannot load the state from {os.fspath(path)}", since=mark)
        return list(ffi.unpack(arr, count[0]))

    # timings
    def perf(self) -> dict[str, float]:
        d = lib.llama_perf_context(self.ptr)
        return {k: getattr(d, k) for k in ("t_start_ms", "t_load_ms", "t_p_eval_ms", "t_eval_ms", "n_p_eval", "n_eval")}

    def perf_reset(self) -> None:
        lib.llama_perf_context_reset(self.ptr)

    def moe_cache_held(self, n_layer: int, n_expert: int) -> np.ndarray | None:
        """``[n_layer, n_expert]`` of 0 and 1: the experts the MoE cache holds now (after the work in flight); None
        without a cache or for another expert count."""
        out = np.zeros((n_layer, n_expert), dtype=np.uint8)
        ok = lib.llama_moe_cache_get_held(self.ptr, ffi.from_buffer("uint8_t[]", out), n_layer, n_expert)
        return out if ok else None

    def moe_cache_fill(self, weights: np.ndarray) -> int | None:
        """Fill the MoE cache with each cached layer's highest-weighted experts (``weights``: ``[n_layer, n_expert]``,
        0 or less: not taken), up to the layer's share of the slots, from host memory: the experts copied in; None
        without a cache or for another expert count."""
        w = np.ascontiguousarray(weights, dtype=np.float32)
        if w.ndim != 2:
            raise ValueError(f"weights must be [n_layer, n_expert], got shape {w.shape}")
        n = int(lib.llama_moe_cache_fill(self.ptr, ffi.from_buffer("float[]", w), w.shape[0], w.shape[1]))
        return None if n < 0 else n

    def moe_cache_stats(self) -> MoeCacheStats | None:
        """The MoE cache's counts, None without a cache (see ``Llama.moe_cache_stats``)."""
        return MoeCacheStats.read(self.ptr)

    def pooled(self) -> bool:
        """Whether embeddings are pooled per sequence (pooling type other than none)."""
        return self.pooling_type() != lib.LLAMA_POOLING_TYPE_NONE

    def set_abort_callback(self, fn: Callable[[], bool] | None) -> None:
        """Called during decode: returning True aborts it (``DecodeError`` code 2). Costs a call
        into Python per graph step, so it is off unless asked for."""
        if fn is None:
            lib.llama_set_abort_callback(self.ptr, ffi.NULL, ffi.NULL)
            self._abort = None
        else:
            self._abort = backend.callback(fn)
            lib.llama_set_abort_callback(self.ptr, lib.pyllama_moe_abort_callback, self._abort.handle)
