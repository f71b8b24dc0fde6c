"""The plan of a synthetic model: every tensor of the file, in each architecture's names and shapes, with its type,
size and how its values are made (see :mod:`pyllama_moe.tools.synth`; :mod:`.shapes` has the architectures and
shapes)."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyllama_moe.tools.synth import routing as synth_routing
from pyllama_moe.tools.synth.shapes import (
    ARCH_DEEPSEEK2,
    ARCH_ERNIE_MOE,
    ARCH_GLM4MOE,
    ARCH_GPT_OSS,
    ARCH_LLAMA4,
    ARCH_OLMOE,
    ARCH_QWEN2MOE,
    ARCH_QWEN3,
    ARCH_QWEN3MOE,
    ARCH_QWEN3NEXT,
    BIAS_STD,
    CONV_STD,
    DEEPSEEK_ROUTING,
    DENSE_STD,
    DENSE_TYPES,
    EXPERT_RMS,
    EXPERT_TYPES,
    GGML_TYPES,
    GGUF_ALIGNMENT,
    MOE_LAYOUT,
    QWEN3NEXT_CONV_KERNEL,
    ROUTER_STD,
    SINK_STD,
    SKEW_ARCHITECTURES,
    GGMLType,
    Shape,
    _ggml_type,
    resolve_shape,
)
from pyllama_moe.tools.synth.vocab import QWEN2_N_VOCAB, _load_vocab

SCALE_SIGNS: tuple[str, ...] = ("auto", "positive", "random")
# collapsed: positive scales (today's default); uniform: random signs; realistic and dispersed: calibrated regimes
# (pyllama_moe.tools.synth.routing)
ROUTINGS: tuple[str, ...] = ("auto", "collapsed", "uniform", *synth_routing.REGIMES)


@dataclass(frozen=True)
class TensorPlan:
    """One tensor of the file.

    ``shape`` is in ggml order (``ne0`` first: the row length), as GGUF stores it; numpy order is
    the reverse. ``init`` says how its values are made: ``normal`` (``std``), ``ones``, ``router``
    (normal plus the skew), ``vbias`` (qwen3moe's skew value bias), ``decay`` (qwen3next's ``ssm_a``: ``-A`` with
    ``A`` uniform in [1, 16], as its ``A_log`` is initialised). ``role`` is one of ``expert``,
    ``ffn``, ``attn``, ``embd``, ``norm``, ``router``, ``bias``.
    """

    name: str
    shape: tuple[int, ...]
    type: GGMLType
    init: str
    std: float
    role: str
    signed: bool = True  # quantized: random scale signs (else all positive)

    @property
    def n_elements(self) -> int:
        """Number of values."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of data (without alignment padding)."""
        return self.type.nbytes(self.n_elements)

    @property
    def byte_shape(self) -> tuple[int, ...]:
        """numpy-order shape of the raw bytes (the last axis is the bytes of one row)."""
        rows = tuple(reversed(self.shape[1:]))
        return (*rows, self.type.nbytes(self.shape[0]))


@dataclass(frozen=True)
class Plan:
    """All tensors of a synthetic model, in file order, and their sizes."""

    shape: Shape
    expert_type: str
    dense_type: str
    n_vocab: int
    skew: float
    tensors: tuple[TensorPlan, ...]
    scale_signs: str = "random"
    routing: str = ""  # a calibrated regime (synth_routing.REGIMES), or "" (the routing follows from skew and signs)

    @property
    def tensor_bytes(self) -> int:
        """Bytes of tensor data without padding."""
        return sum(t.nbytes for t in self.tensors)

    @property
    def expert_bytes(self) -> int:
        """Bytes of the expert tensors (``*_exps.weight``)."""
        return sum(t.nbytes for t in self.tensors if t.role == "expert")

    @property
    def data_bytes(self) -> int:
        """Bytes of the file's data section (tensors padded to the GGUF alignment)."""
        return sum(_pad(t.nbytes) for t in self.tensors)

    @property
    def regime(self) -> str:
        """The routing regime (:func:`regime_of`)."""
        return regime_of(self.routing, self.skew, self.scale_signs)

    def by_name(self) -> dict[str, TensorPlan]:
        """The tensors keyed by name."""
        return {t.name: t for t in self.tensors}

    def rows(self) -> list[tuple[str, tuple[int, ...], str]]:
        """``(name, ggml shape, type name)`` of every tensor."""
        return [(t.name, t.shape, t.type.name) for t in self.tensors]


def regime_of(routing: str, skew: float, scale_signs: str) -> str:
    """A model's routing regime: a calibrated one (``routing``: ``realistic``, ``dispersed``), else ``skew``,
    ``collapsed`` (positive scales) or ``uniform``, as ``skew`` and ``scale_signs`` say (also for files written before
    the ``routing`` key)."""
    if routing:
        return routing
    if skew > 0:
        return "skew"
    return "collapsed" if scale_signs == "positive" else "uniform"


def _pad(n: int, align: int = GGUF_ALIGNMENT) -> int:
    """``n`` rounded up to a multiple of ``align``."""
    return (n + align - 1) // align * align


def plan(
    preset: str = "tiny",
    *,
    arch: str | None = None,
    expert_type: str = "q4_0",
    dense_type: str = "f16",
    skew: float = 0.0,
    n_vocab: int | None = None,
    vocab_path: str | os.PathLike[str] | None = None,
    scale_signs: str = "auto",
    routing: str = "auto",
    **shape_overrides: Any,
) -> Plan:
    """Every tensor that :func:`write_model` would write, with its shape, type and size.

    Writes nothing. ``n_vocab`` defaults to the token count of ``vocab_path`` if given, else to the
    qwen2 vocabulary's 151936. ``scale_signs`` is ``positive``, ``random`` or ``auto`` (positive
    without skew, random with it; see the module docstring). ``routing`` is ``collapsed`` (positive
    scales), ``uniform`` (random ones), ``realistic`` or ``dispersed`` (:mod:`pyllama_moe.tools.synth.routing`;
    qwen3moe only, random scales) or ``auto`` (as ``scale_signs`` and ``skew`` say).
    """
    shape = resolve_shape(preset, arch, **shape_overrides)
    etype = _ggml_type(expert_type, "expert_type", EXPERT_TYPES)
    dtype = _ggml_type(dense_type, "dense_type", DENSE_TYPES)
    skew = _check_skew(skew, shape)
    if n_vocab is None:
        n_vocab = _load_vocab(Path(vocab_path)).n_tokens if vocab_path is not None else QWEN2_N_VOCAB
    if isinstance(n_vocab, bool) or not isinstance(n_vocab, int) or n_vocab < 1:
        raise ValueError(f"n_vocab must be a positive integer, got {n_vocab!r}")
    _check_blocks(shape, etype, dtype)
    if shape.arch == ARCH_DEEPSEEK2 and shape.q_lora_rank and shape.n_layer == 48 and n_vocab == 128256:
        raise ValueError("q_lora_rank must be 0 for a deepseek2 of 48 layers and 128256 tokens (b11549 takes it for "
                         "Kanana-2-30B-A3B, a lite one, and reads no q_lora_rank)")
    if scale_signs not in SCALE_SIGNS:
        raise ValueError(f"scale_signs must be one of {', '.join(SCALE_SIGNS)}, got {scale_signs!r}")
    scale_signs = _routing_signs(routing, scale_signs, skew, shape)
    if scale_signs == "auto":
        scale_signs = "random" if skew > 0 else "positive"
    routed = routing in synth_routing.REGIMES
    tensors = tuple(_tensor_list(shape, etype, dtype, n_vocab, skew > 0))
    if routed:
        synth_routing.layout(shape.n_embd, shape.head_dim, shape.n_expert, shape.n_layer, shape.rope_freq_base,
                             synth_routing.REGIMES[routing].window)
        regime = synth_routing.REGIMES[routing]
        tensors = tuple(dataclasses.replace(t, init="routed") if _routed_tensor(t.name, regime, shape.n_layer) else t
                        for t in tensors)
    if scale_signs == "positive":
        tensors = tuple(dataclasses.replace(t, signed=False) for t in tensors)
    return Plan(shape, etype.name, dtype.name, n_vocab, skew, tensors, scale_signs, routing if routed else "")


def _routing_signs(routing: str, scale_signs: str, skew: float, shape: Shape) -> str:
    """The scale signs that ``routing`` implies; ValueError where it contradicts the other arguments."""
    if routing not in ROUTINGS:
        raise ValueError(f"routing must be one of {', '.join(ROUTINGS)}, got {routing!r}")
    if routing == "auto":
        return scale_signs
    if skew > 0:
        raise ValueError(f"routing={routing!r} and skew={skew} both set the routing: give one")
    want = "positive" if routing == "collapsed" else "random"
    if scale_signs not in ("auto", want):
        raise ValueError(f"routing={routing!r} needs scale_signs={want!r}, got {scale_signs!r}")
    if routing in synth_routing.REGIMES and shape.arch != ARCH_QWEN3MOE:
        raise ValueError(f"routing={routing!r} needs the {ARCH_QWEN3MOE} arch, got {shape.arch}")
    return want


def _routed_tensor(name: str, regime: synth_routing.Regime, n_layer: int) -> bool:
    """Whether calibrated routing regime ``regime`` writes (part of) tensor ``name`` (its router aside): the
    embedding, the recency heads (layer 0's, and the drift head where the regime has a drift), their layers' query
    norms where it sharpens them, every attention output and expert down projection."""
    heads = [0, synth_routing.drift_layer(n_layer)] if regime.a_drift and synth_routing.drift_layer(n_layer) else [0]
    parts = ("attn_q", "attn_k", "attn_v", *(("attn_q_norm",) if regime.sharpness != 1.0 else ()))
    recency = {f"blk.{il}.{part}.weight" for il in heads for part in parts}
    return name == "token_embd.weight" or name in recency or name.endswith((".attn_output.weight",
                                                                            ".ffn_down_exps.weight"))


def _check_skew(skew: float, shape: Shape) -> float:
    """``skew`` as a float; ValueError if negative, not finite, or set for a dense model."""
    if isinstance(skew, bool) or not isinstance(skew, (int, float)) or not math.isfinite(skew) or skew < 0:
        raise ValueError(f"skew must be a finite number >= 0, got {skew!r}")
    if skew > 0 and shape.arch not in SKEW_ARCHITECTURES:
        raise ValueError(f"skew needs the {' or '.join(sorted(SKEW_ARCHITECTURES))} arch, "
                         f"got {shape.arch}")
    return float(skew)


def _check_blocks(shape: Shape, etype: GGMLType, dtype: GGMLType) -> None:
    """ValueError if a row of a quantized tensor is not a whole number of blocks."""
    ffn_rows = {"n_embd": shape.n_embd}
    ffn_rows.update({"n_ff_exp": shape.n_ff_exp} if shape.is_moe else {"n_ff": shape.n_ff})
    if shape.arch in (ARCH_QWEN2MOE, ARCH_QWEN3NEXT, *MOE_LAYOUT):  # a shared expert, dense layers beside the MoE ones
        ffn_rows["n_ff"] = shape.n_ff
    for name, n in ffn_rows.items():
        if n % etype.block_size:
            raise ValueError(f"expert_type {etype.name} needs {name} to be a multiple of {etype.block_size}, got {n}")
    dense_rows = {"n_embd": shape.n_embd, "n_head * head_dim": shape.n_embd_q}
    if shape.arch == ARCH_DEEPSEEK2:  # the latent attention's projections
        v = shape.head_dim_v
        dense_rows = {"n_embd": shape.n_embd, "q_lora_rank": shape.q_lora_rank, "kv_lora_rank": shape.kv_lora_rank,
                      "head_dim - n_rot": v, "n_head * (head_dim - n_rot)": shape.n_head * v}
    for name, n in dense_rows.items():
        if n % dtype.block_size:
            raise ValueError(f"dense_type {dtype.name} needs {name} to be a multiple of {dtype.block_size}, got {n}")


def _tensor_list(shape: Shape, etype: GGMLType, dtype: GGMLType, n_vocab: int, skewed: bool) -> Iterator[TensorPlan]:
    """The tensors of ``shape``'s architecture, in file order."""
    f32 = GGML_TYPES["f32"]
    yield TensorPlan("token_embd.weight", (shape.n_embd, n_vocab), dtype, "normal", DENSE_STD, "embd")
    for il in range(shape.n_block):
        yield from _layer_tensors(shape, il, etype, dtype, skewed)
        if il >= shape.n_layer:
            yield from _nextn_tensors(shape, il, dtype)
    yield TensorPlan("output_norm.weight", (shape.n_embd,), f32, "ones", 0.0, "norm")
    yield TensorPlan("output.weight", (shape.n_embd, n_vocab), dtype, "normal", DENSE_STD, "embd")


def _layer_tensors(shape: Shape, il: int, etype: GGMLType, dtype: GGMLType, skewed: bool) -> Iterator[TensorPlan]:
    """The tensors of block ``il``."""
    norm = GGML_TYPES["f32"]
    yield TensorPlan(f"blk.{il}.attn_norm.weight", (shape.n_embd,), norm, "ones", 0.0, "norm")
    if shape.arch == ARCH_DEEPSEEK2:
        yield from _mla_tensors(shape, il, dtype)
        yield TensorPlan(f"blk.{il}.ffn_norm.weight", (shape.n_embd,), norm, "ones", 0.0, "norm")
    elif shape.is_recurrent_layer(il):
        yield from _delta_net_tensors(shape, il, dtype)
        yield TensorPlan(f"blk.{il}.post_attention_norm.weight", (shape.n_embd,), norm, "ones", 0.0, "norm")
    else:
        yield from _attention_tensors(shape, il, dtype, skewed)
    yield from _ffn_tensors(shape, il, etype)


def _attention_tensors(shape: Shape, il: int, dtype: GGMLType, skewed: bool) -> Iterator[TensorPlan]:
    """The attention tensors of block ``il`` (but deepseek2's) and the norm of the FFN's input."""
    f32 = GGML_TYPES["f32"]
    gpt_oss = shape.arch == ARCH_GPT_OSS
    n_embd, n_q, n_kv = shape.n_embd, shape.n_embd_q, shape.n_embd_kv

    def t(name: str, dims: tuple[int, ...], typ: GGMLType, init: str, std: float, role: str) -> TensorPlan:
        return TensorPlan(f"blk.{il}.{name}", dims, typ, init, std, role)

    gated = shape.arch == ARCH_QWEN3NEXT  # each head's query, then its output's gate
    yield t("attn_q.weight", (n_embd, 2 * n_q if gated else n_q), dtype, "normal", DENSE_STD, "attn")
    yield t("attn_k.weight", (n_embd, n_kv), dtype, "normal", DENSE_STD, "attn")
    yield t("attn_v.weight", (n_embd, n_kv), dtype, "normal", DENSE_STD, "attn")
    if gpt_oss:
        yield t("attn_q.bias", (n_q,), f32, "normal", BIAS_STD, "bias")
        yield t("attn_k.bias", (n_kv,), f32, "normal", BIAS_STD, "bias")
        yield t("attn_v.bias", (n_kv,), f32, "normal", BIAS_STD, "bias")
    elif shape.arch == ARCH_QWEN3MOE and skewed:
        yield t("attn_v.bias", (n_kv,), f32, "vbias", 0.0, "bias")
    elif shape.arch in (ARCH_QWEN2MOE, ARCH_GLM4MOE):
        yield t("attn_q.bias", (n_q,), f32, "normal", BIAS_STD, "bias")
        yield t("attn_k.bias", (n_kv,), f32, "normal", BIAS_STD, "bias")
        yield t("attn_v.bias", (n_kv,), f32, "normal", BIAS_STD, "bias")
    yield t("attn_output.weight", (n_q, n_embd), dtype, "normal", DENSE_STD, "attn")
    if gpt_oss:
        yield t("attn_output.bias", (n_embd,), f32, "normal", BIAS_STD, "bias")
        yield t("attn_sinks.weight", (shape.n_head,), f32, "normal", SINK_STD, "attn")
        yield t("post_attention_norm.weight", (n_embd,), f32, "ones", 0.0, "norm")
    else:
        if shape.arch in (ARCH_QWEN3MOE, ARCH_QWEN3, ARCH_QWEN3NEXT):  # per head
            yield t("attn_q_norm.weight", (shape.head_dim,), f32, "ones", 0.0, "norm")
            yield t("attn_k_norm.weight", (shape.head_dim,), f32, "ones", 0.0, "norm")
        elif shape.arch == ARCH_OLMOE:  # over the whole width
            yield t("attn_q_norm.weight", (n_q,), f32, "ones", 0.0, "norm")
            yield t("attn_k_norm.weight", (n_kv,), f32, "ones", 0.0, "norm")
        post_attn = "post_attention_norm" if shape.arch in (ARCH_GLM4MOE, ARCH_QWEN3NEXT) else "ffn_norm"  # FFN input
        yield t(f"{post_attn}.weight", (n_embd,), f32, "ones", 0.0, "norm")


def _delta_net_tensors(shape: Shape, il: int, dtype: GGMLType) -> Iterator[TensorPlan]:
    """qwen3next's linear attention in block ``il``: the projections to the queries, keys and values (through a short
    convolution) and to the output's gate, the per-head decay (``ssm_a``, negative: ``-exp(A_log)``) and its time
    step's bias, the projection to beta and alpha, the gated norm, the output. ``n_head_kv`` key heads and ``n_head``
    value heads of ``head_dim``."""
    f32 = GGML_TYPES["f32"]
    n_embd, key_dim, value_dim, n_v = shape.n_embd, shape.n_embd_kv, shape.n_embd_q, shape.n_head
    conv_dim = 2 * key_dim + value_dim

    def t(name: str, dims: tuple[int, ...], typ: GGMLType, init: str, std: float, role: str) -> TensorPlan:
        return TensorPlan(f"blk.{il}.{name}", dims, typ, init, std, role)

    yield t("attn_qkv.weight", (n_embd, conv_dim), dtype, "normal", DENSE_STD, "attn")
    yield t("attn_gate.weight", (n_embd, value_dim), dtype, "normal", DENSE_STD, "attn")
    yield t("ssm_conv1d.weight", (QWEN3NEXT_CONV_KERNEL, conv_dim), f32, "normal", CONV_STD, "attn")
    yield t("ssm_dt.bias", (n_v,), f32, "normal", BIAS_STD, "bias")
    yield t("ssm_a", (n_v,), f32, "decay", 0.0, "attn")
    yield t("ssm_ba.weight", (n_embd, 2 * n_v), dtype, "normal", DENSE_STD, "attn")
    yield t("ssm_norm.weight", (shape.head_dim,), f32, "ones", 0.0, "norm")
    yield t("ssm_out.weight", (value_dim, n_embd), dtype, "normal", DENSE_STD, "attn")


def _mla_tensors(shape: Shape, il: int, dtype: GGMLType) -> Iterator[TensorPlan]:
    """deepseek2's multi-head latent attention in block ``il``: queries through a low-rank step (``q_lora_rank``) or
    one projection, keys and values through the latent (``kv_lora_rank``) and the rotated part of the key beside it,
    the latent's projections to each head's key (unrotated part) and value, the output."""
    f32 = GGML_TYPES["f32"]
    n_embd, n_head, q_rank, kv_rank = shape.n_embd, shape.n_head, shape.q_lora_rank, shape.kv_lora_rank
    nope, v = shape.head_dim - shape.rot, shape.head_dim_v

    def t(name: str, dims: tuple[int, ...], typ: GGMLType, init: str, std: float, role: str) -> TensorPlan:
        return TensorPlan(f"blk.{il}.{name}", dims, typ, init, std, role)

    if q_rank:
        yield t("attn_q_a_norm.weight", (q_rank,), f32, "ones", 0.0, "norm")
    yield t("attn_kv_a_norm.weight", (kv_rank,), f32, "ones", 0.0, "norm")
    if q_rank:
        yield t("attn_q_a.weight", (n_embd, q_rank), dtype, "normal", DENSE_STD, "attn")
        yield t("attn_q_b.weight", (q_rank, shape.n_embd_q), dtype, "normal", DENSE_STD, "attn")
    else:
        yield t("attn_q.weight", (n_embd, shape.n_embd_q), dtype, "normal", DENSE_STD, "attn")
    yield t("attn_kv_a_mqa.weight", (n_embd, kv_rank + shape.rot), dtype, "normal", DENSE_STD, "attn")
    yield t("attn_k_b.weight", (nope, kv_rank, n_head), dtype, "normal", DENSE_STD, "attn")
    yield t("attn_v_b.weight", (kv_rank, v, n_head), dtype, "normal", DENSE_STD, "attn")
    yield t("attn_output.weight", (n_head * v, n_embd), dtype, "normal", DENSE_STD, "attn")


def _ffn_tensors(shape: Shape, il: int, etype: GGMLType) -> Iterator[TensorPlan]:
    """The FFN tensors of block ``il``: a dense FFN, or the router, the experts and the shared expert."""
    f32 = GGML_TYPES["f32"]
    gpt_oss = shape.arch == ARCH_GPT_OSS
    n_embd = shape.n_embd

    def t(name: str, dims: tuple[int, ...], typ: GGMLType, init: str, std: float, role: str) -> TensorPlan:
        return TensorPlan(f"blk.{il}.{name}", dims, typ, init, std, role)

    if not shape.is_moe_layer(il):  # a dense model, or a dense layer of a MoE one
        yield t("ffn_gate.weight", (n_embd, shape.n_ff), etype, "normal", EXPERT_RMS, "ffn")
        yield t("ffn_up.weight", (n_embd, shape.n_ff), etype, "normal", EXPERT_RMS, "ffn")
        yield t("ffn_down.weight", (shape.n_ff, n_embd), etype, "normal", EXPERT_RMS, "ffn")
        return
    n_exp, n_ff_exp = shape.n_expert, shape.n_ff_exp
    yield t("ffn_gate_inp.weight", (n_embd, n_exp), f32, "router", ROUTER_STD, "router")
    if gpt_oss:
        yield t("ffn_gate_inp.bias", (n_exp,), f32, "router", BIAS_STD, "bias")
    if shape.arch == ARCH_ERNIE_MOE or shape.selection_bias:  # added to the gate's probabilities to rank, not to weigh
        yield t("exp_probs_b.bias", (n_exp,), f32, "normal", ROUTER_STD, "bias")
    yield t("ffn_gate_exps.weight", (n_embd, n_ff_exp, n_exp), etype, "normal", EXPERT_RMS, "expert")
    yield t("ffn_up_exps.weight", (n_embd, n_ff_exp, n_exp), etype, "normal", EXPERT_RMS, "expert")
    yield t("ffn_down_exps.weight", (n_ff_exp, n_embd, n_exp), etype, "normal", EXPERT_RMS, "expert")
    if gpt_oss:
        yield t("ffn_gate_exps.bias", (n_ff_exp, n_exp), f32, "normal", BIAS_STD, "bias")
        yield t("ffn_up_exps.bias", (n_ff_exp, n_exp), f32, "normal", BIAS_STD, "bias")
        yield t("ffn_down_exps.bias", (n_embd, n_exp), f32, "normal", BIAS_STD, "bias")
    if shape.arch in (ARCH_QWEN2MOE, ARCH_QWEN3NEXT):  # the shared expert's gate
        yield t("ffn_gate_inp_shexp.weight", (n_embd,), f32, "normal", ROUTER_STD, "router")
    n_sh = _shared_expert_width(shape)
    if n_sh:  # the shared experts as one FFN, always on the device
        yield t("ffn_gate_shexp.weight", (n_embd, n_sh), etype, "normal", EXPERT_RMS, "ffn")
        yield t("ffn_up_shexp.weight", (n_embd, n_sh), etype, "normal", EXPERT_RMS, "ffn")
        yield t("ffn_down_shexp.weight", (n_sh, n_embd), etype, "normal", EXPERT_RMS, "ffn")


def _shared_expert_width(shape: Shape) -> int:
    """The width of a MoE layer's shared expert FFN (0: none)."""
    if shape.arch in DEEPSEEK_ROUTING:  # n_expert_shared experts of n_ff_exp
        return shape.n_ff_exp * shape.n_expert_shared
    if shape.arch == ARCH_LLAMA4:  # as wide as the experts
        return shape.n_ff_exp
    return shape.n_ff if shape.arch in (ARCH_QWEN2MOE, ARCH_ERNIE_MOE, ARCH_QWEN3NEXT) else 0


def _nextn_tensors(shape: Shape, il: int, dtype: GGMLType) -> Iterator[TensorPlan]:
    """The tensors of NextN layer ``il`` besides those of a trunk layer: the projection of the token's embedding and
    the trunk's last hidden state, their norms and the head's norm. Its own embedding and head (``embed_tokens``,
    ``shared_head_head``: optional in b11549, vocabulary-sized) are left out, as in GLM's files: the trunk's serve."""
    f32 = GGML_TYPES["f32"]
    n_embd = shape.n_embd
    yield TensorPlan(f"blk.{il}.nextn.eh_proj.weight", (2 * n_embd, n_embd), dtype, "normal", DENSE_STD, "attn")
    yield TensorPlan(f"blk.{il}.nextn.enorm.weight", (n_embd,), f32, "ones", 0.0, "norm")
    yield TensorPlan(f"blk.{il}.nextn.hnorm.weight", (n_embd,), f32, "ones", 0.0, "norm")
    yield TensorPlan(f"blk.{il}.nextn.shared_head_norm.weight", (n_embd,), f32, "ones", 0.0, "norm")
