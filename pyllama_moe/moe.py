"""MoE placement and cache knobs: ``cpu_moe``, ``n_cpu_moe``, ``override_tensor``, ``moe_cache_mib``, ``fit``, and
the ubatch chosen for that placement where the caller gave none (``ubatch.choose``'s facts and memory, measured here).

The placement knobs become ``tensor_buft_overrides`` exactly as llama.cpp's common arguments
build them (common/common.h, common/arg.cpp): ``--cpu-moe`` is one override
``LLM_FFN_EXPS_REGEX -> CPU``; ``--n-cpu-moe N`` is one override per layer ``blk\\.<i><regex>``
for i < N; ``-ot`` is ``pattern=BUFT[,pattern=BUFT...]`` with the buffer type looked up by name.
The first pattern that matches a tensor wins (src/llama-model-loader.cpp), so the explicit
``override_tensor`` entries come first, then ``cpu_moe``, then ``n_cpu_moe``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyllama_moe import backend, ubatch
from pyllama_moe.errors import check_fit_status, native_mark
from pyllama_moe.ffi import ffi, lib
from pyllama_moe.gguf_info import FFN_EXPS_REGEX, GGUFInfo, split_files
from pyllama_moe.params import ContextParams, ModelParams, check_bool, check_int, warn_once

logger = logging.getLogger("pyllama_moe")

__all__ = ["FFN_EXPS_REGEX", "MoeCacheStats", "Placement", "place"]

MIB = 1024 * 1024
FIT_TARGET_MIB = 1024  # common/common.h: fit_params_target, per device
FIT_N_CTX_MIN = 4096  # common/common.h: fit_params_min_ctx


def block_regex(il: int) -> str:
    """common/common.h: llm_ffn_block_regex, the expert tensors of layer ``il``."""
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


def warn_unmatched(override_tensor: str | Mapping[str, str] | None, tensor_names: Sequence[str]) -> None:
    """An ``override_tensor`` pattern that matches none of the model's tensors places nothing, silently in llama.cpp:
    a warning names it (llama.cpp searches with std::regex, ECMAScript; Python's ``re`` reads these patterns alike)."""
    if not tensor_names:
        return
    for pattern, _ in parse_override_tensor(override_tensor):  # each compiled by Python's re there already
        text = pattern.decode()
        rx = re.compile(text)
        if not any(rx.search(name) for name in tensor_names):
            warn_once(f"override_tensor:{text}", f"override_tensor: the pattern {text!r} matches no tensor of the "
                      f"model ({len(tensor_names)} tensors, e.g. {tensor_names[0]!r}): it places nothing")


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


def cache_on_cpu() -> bool:
    """``PYLLAMA_MOE_CACHE_CPU=1``, a dry run of the GPU scripts in processes of their own (the bench's workers,
    ``ci/hybrid_check.py``): ``Llama`` makes its contexts with ``moe_cache_cpu``, the CPU backend standing for the MoE
    cache's device, so the cache, its device lookups and the hybrid decode run without a GPU."""
    return os.environ.get("PYLLAMA_MOE_CACHE_CPU", "").strip() == "1"


def cache_size(moe_cache_mib: int | str, cpu_device: bool = False) -> int | str:
    """Bytes of the device MoE cache, or ``"auto"``; 0 disables it.

    Without a GPU, upstream's cache fails the context (llama_moe_cache: "MoE cache requires a GPU
    backend"); as llama.cpp does for ``-ngl`` without a GPU, the knob is then ignored with a warning (unless the
    CPU stands for the device: ``cpu_device``, the context's ``moe_cache_cpu``).
    """
    if moe_cache_mib == "auto":
        return "auto"
    size = check_int("moe_cache_mib", moe_cache_mib, 0, 2**44) * MIB
    if size and not backend.gpu_available() and not cpu_device:
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
    return sum(os.path.getsize(f) for f in split_files(path))


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
    mparams.set_load_mode(lib.LLAMA_LOAD_MODE_NONE)
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
    split, overrides = mparams.fit_arrays()
    margins = _margins(fit_target_mib)
    level = lib.GGML_LOG_LEVEL_INFO if verbose else lib.GGML_LOG_LEVEL_ERROR
    mark = native_mark()
    status = lib.pyllama_moe_fit_params(path, mparams.ptr, cparams.ptr, split, overrides, margins,
                                        FIT_N_CTX_MIN, level)
    ok = check_fit_status(status, mark)
    if not ok:
        logger.warning("fit: no placement fits the free device memory; loading with the parameters as given")
    return ok


def device_room(path: bytes, mparams: ModelParams, cparams: ContextParams,
                fit_target_mib: int | list[int] | None) -> tuple[list[int], list[float]]:
    """Per GPU: the bytes left after the model, context (the MoE cache of the parameters' size included) and compute
    buffers of these parameters, less the fit margin (negative: short of it), measured without allocating; and its
    share of a MoE cache as llama.cpp splits one."""
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
        left.append(free - int(margins[d]) - model - context - compute)
        # llama.cpp splits the cache among the devices with host experts of their layers, by the tensor split, else
        # by the memory free when the cache is made (after the model and the KV cache); here: the devices with layers
        share.append(0.0 if model == 0 else split[d] if any(split) else float(max(1, free - model - context)))
    return left, share


def auto_cache_size(path: bytes, mparams: ModelParams, cparams: ContextParams,
                    fit_target_mib: int | list[int] | None) -> int:
    """``moe_cache_mib="auto"``: what the GPUs have left after the model, context and compute
    buffers of this placement (measured without allocating), less the fit margin."""
    left, share = device_room(path, mparams, cparams, fit_target_mib)
    left = [max(0, x) for x in left]
    size = cache_total(left, share)
    logger.info("moe_cache_mib=auto: %d MiB (left on the devices: %s MiB)", size // MIB,
                ", ".join(str(x // MIB) for x in left))
    return size


def cache_total(left: list[int], share: list[float]) -> int:
    """The cache size to ask for when llama.cpp splits it among the devices by ``share`` and device d has
    ``left[d]`` bytes for it: the largest total whose split gives no device more than it has left. A device
    with a share and nothing left makes it 0 (the cache off rather than that device out of memory)."""
    total = sum(x for x in share if x > 0)
    caps = [lf * total / sh for lf, sh in zip(left, share, strict=True) if sh > 0]
    return int(max(0.0, min(caps))) if caps else 0


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

    saved = mparams.placement(), cparams.ptr.n_ctx
    fitted = fit(path, mparams, cparams, fit_target_mib, verbose)
    if user_fixed:
        return auto_cache_size(path, mparams, cparams, fit_target_mib)
    info = GGUFInfo.read(path)
    n_layer = info.require_block_count()
    ngl = p.n_gpu_layers
    if fitted and (ngl < 0 or ngl > n_layer) and not mparams.override_patterns():
        logger.info("fit: every layer fits in device memory, no MoE cache is needed")
        return 0
    if not info.expert_count:  # a dense model: no experts to cache
        return 0
    layered = mparams.placement(), cparams.ptr.n_ctx

    def restore(state: tuple[Any, int]) -> None:
        mparams.restore_placement(state[0])
        cparams.set_n_ctx(state[1])

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


_LAYER = re.compile(r"^blk\.(\d+)\.")


def host_experts(info: GGUFInfo, mparams: ModelParams) -> int:
    """The model's expert tensors this placement keeps in host memory: the first override whose pattern matches a
    tensor places it (src/llama-model-loader.cpp; a host buffer type: ``CPU``, ``CUDA_Host``...), else its layer
    does (the last ``n_gpu_layers`` layers are on the GPU, src/llama-model.cpp)."""
    exps = re.compile(FFN_EXPS_REGEX)
    overrides = [(re.compile(p), bool(lib.ggml_backend_buft_is_host(b))) for p, b in mparams.overrides()]
    ngl = int(mparams.ptr.n_gpu_layers)
    first_gpu = 0 if ngl < 0 else max((info.block_count or 0) + 1 - ngl, 0)
    n = 0
    for name in filter(exps.search, info.tensor_names):
        host = next((h for rx, h in overrides if rx.search(name)), None)
        if host is None:
            m = _LAYER.match(name)
            host = m is not None and int(m.group(1)) < first_gpu
        n += host
    return n


def ubatch_room(path: bytes, mparams: ModelParams, cparams: ContextParams, fit_target_mib: int | list[int] | None,
                cache_auto: bool) -> Callable[[int], ubatch.Room]:
    """``ubatch.choose``'s memory: whether the compute buffer of a ubatch of ``n`` fits beside this placement, measured
    by llama.cpp without allocating (the compute buffer grows with the ubatch, and without flash attention with the
    context too); an auto-sized cache is measured out and sized in what is left, as ``auto_cache_size`` does."""
    def room(n: int) -> ubatch.Room:
        p = cparams.ptr
        saved = int(p.n_batch), int(p.n_ubatch), int(p.moe_cache_size)
        cparams.set_batch(max(saved[0], n), n)
        if cache_auto:
            cparams.set_moe_cache_size(0)
        try:
            left, share = device_room(path, mparams, cparams, fit_target_mib)
        finally:
            cparams.set_batch(saved[0], saved[1])
            cparams.set_moe_cache_size(saved[2])
        size = cache_total([max(0, x) for x in left], share) if cache_auto else 0
        logger.info("n_ubatch %d: %s MiB left on the devices", n, ", ".join(str(x // MIB) for x in left))
        return ubatch.Room(fits=all(x >= 0 for x in left), cache_bytes=size)
    return room


def choose_ubatch(path: bytes, mparams: ModelParams, cparams: ContextParams, batches: ubatch.Batches, *,
                  cache_auto: bool, fit_target_mib: int | list[int] | None) -> ubatch.Choice:
    """The batch sizes of this placement (``ubatch.choose``), written into the parameters with the size of an auto
    cache that gave way."""
    gpu = backend.gpu_available() and mparams.ptr.n_gpu_layers != 0
    n_host = host_bytes = 0
    if gpu and batches.n_ubatch is None:
        info = GGUFInfo.read(path)
        n_host = host_experts(info, mparams)
        n_exps = sum(1 for t in info.tensor_names if re.search(FFN_EXPS_REGEX, t))
        host_bytes = info.expert_bytes * n_host // max(n_exps, 1)
    facts = ubatch.Facts(gpu=gpu, host_experts=n_host, n_ctx=int(cparams.ptr.n_ctx),
                         cache_bytes=int(cparams.ptr.moe_cache_size), cache_auto=cache_auto,
                         host_expert_bytes=host_bytes)
    choice = ubatch.choose(batches, facts, ubatch_room(path, mparams, cparams, fit_target_mib, cache_auto))
    cparams.set_batch(choice.n_batch, choice.n_ubatch)
    if choice.cache_bytes is not None:
        cparams.set_moe_cache_size(choice.cache_bytes)
    if choice.chosen:
        logger.info("n_batch=%d, n_ubatch=%d: %s", choice.n_batch, choice.n_ubatch, choice.reason)
    return choice


@dataclass(frozen=True)
class Placement:
    """Where ``place`` put the weights: the MoE cache's bytes, the load mode and the batch sizes with the reason for
    them (the rest is in the parameters)."""

    cache_bytes: int
    load_mode: int
    batch: ubatch.Choice


def place(path: str, mparams: ModelParams, cparams: ContextParams, *, moe_cache_mib: int | str, fit_memory: bool,
          fit_target_mib: int | list[int] | None, verbose: bool, batches: ubatch.Batches) -> Placement:
    """The placement keywords' one way into the parameters: the cache size (``moe_cache_mib``: MiB or ``"auto"``),
    then the fit (``fit=True``: upstream's, or with ``"auto"`` the fit that chooses between layers and cache), then
    the batch sizes (``batches``: as given, or chosen for this placement; an auto cache may give way to them), then
    the load mode the cache wants; a warning where ``moe_hybrid`` asks for a share of a cache that is not there.
    Writes the parameters through their setters only."""
    if not isinstance(fit_memory, bool):
        raise ValueError(f"fit must be True or False, got {fit_memory!r}")
    _margins(fit_target_mib)  # checked when no fit reads it too: a bad value is not passed over in silence
    cpu_device = bool(cparams.ptr.moe_cache_cpu)
    cache = cache_size(moe_cache_mib, cpu_device)
    if isinstance(cache, int):  # before the fit, which counts it
        cparams.set_moe_cache_size(cache)
    bpath = os.fsencode(path)
    with backend.verbosity(verbose):
        if fit_memory:
            # llama-cpp-python's n_gpu_layers=0 default would stop the fit: "unset" is the library's -1
            if mparams.ptr.n_gpu_layers == 0:
                mparams.set_n_gpu_layers(lib.llama_model_default_params().n_gpu_layers)
            if cache == "auto":  # the fit chooses between the layers and the cache
                cparams.set_moe_cache_size(fit_with_cache(bpath, mparams, cparams, fit_target_mib, verbose))
            else:
                fit(bpath, mparams, cparams, fit_target_mib, verbose)
        elif cache == "auto":
            cparams.set_moe_cache_size(auto_cache_size(bpath, mparams, cparams, fit_target_mib))
        batch = choose_ubatch(bpath, mparams, cparams, batches, cache_auto=cache == "auto",
                              fit_target_mib=fit_target_mib)
    cache_bytes = int(cparams.ptr.moe_cache_size)
    if cache_bytes == 0 and cparams.hybrid_asked():  # the library accepts it and does nothing, as for the prediction
        logger.warning("moe_hybrid ignored: the CPU's share of the decode is a share of the MoE cache's misses, and "
                       "there is no cache (moe_cache_mib, on a GPU)")
    if cache_bytes and cpu_device:  # the cache reads the experts from plain host buffers, not repacked ones
        mparams.set_extra_bufts(False)
    cache_load_mode(path, mparams, cache_bytes)
    return Placement(cache_bytes=cache_bytes, load_mode=int(mparams.ptr.load_mode), batch=batch)


# the lookup paths of the counts, as the C fields name them
_PATHS = ("small", "large", "device")

# as_dict's groups past the lookup paths, key -> C field: experts copied for large ubatches; the prefetch of large
# ubatches through the cache (LLAMA_MOE_CACHE_PREFETCH=0: off); the seeds from the experts staged for the last large
# ubatch of a batch (LLAMA_MOE_CACHE_SEED=0: off); the experts the device lookups prefetched for the next layer's
# predicted routing (LLAMA_MOE_CACHE_PREDICT=N), those a lookup then found, those evicted unused; the hybrid decode
# (moe_hybrid): the device lookups' misses the CPU computed instead of uploading, the hand-offs that gave it work and
# its busy time in them, and the split (host_max, the rates it follows)
_GROUPS = {
    "copied": {"experts": "n_copied", "bytes": "bytes_copied"},
    "prefetch": {"ubatches": "n_ubatch_large", "calls": "n_prefetch_calls", "regions": "n_prefetch_regions",
                 "bytes_cache": "bytes_prefetch_cache", "bytes_host": "bytes_prefetch_host"},
    "seed": {"ubatches": "n_seed_ubatch", "experts": "n_seeded", "bytes": "bytes_seeded", "dropped": "n_seed_dropped"},
    "predicted": {"experts": "n_predicted", "used": "n_predicted_used", "wasted": "n_predicted_wasted",
                  "bytes": "bytes_predicted"},
    "hybrid": {"experts": "n_host", "calls": "n_host_calls", "busy_us": "host_busy_us", "host_max": "host_max",
               "host_expert_us": "host_expert_us", "upload_expert_us": "upload_expert_us", "handoff_us": "handoff_us"},
}
# not counts but what the context measured and chose when it was made: b - a keeps b's; the rates are floats
_RATES = ("host_expert_us", "upload_expert_us", "handoff_us")
_SPLIT = ("host_max", *_RATES)


def _value(field: str, v: Any) -> Any:  # int or float, as the field
    return float(v) if field in _RATES else int(v)


@dataclass(frozen=True)
class MoeCacheStats:
    """``struct llama_moe_cache_stats`` field by field: the MoE cache's counts since the context was made.

    What ``Llama.moe_cache_stats()`` returns: ``b - a`` is what happened between two readings (the hybrid's split,
    chosen when the context was made, is b's), ``as_dict()`` the groups as JSON (``from_dict`` reads them back),
    ``stats[group]`` one group of it, and ``(b - a).per_token(n)`` the hybrid decode's figures per token."""

    hits_small: int = 0
    misses_small: int = 0
    bytes_small: int = 0
    hits_large: int = 0
    misses_large: int = 0
    bytes_large: int = 0
    hits_device: int = 0
    misses_device: int = 0
    bytes_device: int = 0
    n_copied: int = 0
    bytes_copied: int = 0
    n_ubatch_large: int = 0
    n_prefetch_calls: int = 0
    n_prefetch_regions: int = 0
    bytes_prefetch_cache: int = 0
    bytes_prefetch_host: int = 0
    n_seed_ubatch: int = 0
    n_seeded: int = 0
    bytes_seeded: int = 0
    n_seed_dropped: int = 0
    n_predicted: int = 0
    n_predicted_used: int = 0
    n_predicted_wasted: int = 0
    bytes_predicted: int = 0
    n_host: int = 0  # misses of the device lookups the CPU computed (in misses_device too, not uploaded)
    n_host_calls: int = 0  # hand-offs that gave the CPU work
    host_busy_us: int = 0  # the CPU's busy time in them
    host_expert_us: float = 0.0  # the rates measured when the context was made, which the split follows from
    upload_expert_us: float = 0.0
    handoff_us: float = 0.0
    host_max: int = 0  # the most misses per layer and ubatch the CPU takes; 0: the hybrid is off

    @classmethod
    def from_c(cls, st: Any) -> MoeCacheStats:
        return cls(**{f.name: _value(f.name, getattr(st, f.name)) for f in dataclasses.fields(cls)})

    @classmethod
    def read(cls, ctx: Any) -> MoeCacheStats | None:
        """The counts of the context ``ctx`` (a ``llama_context *``), None without a cache."""
        st = ffi.new("struct llama_moe_cache_stats *")
        if not lib.llama_moe_cache_get_stats(ctx, st):
            return None
        return cls.from_c(st)

    def __sub__(self, other: MoeCacheStats) -> MoeCacheStats:
        return MoeCacheStats(**{f.name: getattr(self, f.name) - (0 if f.name in _SPLIT else getattr(other, f.name))
                                for f in dataclasses.fields(self)})

    def __getitem__(self, group: str) -> dict[str, float]:
        """One group of :meth:`as_dict` (``stats["device"]["hits"]``)."""
        return self.as_dict()[group]

    def hits(self, *paths: str) -> tuple[int, int]:
        """Hits and misses summed over lookup paths (``small``, ``large``, ``device``)."""
        return (sum(getattr(self, f"hits_{p}") for p in paths), sum(getattr(self, f"misses_{p}") for p in paths))

    def as_dict(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for path in _PATHS:
            hits, misses = self.hits(path)
            out[path] = {"hits": hits, "misses": misses, "bytes_uploaded": getattr(self, f"bytes_{path}"),
                         "hit_rate": hits / (hits + misses) if hits + misses else 0.0}
        for name, keys in _GROUPS.items():
            out[name] = {key: getattr(self, field) for key, field in keys.items()}
        n = max(self.n_ubatch_large, 1)  # per large ubatch
        out["prefetch"].update(calls_per_ubatch=self.n_prefetch_calls / n,
                               mib_host_per_ubatch=self.bytes_prefetch_host / n / 2**20)
        # the share of the device lookups' misses the CPU computed, and per hand-off that gave it work
        calls = max(self.n_host_calls, 1)
        out["hybrid"].update(share=self.n_host / max(self.misses_device, 1),
                             experts_per_call=self.n_host / calls, busy_us_per_call=self.host_busy_us / calls)
        return out

    def uploaded(self) -> int:
        """Experts uploaded to the device for decode: the misses of the device and small lookups, and the experts
        the prediction copied (the misses the CPU computed are not uploaded)."""
        return self.misses_device - self.n_host + self.misses_small + self.n_predicted

    def per_token(self, tokens: int) -> dict[str, float]:
        """The hybrid decode's split over ``tokens`` tokens (those decoded between the two readings of ``b - a``):
        experts computed on the CPU (``host``), the CPU's busy milliseconds (``host_ms``), experts uploaded
        (``uploaded``, :meth:`uploaded`) and an estimate of PCIe's busy milliseconds (``pcie_ms``: those uploads
        times ``upload_expert_us``, the rate measured when the context was made), each per token."""
        n = max(tokens, 1)
        return {"host": self.n_host / n, "host_ms": self.host_busy_us / 1000 / n, "uploaded": self.uploaded() / n,
                "pcie_ms": self.uploaded() * self.upload_expert_us / 1000 / n}

    @classmethod
    def from_dict(cls, d: Mapping[str, Mapping[str, float]]) -> MoeCacheStats:
        """The inverse of ``as_dict`` (the derived rates are dropped; a group that is not there counts 0)."""
        names = {path: {"hits": f"hits_{path}", "misses": f"misses_{path}", "bytes_uploaded": f"bytes_{path}"}
                 for path in _PATHS}
        names.update(_GROUPS)
        return cls(**{field: _value(field, group[key]) for name, keys in names.items()
                      if (group := d.get(name)) is not None for key, field in keys.items() if key in group})
