"""MoE placement and cache knobs: ``cpu_moe``, ``n_cpu_moe``, ``override_tensor``, ``moe_cache_mib``, ``fit``.

The placement knobs become ``tensor_buft_overrides`` exactly as llama.cpp's common arguments
build them (common/common.h, common/arg.cpp): ``--cpu-moe`` is one override
``LLM_FFN_EXPS_REGEX -> CPU``; ``--n-cpu-moe N`` is one override per layer ``blk\\.<i><regex>``
for i < N; ``-ot`` is ``pattern=BUFT[,pattern=BUFT...]`` with the buffer type looked up by name.
The first pattern that matches a tensor wins (src/llama-model-loader.cpp), so the explicit
``override_tensor`` entries come first, then ``cpu_moe``, then ``n_cpu_moe``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Iterator, Mapping
from typing import Any

from pyllama_moe import backend
from pyllama_moe.errors import check_fit_status, native_mark
from pyllama_moe.ffi import ffi, lib
from pyllama_moe.params import ContextParams, ModelParams, check_bool, check_int

logger = logging.getLogger("pyllama_moe")

# common/common.h: LLM_FFN_EXPS_REGEX and llm_ffn_block_regex
FFN_EXPS_REGEX = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"
MIB = 1024 * 1024
FIT_TARGET_MIB = 1024  # common/common.h: fit_params_target, per device
FIT_N_CTX_MIN = 4096  # common/common.h: fit_params_min_ctx


def block_regex(il: int) -> str:
    return f"blk\\.{il}{FFN_EXPS_REGEX}"


def _buft(name: str) -> Any:
    bufts = backend.buffer_types()
    if name not in bufts:
        raise ValueError(f"override_tensor: unknown buffer type {name!r}; known: {', '.join(sorted(bufts))}")
    return bufts[name]


def _pattern(p: Any) -> bytes:
    if not isinstance(p, str) or not p:
        raise ValueError(f"override_tensor: a pattern must be a non-empty string, got {p!r}")
    try:
        re.compile(p)
    except re.error as e:
        raise ValueError(f"override_tensor: {p!r} is not a valid regular expression: {e}") from None
    return p.encode()


def parse_override_tensor(value: str | Mapping[str, str] | None) -> list[tuple[bytes, Any]]:
    """``-ot`` syntax ``"pattern=BUFT,pattern2=BUFT2"`` or a dict ``{pattern: BUFT}``."""
    if value is None:
        return []
    if isinstance(value, str):
        pairs = []
        for item in value.split(","):
            if "=" not in item:
                raise ValueError(f"override_tensor: expected pattern=BUFFER_TYPE, got {item!r}")
            pattern, name = item.split("=", 1)  # common splits at the first '='
            pairs.append((pattern, name))
    elif isinstance(value, Mapping):
        pairs = list(value.items())
    else:
        raise ValueError(f"override_tensor must be a 'pattern=BUFT,...' string or a dict, got {value!r}")
    return [(_pattern(p), _buft(n)) for p, n in pairs]


def placement_overrides(cpu_moe: bool = False, n_cpu_moe: int = 0,
                        override_tensor: str | Mapping[str, str] | None = None) -> list[tuple[bytes, Any]]:
    """The ``tensor_buft_overrides`` for the placement keywords, in the order they take effect."""
    check_bool("cpu_moe", cpu_moe)
    check_int("n_cpu_moe", n_cpu_moe, 0)
    out = parse_override_tensor(override_tensor)
    if cpu_moe or n_cpu_moe:
        cpu = lib.ggml_backend_cpu_buffer_type()
        if cpu_moe:
            out.append((FFN_EXPS_REGEX.encode(), cpu))
        # one pattern per layer, as --n-cpu-moe; no model has more layers than llama.cpp's LLAMA_MAX_LAYERS
        out += [(block_regex(il).encode(), cpu) for il in range(min(n_cpu_moe, LLAMA_MAX_LAYERS))]
    return out


def cache_size(moe_cache_mib: int | str) -> int | str:
    """Bytes of the device MoE cache, or ``"auto"``; 0 disables it.

    Without a GPU, upstream's cache fails the context (llama_moe_cache: "MoE cache requires a GPU
    backend"); as llama.cpp does for ``-ngl`` without a GPU, the knob is then ignored with a warning.
    """
    if moe_cache_mib == "auto":
        return "auto"
    size = check_int("moe_cache_mib", moe_cache_mib, 0, 2**44) * MIB
    if size and not backend.gpu_available():
        logger.warning("moe_cache_mib=%d ignored: the MoE cache needs a GPU and none is available", moe_cache_mib)
        return 0
    return size


CACHE_NO_MMAP_FRACTION = 0.8  # of the available memory
LLAMA_MAX_LAYERS = 512  # llama-hparams.h


def available_memory(root: str | None = None) -> int | None:
    """Bytes a new allocation can get: the system's available memory within the process's cgroup
    limits (``llama_available_memory``), None if unknown. ``root`` prefixes /proc and /sys (tests)."""
    n = int(lib.llama_available_memory() if root is None else lib.pyllama_moe_available_memory_at(root.encode()))
    return n if n >= 0 else None


def model_files_size(path: str) -> int:
    """Bytes of a GGUF model's files (all parts of a split model named ``*-00001-of-000NN.gguf``)."""
    m = re.fullmatch(r"(.*)-(\d{5})-of-(\d{5})\.gguf", path)
    if not m:
        return os.path.getsize(path)
    n = int(m.group(3))
    return sum(os.path.getsize(f"{m.group(1)}-{i:05d}-of-{n:05d}.gguf") for i in range(1, n + 1)
               if os.path.exists(f"{m.group(1)}-{i:05d}-of-{n:05d}.gguf"))


def cache_load_mode(path: str, mparams: ModelParams, cache_bytes: int) -> bool:
    """With the MoE cache on and the load mode left at ``auto``, load without mmap when the model's
    files take at most 80% of the available memory: the device reads the cached experts from pinned
    host memory, and mmap'ed pages usually cannot be pinned. Larger models keep mmap (and the host
    lookups). ``LLAMA_MOE_CACHE_DEVICE=0`` (the host looks up the cache, as upstream does) keeps
    llama.cpp's own choice too. Returns True if the load mode was changed."""
    if cache_bytes <= 0 or mparams.ptr.load_mode != lib.LLAMA_LOAD_MODE_AUTO:
        return False
    if os.environ.get("LLAMA_MOE_CACHE_DEVICE", "").strip() == "0":
        return False
    avail = available_memory()
    size = model_files_size(path)
    if avail is None or size > CACHE_NO_MMAP_FRACTION * avail:
        logger.info("moe_cache_mib: the model (%d MiB) keeps mmap, more than %d%% of the available memory (%s)",
                    size // MIB, int(CACHE_NO_MMAP_FRACTION * 100),
                    "unknown" if avail is None else f"{avail // MIB} MiB")
        return False
    mparams.ptr.load_mode = lib.LLAMA_LOAD_MODE_NONE
    logger.info("moe_cache_mib: loading without mmap (load_mode none) so the experts can be pinned: the model "
                "takes %d of %d MiB available", size // MIB, avail // MIB)
    return True


def _margins(fit_target_mib: int | list[int] | None) -> Any:
    n = lib.llama_max_devices()
    target = FIT_TARGET_MIB if fit_target_mib is None else fit_target_mib
    values = target if isinstance(target, (list, tuple)) else [target] * n
    if len(values) > n:
        raise ValueError(f"fit_target_mib: at most {n} values (one per device), got {len(values)}")
    values = [check_int("fit_target_mib", v, 0) * MIB for v in values]
    return ffi.new("size_t[]", values + [values[-1] if values else 0] * (n - len(values)))


def fit(path: bytes, mparams: ModelParams, cparams: ContextParams, fit_target_mib: int | list[int] | None,
        verbose: bool) -> bool:
    """Upstream's ``common_fit_params``: set the GPU layers, tensor split and overrides (and n_ctx if 0)
    that fit the devices' free memory minus ``fit_target_mib`` per device.

    Returns whether a fit was found; when not, the parameters are left as they were (as llama.cpp
    then loads them). Only parameters left at the library's defaults are changed.
    """
    split = ffi.new("float[]", lib.llama_max_devices())
    overrides = ffi.new("struct llama_model_tensor_buft_override[]", lib.llama_max_tensor_buft_overrides())
    margins = _margins(fit_target_mib)
    mparams._keep += [split, overrides, margins]
    level = lib.GGML_LOG_LEVEL_INFO if verbose else lib.GGML_LOG_LEVEL_ERROR
    mark = native_mark()
    status = lib.pyllama_moe_fit_params(path, mparams.ptr, cparams.ptr, split, overrides, margins,
                                        FIT_N_CTX_MIN, level)
    ok = check_fit_status(status, mark)
    if not ok:
        logger.warning("fit: no placement fits the free device memory; loading with the parameters as given")
    return ok


def auto_cache_size(path: bytes, mparams: ModelParams, cparams: ContextParams,
                    fit_target_mib: int | list[int] | None) -> int:
    """``moe_cache_mib="auto"``: what the GPUs have left after the model, context and compute
    buffers of this placement (measured without allocating), less the fit margin."""
    n = lib.llama_max_devices()
    out = ffi.new("int64_t[]", 5 * n)
    mark = native_mark()
    count = lib.pyllama_moe_device_memory(path, mparams.ptr, cparams.ptr, out, n)
    if count < 0:
        check_fit_status(2, mark)
    margins = _margins(fit_target_mib)
    ts = mparams.ptr.tensor_split
    split = [float(ts[d]) for d in range(count - 1)] if ts != ffi.NULL else []
    left, share = [], []
    for d in range(count - 1):  # the GPUs; the last entry is host memory
        _total, free, model, context, compute = (int(out[5 * d + k]) for k in range(5))
        left.append(max(0, free - int(margins[d]) - model - context - compute))
        # llama.cpp splits the cache among the devices with host experts of their layers, by the tensor split, else
        # by the memory free when the cache is made (after the model and the KV cache); here: the devices with layers
        share.append(0.0 if model == 0 else split[d] if any(split) else float(max(1, free - model - context)))
    size = cache_total(left, share)
    logger.info("moe_cache_mib=auto: %d MiB (left on the devices: %s MiB)", size // MIB,
                ", ".join(str(x // MIB) for x in left))
    return size


def cache_total(left: list[int], share: list[float]) -> int:
    """The cache size to ask for when llama.cpp splits it among the devices by ``share`` and device d has
    ``left[d]`` bytes for it: the largest total whose split gives no device more than it has left. A device
    with a share and nothing left makes it 0 (the cache off rather than that device out of memory)."""
    total = sum(x for x in share if x > 0)
    caps = [lf * total / sh for lf, sh in zip(left, share) if sh > 0]
    return int(max(0.0, min(caps))) if caps else 0


@contextlib.contextmanager
def gguf_header(path: bytes) -> Iterator[Any]:
    """ggml's ``gguf_context`` of a GGUF file: its metadata and tensor infos, no tensor data."""
    params = ffi.new("struct gguf_init_params *", {"no_alloc": True, "ctx": ffi.NULL})
    ctx = lib.gguf_init_from_file(path, params[0])
    if ctx == ffi.NULL:
        raise ValueError(f"{path.decode(errors='replace')} is not a readable GGUF file")
    try:
        yield ctx
    finally:
        lib.gguf_free(ctx)


def _gguf_u32(path: bytes, suffix: str) -> int | None:
    """The GGUF's ``{architecture}.{suffix}``, None if absent."""
    with gguf_header(path) as ctx:
        k = lib.gguf_find_key(ctx, b"general.architecture")
        arch = ffi.string(lib.gguf_get_val_str(ctx, k)).decode() if k >= 0 else ""
        k = lib.gguf_find_key(ctx, f"{arch}.{suffix}".encode())
        return int(lib.gguf_get_val_u32(ctx, k)) if k >= 0 else None


def block_count(path: bytes) -> int:
    """The GGUF's ``{architecture}.block_count``."""
    n = _gguf_u32(path, "block_count")
    if n is None:
        raise ValueError(f"{path.decode(errors='replace')} has no block_count")
    return n


def fit_with_cache(path: bytes, mparams: ModelParams, cparams: ContextParams, fit_target_mib: int | list[int] | None,
                   verbose: bool) -> int:
    """``fit=True`` with ``moe_cache_mib="auto"``: the placement and the size of the MoE cache, in bytes.

    A placement the user fixed (overrides, ``n_gpu_layers``, a tensor split or split mode upstream's
    fit does not change) is fitted as upstream does and the cache gets what the devices have left.
    Otherwise the layered fit comes first: if it keeps every layer in device memory there is nothing
    in host memory to cache (0). If it sends weights of a MoE model to host memory (or finds no
    placement), every expert goes to host memory instead (``cpu_moe``) with the rest on the devices,
    and the cache takes what they have left: in the layered placement the experts of a layer cost a
    whole layer of device memory, the cache spends it on the experts the tokens use. If that
    placement does not fit either, the layered one stays.
    """
    if not backend.gpu_available():  # no device to cache on
        fit(path, mparams, cparams, fit_target_mib, verbose)
        return 0
    p = mparams.ptr
    user_fixed = bool(mparams.override_patterns()) or p.n_gpu_layers != lib.llama_model_default_params().n_gpu_layers \
        or (p.tensor_split != ffi.NULL and any(p.tensor_split[d] != 0 for d in range(lib.llama_max_devices()))) \
        or p.split_mode not in (lib.LLAMA_SPLIT_MODE_NONE, lib.LLAMA_SPLIT_MODE_LAYER)

    # what the fit sets (the arrays it points to stay alive in the parameters' _keep)
    def placement() -> tuple[Any, ...]:
        return p.n_gpu_layers, p.tensor_split, p.tensor_buft_overrides, cparams.ptr.n_ctx

    def restore(state: tuple[Any, ...]) -> None:
        p.n_gpu_layers, p.tensor_split, p.tensor_buft_overrides, cparams.ptr.n_ctx = state

    saved = placement()
    fitted = fit(path, mparams, cparams, fit_target_mib, verbose)
    if user_fixed:
        return auto_cache_size(path, mparams, cparams, fit_target_mib)
    n_layer = block_count(path)
    ngl = p.n_gpu_layers
    if fitted and (ngl < 0 or ngl > n_layer) and not mparams.override_patterns():
        logger.info("fit: every layer fits in device memory, no MoE cache is needed")
        return 0
    if not _gguf_u32(path, "expert_count"):  # a dense model: no experts to cache
        return 0
    layered = placement()
    restore(saved)
    mparams.set_overrides(placement_overrides(cpu_moe=True))
    # upstream's fit only checks (and may shorten the context of) a placement with overrides
    if not fit(path, mparams, cparams, fit_target_mib, verbose):
        restore(layered)
        logger.info("fit: every expert in host memory does not fit either, the layered placement stays")
        return auto_cache_size(path, mparams, cparams, fit_target_mib)
    size = auto_cache_size(path, mparams, cparams, fit_target_mib)
    logger.info("fit: %s: every expert in host memory, the MoE cache in the %d MiB the devices have left",
                f"{ngl} of {n_layer + 1} layers fit in device memory" if fitted else "no layered placement fits",
                size // MIB)
    return size

