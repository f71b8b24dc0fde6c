"""The GGUF file of a synthetic model: header, metadata and tensor infos through gguf-py's writer, then the data
streamed chunk by chunk from worker threads (see :mod:`pyllama_moe.tools.synth`)."""

from __future__ import annotations

import functools
import os
import sys
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np
import numpy.typing as npt

from pyllama_moe.tools.synth import routing as synth_routing
from pyllama_moe.tools.synth.shapes import (
    ARCH_DEEPSEEK2,
    ARCH_ERNIE_MOE,
    ARCH_GPT_OSS,
    ARCH_GRANITEMOE,
    ARCH_QWEN2MOE,
    ARCH_QWEN3NEXT,
    DEEPSEEK_ROUTING,
    FFN_SIZED_EXPERTS,
    GATING_SIGMOID,
    GGML_TYPES,
    GRANITE_SCALES,
    MOE_LAYOUT,
    QWEN3NEXT_CONV_KERNEL,
    QWEN3NEXT_FULL_ATTENTION_INTERVAL,
)
from pyllama_moe.tools.synth.tensors import Plan, _pad, plan
from pyllama_moe.tools.synth.vocab import _load_vocab, _Vocab, default_vocab_path
from pyllama_moe.tools.synth.weights import (
    SHARED_FRACTION,
    _chunk_count,
    _decay_values,
    _normal_chunk,
    _prepare_routing,
    _prepare_skew,
    _routed_chunk,
    _Skew,
    _special_values,
)

if TYPE_CHECKING:  # pragma: no cover
    import gguf

META_PREFIX = "pyllama_moe.synth."  # the files' key namespace (not a module path)
FORMAT_VERSION = 2  # 2: scale_signs (unskewed models have positive scales)


# --------------------------------------------------------------------------------------------
# writing


def _gguf() -> Any:
    """The ``gguf`` package, imported on first use."""
    try:
        import gguf
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "pyllama_moe.tools.synth needs the 'gguf' package (pip install 'gguf>=0.19' or "
            "pip install 'pyllama-moe[synth]')"
        ) from e
    return gguf


def _add_metadata(writer: gguf.GGUFWriter, p: Plan, vocab: _Vocab, preset: str, seed: int, skew: _Skew | None) -> None:
    """The general, architecture, tokenizer and ``pyllama_moe.synth.`` keys."""
    gguf = _gguf()
    s, a = p.shape, p.shape.arch
    etype = GGML_TYPES[p.expert_type]
    writer.add_type("model")
    writer.add_name(f"pyllama_moe synth {preset} {a}")
    writer.add_file_type(etype.file_type)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_uint32(f"{a}.context_length", s.context_length)
    writer.add_uint32(f"{a}.embedding_length", s.n_embd)
    writer.add_uint32(f"{a}.block_count", s.n_block)
    if a in FFN_SIZED_EXPERTS:  # their loaders size the experts by it
        writer.add_uint32(f"{a}.feed_forward_length", s.n_ff_exp)
    elif s.n_ff:
        writer.add_uint32(f"{a}.feed_forward_length", s.n_ff)
    writer.add_uint32(f"{a}.attention.head_count", s.n_head)
    writer.add_uint32(f"{a}.attention.head_count_kv", s.n_head_kv)
    if a == ARCH_DEEPSEEK2:
        _add_mla(writer, p)
    else:
        writer.add_uint32(f"{a}.attention.key_length", s.head_dim)
        writer.add_uint32(f"{a}.attention.value_length", s.head_dim)
    writer.add_float32(f"{a}.attention.layer_norm_rms_epsilon", s.rms_eps)
    writer.add_float32(f"{a}.rope.freq_base", s.rope_freq_base)
    writer.add_uint32(f"{a}.rope.dimension_count", s.rot)
    if s.is_moe:
        writer.add_uint32(f"{a}.expert_count", s.n_expert)
        writer.add_uint32(f"{a}.expert_used_count", s.n_expert_used)
        writer.add_uint32(f"{a}.expert_feed_forward_length", s.n_ff_exp)
    if a in (ARCH_QWEN2MOE, ARCH_ERNIE_MOE, ARCH_QWEN3NEXT):
        writer.add_uint32(f"{a}.expert_shared_feed_forward_length", s.n_ff)
    if a == ARCH_QWEN3NEXT:  # the linear attention's widths: n_head value heads, n_head_kv key heads of head_dim
        writer.add_uint32(f"{a}.full_attention_interval", QWEN3NEXT_FULL_ATTENTION_INTERVAL)
        writer.add_uint32(f"{a}.ssm.conv_kernel", QWEN3NEXT_CONV_KERNEL)
        writer.add_uint32(f"{a}.ssm.inner_size", s.n_embd_q)
        writer.add_uint32(f"{a}.ssm.state_size", s.head_dim)
        writer.add_uint32(f"{a}.ssm.time_step_rank", s.n_head)
        writer.add_uint32(f"{a}.ssm.group_count", s.n_head_kv)
    if a in MOE_LAYOUT:
        lead, step = MOE_LAYOUT[a]
        if a not in DEEPSEEK_ROUTING:  # their loaders read no step
            writer.add_uint32(f"{a}.interleave_moe_layer_step", step)
        if lead:
            writer.add_uint32(f"{a}.leading_dense_block_count", lead)
    if a in DEEPSEEK_ROUTING:
        _add_deepseek_routing(writer, p)
    if a == ARCH_GRANITEMOE:
        for key, v in GRANITE_SCALES.items():
            writer.add_float32(f"{a}.{key}", v)
        writer.add_float32(f"{a}.attention.scale", 1.0 / s.head_dim)
    if a == ARCH_GPT_OSS:
        writer.add_uint32(f"{a}.attention.sliding_window", s.sliding_window)
    for key, value, vtype, sub in vocab.entries:
        writer.add_key_value(key, value, gguf.GGUFValueType(vtype), None if sub is None else gguf.GGUFValueType(sub))
    writer.add_uint32(META_PREFIX + "version", FORMAT_VERSION)
    writer.add_string(META_PREFIX + "preset", preset)
    writer.add_uint64(META_PREFIX + "seed", seed)
    writer.add_float32(META_PREFIX + "skew", p.skew)
    writer.add_string(META_PREFIX + "expert_type", p.expert_type)
    writer.add_string(META_PREFIX + "dense_type", p.dense_type)
    writer.add_string(META_PREFIX + "scale_signs", p.scale_signs)
    writer.add_string(META_PREFIX + "routing", p.regime)
    if skew is not None:
        writer.add_uint32(META_PREFIX + "hot_experts_per_layer", len(skew.hot[0]))
        writer.add_key_value(META_PREFIX + "hot_experts", [e for layer in skew.hot for e in layer],
                             gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.INT32)
        writer.add_key_value(META_PREFIX + "hot_boost", list(skew.boost),
                             gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.FLOAT32)
        if skew.direction:
            writer.add_float32(META_PREFIX + "shared_fraction", SHARED_FRACTION)


def _add_deepseek_routing(writer: gguf.GGUFWriter, p: Plan) -> None:
    """The keys of DeepSeek-V3's routing (glm4moe, deepseek2): shared experts, gating, groups, NextN layers."""
    s, a = p.shape, p.shape.arch
    writer.add_uint32(f"{a}.expert_shared_count", s.n_expert_shared)
    writer.add_uint32(f"{a}.expert_gating_func", s.expert_gating)
    writer.add_float32(f"{a}.expert_weights_scale", s.expert_weights_scale)
    writer.add_bool(f"{a}.expert_weights_norm", s.expert_gating == GATING_SIGMOID)  # V3's and GLM's; V2's not
    if s.n_expert_groups:
        writer.add_uint32(f"{a}.expert_group_count", s.n_expert_groups)
        writer.add_uint32(f"{a}.expert_group_used_count", s.n_group_used)
    if s.n_nextn:
        writer.add_uint32(f"{a}.nextn_predict_layers", s.n_nextn)


def _add_mla(writer: gguf.GGUFWriter, p: Plan) -> None:
    """The keys of deepseek2's latent attention: what the cache holds per token (one head: the latent and the key's
    rotated part, the latent again as the value), the heads' widths, the ranks."""
    s, a = p.shape, p.shape.arch
    writer.add_uint32(f"{a}.attention.key_length", s.kv_lora_rank + s.rot)
    writer.add_uint32(f"{a}.attention.value_length", s.kv_lora_rank)
    writer.add_uint32(f"{a}.attention.key_length_mla", s.head_dim)
    writer.add_uint32(f"{a}.attention.value_length_mla", s.head_dim_v)
    writer.add_uint32(f"{a}.attention.q_lora_rank", s.q_lora_rank)  # 0: one projection (a lite model reads none)
    writer.add_uint32(f"{a}.attention.kv_lora_rank", s.kv_lora_rank)


_Job = tuple[int, Callable[[], npt.NDArray[Any]]]


def _jobs(p: Plan, seed: int, skew: _Skew | None, routing: synth_routing.Routing | None) -> Iterator[_Job]:
    """``(tensor index, chunk producer)`` for every chunk of every tensor, in file order."""
    for i, t in enumerate(p.tensors):
        if t.init == "ones":
            yield i, functools.partial(np.ones, t.n_elements, dtype="<f4")
        elif t.init == "decay":
            yield i, functools.partial(_decay_values, t, seed)
        elif t.init in ("router", "vbias"):
            yield i, functools.partial(_special_values, t, seed, skew, routing)
        elif t.init == "routed":
            assert routing is not None
            for c in range(_chunk_count(t)):
                yield i, functools.partial(_routed_chunk, t, seed, c, routing)
        else:
            for c in range(_chunk_count(t)):
                yield i, functools.partial(_normal_chunk, t, seed, c)


def _write_data(fout: BinaryIO, p: Plan, seed: int, skew: _Skew | None, routing: synth_routing.Routing | None,
                threads: int, on_bytes: Callable[[int], None]) -> None:
    """Write the data section: chunks made by ``threads`` workers, written in order, padded."""
    fout.write(b"\0" * (_pad(fout.tell()) - fout.tell()))
    written = [0] * len(p.tensors)
    window = max(2, threads + 2)
    pending: deque[tuple[int, Future[npt.NDArray[Any]]]] = deque()
    current = 0

    def finish(upto: int) -> None:
        nonlocal current
        while current < upto:
            t = p.tensors[current]
            if written[current] != t.nbytes:
                raise RuntimeError(f"{t.name}: wrote {written[current]} bytes, expected {t.nbytes}")
            fout.write(b"\0" * (_pad(t.nbytes) - t.nbytes))
            current += 1

    def drain_one() -> None:
        i, fut = pending.popleft()
        finish(i)
        buf = np.ascontiguousarray(fut.result())
        fout.write(buf.reshape(-1).view(np.uint8).data)
        written[i] += buf.nbytes
        on_bytes(buf.nbytes)

    with ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="synth") as pool:
        for i, job in _jobs(p, seed, skew, routing):
            pending.append((i, pool.submit(job)))
            if len(pending) >= window:
                drain_one()
        while pending:
            drain_one()
    finish(len(p.tensors))


def write_model(
    path: str | os.PathLike[str],
    preset: str = "tiny",
    *,
    arch: str | None = None,
    vocab_path: str | os.PathLike[str] | None = None,
    expert_type: str = "q4_0",
    skew: float = 0.0,
    seed: int = 0,
    dense_type: str = "f16",
    threads: int | None = None,
    progress: bool = False,
    scale_signs: str = "auto",
    routing: str = "auto",
    **shape_overrides: Any,
) -> Path:
    """Write a random-weight GGUF model to ``path`` and return ``path``.

    ``preset`` names a :data:`PRESETS` shape, ``arch`` replaces its architecture and
    ``shape_overrides`` (any :class:`Shape` field: ``n_layer``, ``n_embd``, ``n_expert`` ...) its
    hyperparameters. ``expert_type`` is the type of the FFN weights (``q4_0``, ``q8_0``, ``f16``,
    ``f32``), ``dense_type`` that of attention, embedding and output. ``vocab_path`` is the
    vocab-only GGUF whose ``tokenizer.*`` keys are copied (default :func:`default_vocab_path`).
    ``skew`` skews the routing and ``scale_signs`` sets the signs of the quantized blocks' scales
    (see the module docstring); ``routing`` picks a regime: ``collapsed``, ``uniform``, ``realistic`` or
    ``dispersed`` (see :func:`plan`); ``seed`` makes everything reproducible. The file is written to a temporary name
    beside ``path`` and renamed at the end. Bad arguments
    raise ValueError naming the parameter.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**64:
        raise ValueError(f"seed must be an integer in [0, 2**64), got {seed!r}")
    seed = int(seed)
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be a positive integer, got {threads!r}")
    vocab = _load_vocab(Path(vocab_path) if vocab_path is not None else default_vocab_path())
    p = plan(preset, arch=arch, expert_type=expert_type, dense_type=dense_type, skew=skew,
             n_vocab=vocab.n_tokens, scale_signs=scale_signs, routing=routing, **shape_overrides)
    skew_data, routing_data = _prepare_skew(p, seed), _prepare_routing(p, seed)
    out = Path(path)
    tmp = out.with_name(out.name + ".partial")
    try:
        _write_file(tmp, p, vocab, preset, seed, skew_data, routing_data, threads or min(os.cpu_count() or 1, 16),
                    progress)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()
    return out


def _write_file(tmp: Path, p: Plan, vocab: _Vocab, preset: str, seed: int, skew: _Skew | None,
                routing: synth_routing.Routing | None, threads: int, progress: bool) -> None:
    """Header, metadata, tensor infos (through GGUFWriter), then the streamed data."""
    gguf = _gguf()
    writer = gguf.GGUFWriter(None, p.shape.arch)
    _add_metadata(writer, p, vocab, preset, seed, skew)
    for t in p.tensors:
        writer.add_tensor_info(t.name, t.byte_shape, np.dtype(np.uint8), t.nbytes,
                               raw_dtype=gguf.GGMLQuantizationType(t.type.type_id))
    bar = _progress_bar(p.tensor_bytes, progress)
    try:
        writer.write_header_to_file(path=tmp)
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        assert writer.fout is not None and len(writer.fout) == 1
        _write_data(writer.fout[0], p, seed, skew, routing, threads,
                    bar.update if bar is not None else (lambda n: None))
        writer.fout[0].flush()
    finally:
        writer.close()
        if bar is not None:
            bar.close()


def _progress_bar(total: int, enabled: bool) -> Any:
    """A tqdm bar over ``total`` bytes, or None if disabled or tqdm is missing."""
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover
        return None
    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc="synth", file=sys.stderr)

