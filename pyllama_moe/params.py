"""Python <-> C parameters: ``struct llama_model_params`` and ``struct llama_context_params``.

Each builder starts from ``llama_*_default_params()`` and sets only what the caller gave; a bad
value raises ``ValueError`` naming the parameter. The C memory the structs point to (tensor
split, overrides, kv overrides, pattern strings) is kept by the params object: keep it alive as
long as the struct is used (the model load).
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from pyllama_moe.ffi import ffi, lib

# llama_load_mode_from_str aborts the process on an unknown name: names are checked here first
LOAD_MODES = {
    "auto": "auto", "none": "none", "mmap": "mmap", "mlock": "mlock",
    "mmap_mlock": "mmap+mlock", "mmap+mlock": "mmap+mlock", "direct_io": "dio", "dio": "dio",
}
SPLIT_MODES = {"none": 0, "layer": 1, "row": 2, "tensor": 3}
KV_KEY_MAX = 127  # struct llama_model_kv_override: char key[128], char val_str[128]
TOKEN_ID_SUFFIX = "_token_id"  # GGUF keys of special token ids (tokenizer.ggml.bos_token_id, ...)


def check_int(name: str, value: Any, lo: int | None = None, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        bounds = f"{lo if lo is not None else '-inf'}..{hi if hi is not None else 'inf'}"
        raise ValueError(f"{name} must be in {bounds}, got {value}")
    return value


def check_float(name: str, value: Any, lo: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if lo is not None and value < lo:
        raise ValueError(f"{name} must be >= {lo}, got {value}")
    return float(value)


def check_share(value: Any) -> float:
    """``moe_hybrid_share``: a fraction of the misses, 0 to 1."""
    share = check_float("moe_hybrid_share", value, 0.0)
    if share > 1.0:
        raise ValueError(f"moe_hybrid_share must be at most 1, got {share}")
    return share


def check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


_warned: set[str] = set()


def warn_once(key: str, message: str) -> None:
    """A ``UserWarning`` the first time ``key`` is met in this process: a value llama-cpp-python accepts and
    llama.cpp ignores or clamps is kept, but said once, not at every call of a loop."""
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, UserWarning, stacklevel=3)


def warn_outside(name: str, value: float, lo: float, hi: float | None) -> float:
    """A sampling value llama.cpp clamps or ignores outside ``lo..hi``: accepted (as llama-cpp-python does), warned."""
    if value < lo or (hi is not None and value > hi):
        bounds = f"{lo}..{hi}" if hi is not None else f">= {lo}"
        warn_once(name, f"{name}={value} is outside {bounds}: llama.cpp clamps or ignores it")
    return value


def check_max_tokens(value: Any) -> int | None:
    """``max_tokens``: None or <= 0 fill the context (llama-cpp-python's), a finite number is cut to an integer."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"max_tokens must be an integer or None, got {value!r}")
    return int(value)


def check_stop(value: Any) -> list[str]:
    """``stop``: None, a string or a list of strings."""
    stops = [value] if isinstance(value, str) else value if value is None or isinstance(value, (list, tuple)) \
        else None
    if stops is None or not all(isinstance(s, str) for s in stops):
        raise ValueError(f"stop must be a string or a list of strings, got {value!r}")
    return list(stops)


def check_bias(name: str, value: Any) -> float:
    """A logit bias: a finite number, or an infinity (-inf bans a token, +inf forces it)."""
    if isinstance(value, float) and math.isinf(value):
        return value
    return check_float(name, value)


def check_numa(value: Any) -> int:
    """``numa`` as a ``GGML_NUMA_STRATEGY_*``: True distributes, False is off, an int names the strategy."""
    if isinstance(value, bool):
        return int(lib.GGML_NUMA_STRATEGY_DISTRIBUTE if value else lib.GGML_NUMA_STRATEGY_DISABLED)
    if not isinstance(value, int) or not 0 <= value < lib.GGML_NUMA_STRATEGY_COUNT:
        raise ValueError(f"numa must be True, False or a GGML_NUMA_STRATEGY_* value "
                         f"(0..{lib.GGML_NUMA_STRATEGY_COUNT - 1}), got {value!r}")
    return value


def check_rpc_servers(value: Any) -> list[str] | None:
    """``rpc_servers``: None, ``"host:port,host:port"`` or a list of ``"host:port"`` strings."""
    if value is None or value == "" or value == []:
        return None
    names = value.split(",") if isinstance(value, str) else value if isinstance(value, (list, tuple)) else None
    if names is None or not all(isinstance(n, str) and n.strip() for n in names):
        raise ValueError(f"rpc_servers must be a 'host:port,...' string or a list of 'host:port' strings, "
                         f"got {value!r}")
    return [n.strip() for n in names]


def moe_hybrid_mode(value: Any) -> int | None:
    """``moe_hybrid`` as ``enum llama_moe_hybrid``: False off, True on, ``"auto"`` (the context measures whether the
    CPU's share pays); None leaves the library's default (off). Anything else is a ValueError, checked before the
    library is asked, so that ``"on"`` or ``1`` is refused rather than read as true."""
    if value is None:
        return None
    if value is False:
        return int(lib.LLAMA_MOE_HYBRID_OFF)
    if value is True:
        return int(lib.LLAMA_MOE_HYBRID_ON)
    if isinstance(value, str) and value == "auto":
        return int(lib.LLAMA_MOE_HYBRID_AUTO)
    raise ValueError(f"moe_hybrid must be False, True or 'auto', got {value!r}")


def _enum(name: str, value: Any, allowed: Mapping[str, int]) -> int:
    """An enum given by its C value or its name (case-insensitive)."""
    if isinstance(value, str) and value.lower() in allowed:
        return allowed[value.lower()]
    if not isinstance(value, bool) and isinstance(value, int) and value in allowed.values():
        return value
    raise ValueError(f"{name} must be one of {', '.join(allowed)} (or their values), got {value!r}")


def ggml_type(name: str, value: Any) -> int:
    """A ggml type (KV cache ``type_k`` / ``type_v``) by value or name (``"q8_0"``, ``"f16"``)."""
    types = {}
    for t in range(lib.GGML_TYPE_COUNT):
        p = lib.ggml_type_name(t)
        if p != ffi.NULL and lib.ggml_type_size(t) > 0:
            types[ffi.string(p).decode()] = t
    return _enum(name, value, types)


def load_mode(value: str | None, use_mmap: bool, use_mlock: bool) -> int | None:
    """``load_mode`` by name, or llama-cpp-python's ``use_mmap`` / ``use_mlock`` mapped onto it.

    None means the library's default (``auto``: mmap unless a device cannot use it), which is
    what ``use_mmap=True, use_mlock=False`` (llama-cpp-python's defaults) asked for.
    """
    check_bool("use_mmap", use_mmap)
    check_bool("use_mlock", use_mlock)
    if value is not None:
        if not isinstance(value, str) or value.lower() not in LOAD_MODES:
            raise ValueError(f"load_mode must be one of {', '.join(LOAD_MODES)}, got {value!r}")
        if not use_mmap or use_mlock:
            raise ValueError("load_mode replaces use_mmap/use_mlock: give one or the other")
        return int(lib.llama_load_mode_from_str(LOAD_MODES[value.lower()].encode()))
    if use_mmap and use_mlock:
        return int(lib.LLAMA_LOAD_MODE_MMAP_MLOCK)
    if use_mlock:
        return int(lib.LLAMA_LOAD_MODE_MLOCK)
    if not use_mmap:
        return int(lib.LLAMA_LOAD_MODE_NONE)
    return None


def load_mode_name(mode: int) -> str:
    return ffi.string(lib.llama_load_mode_name(mode)).decode()


class ModelParams:
    """A ``struct llama_model_params`` and the C memory it points to."""

    def __init__(
        self,
        *,
        n_gpu_layers: int = 0,
        split_mode: int | str = 1,
        main_gpu: int = 0,
        tensor_split: Sequence[float] | None = None,
        vocab_only: bool = False,
        load_mode: int | None = None,
        kv_overrides: Mapping[str, bool | int | float | str] | None = None,
        overrides: Sequence[tuple[bytes, Any]] = (),
        check_tensors: bool = False,
    ) -> None:
        self._keep: list[Any] = []
        self.token_overrides: dict[str, int] = {}  # the kv_overrides of token ids, checked against the vocabulary
        # as given, for the check of their types against the file's (the C field keeps the name kv_overrides)
        self.kv_given: dict[str, bool | int | float | str] = \
            dict(kv_overrides) if isinstance(kv_overrides, Mapping) else {}
        p = self.ptr = ffi.new("struct llama_model_params *", lib.llama_model_default_params())
        p.n_gpu_layers = check_int("n_gpu_layers", n_gpu_layers, -(2**31), 2**31 - 1)
        p.split_mode = _enum("split_mode", split_mode, SPLIT_MODES)
        p.main_gpu = check_int("main_gpu", main_gpu, 0)
        if load_mode is not None:
            p.load_mode = load_mode
        p.vocab_only = check_bool("vocab_only", vocab_only)
        p.check_tensors = check_bool("check_tensors", check_tensors)
        if tensor_split is not None:
            self.set_tensor_split(tensor_split)
        if kv_overrides:
            self._set_kv_overrides(kv_overrides)
        if overrides:
            self.set_overrides(overrides)

    def __getattr__(self, name: str) -> Any:
        """The C fields read as attributes (``llm.model_params.n_gpu_layers``, as llama-cpp-python)."""
        if name == "ptr":
            raise AttributeError(name)
        return getattr(self.ptr, name)

    def set_tensor_split(self, split: Sequence[float]) -> None:
        n = lib.llama_max_devices()
        if isinstance(split, (str, bytes)) or not isinstance(split, Sequence) or len(split) > n:
            raise ValueError(f"tensor_split must be a list of at most {n} numbers, got {split!r}")
        arr = ffi.new("float[]", [check_float("tensor_split", x, 0.0) for x in split] + [0.0] * (n - len(split)))
        self._keep.append(arr)
        self.ptr.tensor_split = arr

    def set_extra_bufts(self, on: bool) -> None:
        """Whether the CPU may keep weights in its extra (repacked) buffer types, llama.cpp's ``--no-repack``."""
        self.ptr.use_extra_bufts = check_bool("use_extra_bufts", on)

    def set_devices(self, devices: Sequence[Any]) -> None:
        """The devices the model may use (``ggml_backend_dev_t``s), instead of llama.cpp's choice."""
        arr = ffi.new("ggml_backend_dev_t[]", [*devices, ffi.NULL])
        self._keep.append(arr)
        self.ptr.devices = arr

    def set_overrides(self, overrides: Sequence[tuple[bytes, Any]]) -> None:
        """Tensor name patterns (regular expressions) and the buffer type for the tensors that match."""
        if len(overrides) >= lib.llama_max_tensor_buft_overrides():
            raise ValueError(f"too many tensor overrides ({len(overrides)}): at most "
                             f"{lib.llama_max_tensor_buft_overrides() - 1}")
        arr = ffi.new("struct llama_model_tensor_buft_override[]", len(overrides) + 1)  # zeroed: sentinel
        for i, (pattern, buft) in enumerate(overrides):
            s = ffi.new("char[]", pattern)
            self._keep.append(s)
            arr[i].pattern = s
            arr[i].buft = buft
        self._keep.append(arr)
        self.ptr.tensor_buft_overrides = arr

    def overrides(self) -> list[tuple[str, Any]]:
        """The overrides in effect, pattern and buffer type (the fit may have replaced those set here)."""
        p, out = self.ptr.tensor_buft_overrides, list[tuple[str, Any]]()
        while p != ffi.NULL and p[len(out)].pattern != ffi.NULL:
            out.append((ffi.string(p[len(out)].pattern).decode(), p[len(out)].buft))
        return out

    def override_patterns(self) -> list[str]:
        """The tensor name patterns of the overrides in effect."""
        return [pattern for pattern, _ in self.overrides()]

    def _set_kv_overrides(self, kv: Mapping[str, bool | int | float | str]) -> None:
        if not isinstance(kv, Mapping):
            raise ValueError(f"kv_overrides must be a dict of GGUF key -> value, got {kv!r}")
        arr = ffi.new("struct llama_model_kv_override[]", len(kv) + 1)  # zeroed key: sentinel
        for i, (k, v) in enumerate(kv.items()):
            key = k.encode() if isinstance(k, str) else b""
            if not key or len(key) > KV_KEY_MAX:
                raise ValueError(f"kv_overrides: key must be a string of 1..{KV_KEY_MAX} bytes, got {k!r}")
            arr[i].key = key
            if isinstance(v, bool):
                arr[i].tag, arr[i].val_bool = lib.LLAMA_KV_OVERRIDE_TYPE_BOOL, v
            elif isinstance(v, int):
                if k.endswith(TOKEN_ID_SUFFIX):  # a token id: llama.cpp logs one outside the vocabulary, and ignores it
                    self.token_overrides[k] = check_int(f"kv_overrides[{k!r}]", v, 0, 2**31 - 1)
                value = check_int(f"kv_overrides[{k!r}]", v, -(2**63), 2**63 - 1)
                arr[i].tag, arr[i].val_i64 = lib.LLAMA_KV_OVERRIDE_TYPE_INT, value
            elif isinstance(v, float):
                arr[i].tag, arr[i].val_f64 = lib.LLAMA_KV_OVERRIDE_TYPE_FLOAT, v
            elif isinstance(v, str) and len(v.encode()) <= KV_KEY_MAX:
                arr[i].tag, arr[i].val_str = lib.LLAMA_KV_OVERRIDE_TYPE_STR, v.encode()
            else:
                raise ValueError(f"kv_overrides[{k!r}] must be a bool, int, float or a string of at most "
                                 f"{KV_KEY_MAX} bytes, got {v!r}")
            if k.endswith(TOKEN_ID_SUFFIX) and not (isinstance(v, int) and not isinstance(v, bool)):
                raise ValueError(f"kv_overrides[{k!r}] is a token id: it must be an integer, got {v!r}")
        self._keep.append(arr)
        self.ptr.kv_overrides = arr

    def set_n_gpu_layers(self, n: int) -> None:
        self.ptr.n_gpu_layers = check_int("n_gpu_layers", n, -(2**31), 2**31 - 1)

    def set_load_mode(self, mode: int) -> None:
        self.ptr.load_mode = mode

    def fit_arrays(self) -> tuple[Any, Any]:
        """A tensor split and an overrides array for the fit to fill in (it points the parameters at them)."""
        split = ffi.new("float[]", lib.llama_max_devices())
        overrides = ffi.new("struct llama_model_tensor_buft_override[]", lib.llama_max_tensor_buft_overrides())
        self._keep += [split, overrides]
        return split, overrides

    def placement(self) -> tuple[Any, ...]:
        """What a fit sets (the arrays it points to stay alive in ``_keep``), for ``restore_placement``."""
        p = self.ptr
        return p.n_gpu_layers, p.tensor_split, p.tensor_buft_overrides

    def restore_placement(self, state: tuple[Any, ...]) -> None:
        p = self.ptr
        p.n_gpu_layers, p.tensor_split, p.tensor_buft_overrides = state

    def set_progress(self, handle: Any) -> None:
        """Report the load's progress to ``backend``'s progress callback with this handle."""
        self.ptr.progress_callback = lib.pyllama_moe_progress_callback
        self.ptr.progress_callback_user_data = handle
        self._keep.append(handle)


def max_threads() -> int:
    """The most threads ``n_threads`` / ``n_threads_batch`` may ask for: four per logical CPU of the machine (more
    only starve one another), and never more than ggml's ``GGML_MAX_N_THREADS`` (512: its per-thread arrays end
    there, and a larger count made the first decode overrun them and end the process)."""
    return min(int(lib.GGML_MAX_N_THREADS), 4 * (os.cpu_count() or 1))


def check_threads(name: str, value: Any) -> int:
    """A thread count, 1..max_threads(): ValueError naming the keyword otherwise."""
    check_int(name, value)
    limit = max_threads()
    if not 1 <= value <= limit:
        raise ValueError(f"{name} must be in 1..{limit} (4 per CPU of this machine, at most GGML_MAX_N_THREADS), "
                         f"got {value}")
    return int(value)


def _allowed_cpus() -> set[int]:
    return set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set()


def physical_cores(cpuinfo: str | None = None, allowed: set[int] | None = None) -> int:
    """Physical cores among the CPUs this process may run on, from ``/proc/cpuinfo`` (``physical id`` and
    ``core id`` of each ``processor``); half the logical CPUs where that cannot be read."""
    allowed = _allowed_cpus() if allowed is None else allowed
    fallback = max((len(allowed) or os.cpu_count() or 2) // 2, 1)
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                cpuinfo = f.read()
        except OSError:
            return fallback
    cores = set()
    for block in cpuinfo.split("\n\n"):
        fields = dict(line.split(":", 1) for line in block.splitlines() if ":" in line)
        fields = {k.strip(): v.strip() for k, v in fields.items()}
        if "processor" not in fields:
            continue
        if "core id" not in fields or not fields["processor"].isdigit():
            return fallback  # no topology (some VMs, other architectures)
        if allowed and int(fields["processor"]) not in allowed:
            continue
        cores.add((fields.get("physical id", "0"), fields["core id"]))
    return len(cores) or fallback


class ContextParams:
    """A ``struct llama_context_params`` from llama-cpp-python's context keywords."""

    def __init__(
        self,
        *,
        n_ctx: int,
        n_batch: int,
        n_ubatch: int,
        n_threads: int | None = None,
        n_threads_batch: int | None = None,
        n_seq_max: int = 1,
        rope_scaling_type: int | None = None,
        pooling_type: int = -1,
        attention_type: int = -1,
        rope_freq_base: float = 0.0,
        rope_freq_scale: float = 0.0,
        yarn_ext_factor: float | None = None,
        yarn_attn_factor: float | None = None,
        yarn_beta_fast: float | None = None,
        yarn_beta_slow: float | None = None,
        yarn_orig_ctx: int = 0,
        embedding: bool = False,
        offload_kqv: bool = True,
        flash_attn: bool | None = False,
        op_offload: bool | None = None,
        swa_full: bool | None = None,
        no_perf: bool = False,
        type_k: int | str | None = None,
        type_v: int | str | None = None,
        moe_cache_size: int = 0,
        moe_cache_predict: int | None = None,
        moe_cache_predict_depth: int | None = None,
        moe_hybrid: bool | str | None = None,
        prefetch_min_batch: int | None = None,
        moe_hybrid_share: float | None = None,
        moe_hybrid_delay_us: int | None = None,
        moe_cache_cpu: bool = False,
    ) -> None:
        """The keywords as ``Llama``'s, and four fields no ``Llama`` keyword sets: ``prefetch_min_batch`` (the
        fewest tokens of a ubatch whose host weights the scheduler prefetches; None: the library's 256), and for
        tests ``moe_hybrid_share`` (the share of each layer's misses the CPU takes whatever the rates, 0 to 1; None:
        from the rates), ``moe_hybrid_delay_us`` (the CPU waits this long before it writes each layer's part: a
        hand-off that does not wait for it shows) and ``moe_cache_cpu`` (the CPU backend stands for the MoE cache's
        device)."""
        p = self.ptr = ffi.new("struct llama_context_params *", lib.llama_context_default_params())
        p.n_ctx = check_int("n_ctx", n_ctx, 0, 2**32 - 1)
        p.n_batch = check_int("n_batch", n_batch, 1, 2**32 - 1)
        p.n_ubatch = check_int("n_ubatch", n_ubatch, 1, 2**32 - 1)
        p.n_seq_max = check_int("n_seq_max", n_seq_max, 1, lib.llama_max_parallel_sequences())
        cpus = len(_allowed_cpus()) or os.cpu_count() or 1
        # generation: one thread per physical core (llama.cpp's default; llama-cpp-python's half of the logical
        # CPUs is the same number on a machine with two threads per core, half of it without SMT), batches: all
        p.n_threads = check_threads("n_threads", n_threads) if n_threads is not None else physical_cores()
        p.n_threads_batch = check_threads("n_threads_batch", n_threads_batch) if n_threads_batch is not None else cpus
        if rope_scaling_type is not None:
            p.rope_scaling_type = check_int("rope_scaling_type", rope_scaling_type, -1,
                                            lib.LLAMA_ROPE_SCALING_TYPE_MAX_VALUE)
        p.pooling_type = check_int("pooling_type", pooling_type, -1, lib.LLAMA_POOLING_TYPE_RANK)
        p.attention_type = check_int("attention_type", attention_type, -1, 1)
        p.rope_freq_base = check_float("rope_freq_base", rope_freq_base, 0.0)
        p.rope_freq_scale = check_float("rope_freq_scale", rope_freq_scale, 0.0)
        # None: the library's default (read from the model)
        for name, value in (("yarn_ext_factor", yarn_ext_factor), ("yarn_attn_factor", yarn_attn_factor),
                            ("yarn_beta_fast", yarn_beta_fast), ("yarn_beta_slow", yarn_beta_slow)):
            if value is not None:
                setattr(p, name, check_float(name, value))
        p.yarn_orig_ctx = check_int("yarn_orig_ctx", yarn_orig_ctx, 0, 2**32 - 1)
        p.embeddings = check_bool("embedding", embedding)
        p.offload_kqv = check_bool("offload_kqv", offload_kqv)
        if flash_attn is None:
            p.flash_attn_type = lib.LLAMA_FLASH_ATTN_TYPE_AUTO
        else:
            p.flash_attn_type = (lib.LLAMA_FLASH_ATTN_TYPE_ENABLED if check_bool("flash_attn", flash_attn)
                                 else lib.LLAMA_FLASH_ATTN_TYPE_DISABLED)
        if op_offload is not None:
            p.op_offload = check_bool("op_offload", op_offload)
        if swa_full is not None:
            p.swa_full = check_bool("swa_full", swa_full)
        p.no_perf = check_bool("no_perf", no_perf)
        if type_k is not None:
            p.type_k = ggml_type("type_k", type_k)
        if type_v is not None:
            p.type_v = ggml_type("type_v", type_v)
        p.moe_cache_size = check_int("moe_cache_size", moe_cache_size, 0)
        if moe_cache_predict is not None:  # None: the library's default
            p.moe_cache_predict = check_int("moe_cache_predict", moe_cache_predict, 0, 2**31 - 1)
        if moe_cache_predict_depth is not None:  # a prediction pins its slots for at most 7 lookups
            p.moe_cache_predict_depth = check_int("moe_cache_predict_depth", moe_cache_predict_depth, 1, 8)
        # kept apart from the C field (which reads as an attribute, as llama-cpp-python's params do): None is unset
        self._moe_hybrid = moe_hybrid_mode(moe_hybrid)
        if self._moe_hybrid is not None:  # None: the library's default (off)
            p.moe_hybrid = self._moe_hybrid
        if prefetch_min_batch is not None:
            p.prefetch_min_batch = check_int("prefetch_min_batch", prefetch_min_batch, 0, 2**32 - 1)
        if moe_hybrid_share is not None:
            p.moe_hybrid_share = check_share(moe_hybrid_share)
        if moe_hybrid_delay_us is not None:
            p.moe_hybrid_delay_us = check_int("moe_hybrid_delay_us", moe_hybrid_delay_us, 0, 2**31 - 1)
        p.moe_cache_cpu = check_bool("moe_cache_cpu", moe_cache_cpu)

    def hybrid_asked(self) -> bool:
        """Whether ``moe_hybrid`` asked for the CPU's share (on or auto), which needs a MoE cache."""
        return self._moe_hybrid is not None and self._moe_hybrid != lib.LLAMA_MOE_HYBRID_OFF

    def set_moe_cache_size(self, nbytes: int) -> None:
        self.ptr.moe_cache_size = check_int("moe_cache_size", nbytes, 0)

    def set_n_ctx(self, n_ctx: int) -> None:
        self.ptr.n_ctx = check_int("n_ctx", n_ctx, 0, 2**32 - 1)

    def set_batch(self, n_batch: int, n_ubatch: int) -> None:
        """The batch sizes (``ubatch.choose``'s, or a measurement's trial): the ubatch at most the batch."""
        check_int("n_batch", n_batch, 1, 2**32 - 1)
        if not 1 <= check_int("n_ubatch", n_ubatch) <= n_batch:
            raise ValueError(f"n_ubatch must be in 1..n_batch ({n_batch}), got {n_ubatch}")
        self.ptr.n_batch, self.ptr.n_ubatch = n_batch, n_ubatch

    def use_model_n_ctx(self, n_ctx_train: int) -> None:
        """``n_ctx=0``: the model's training context, the batch sizes cut to it."""
        p = self.ptr
        if p.n_ctx == 0:
            p.n_ctx = n_ctx_train
            p.n_batch = min(p.n_ctx, p.n_batch)
            p.n_ubatch = min(p.n_batch, p.n_ubatch)

    def __getattr__(self, name: str) -> Any:
        """The C fields read as attributes (``llm.model_params.n_gpu_layers``, as llama-cpp-python)."""
        if name == "ptr":
            raise AttributeError(name)
        return getattr(self.ptr, name)
