"""Write random-weight GGUF models that llama.cpp (b11549) loads: ``qwen3moe``, ``gpt-oss``, ``qwen3``.

The models have the exact tensor names, shapes and metadata keys of the real architectures and a
real tokenizer (every ``tokenizer.*`` key copied from a vocab-only GGUF, by default upstream's
``ggml-vocab-qwen2.gguf``), but random weights. They exist to measure and test inference (memory
placement, offload, expert caching), not to produce meaningful text.

Weights
    * FFN weights (the experts of MoE models, the FFN of dense ones) in ``expert_type``: ``q4_0``
      blocks are an f16 scale of 0.02 and 16 bytes of uniformly random nibbles; ``q8_0``, ``f16``
      and ``f32`` use a scale / standard deviation giving the same root mean square
      (``EXPERT_RMS`` = 0.02 * sqrt(21.5), that of the q4_0 values ``0.02 * (nibble - 8)``).
      ``scale_signs`` sets the sign of each block's scale. ``positive`` (the default without
      skew) is the model of ``baseline-h200.md`` that upstream's figures were measured on: every
      q4_0 weight then has the mean -0.01, a direction that all hidden states share, so routing
      collapses onto a few experts in deep layers and consecutive tokens reuse most experts (what
      makes a small MoE cache hit). ``random`` (the default with skew) gives symmetric, zero-mean
      weights, as in real q4_0 files where ``d = max / -8``, so only the skew shapes the routing.
    * Attention, token embeddings and output in ``dense_type`` (default ``f16``), normal with
      standard deviation ``DENSE_STD`` (0.02; quantized dense types match its root mean square).
    * Router (``ffn_gate_inp``) in f32, normal with standard deviation ``ROUTER_STD`` (0.05).
    * Norm weights f32 ones; gpt-oss biases f32 normal (``BIAS_STD``), its attention sinks f32
      normal (``SINK_STD``).
    Quantized blocks are written directly from random bytes (no quantizer runs), generated in
    fixed-size chunks from a counter-based seed (``seed``, the tensor's name, the chunk's index),
    so the same arguments always give a byte-identical file, whatever the number of threads.

Router skew (``skew > 0``, MoE architectures only)
    Real MoE models route unevenly: a few experts per layer are hot, and consecutive tokens tend to
    reuse experts. With ``skew`` the model imitates this:

    * Each layer gets ``n_hot = max(1, n_expert_used // 2)`` hot experts, drawn from the seed.
      The hot expert of rank ``r`` gets a router-logit boost of ``z_r = 3 * skew / sqrt(1 + r)``
      standard deviations of the random router logits (which are ``ROUTER_STD * sqrt(n_embd)``,
      the router input being RMS-normalised). Measured with a numpy forward pass of a 6-layer,
      64-expert, top-8 qwen3moe over random tokens (where each expert's share is 1/8 on average):
      at ``skew = 0.3`` the hot experts are picked for roughly 20-75% of the tokens and a token
      shares about 20% of its experts with the previous one (13% without skew); at ``skew = 1``
      they are picked for mostly 60-100% of the tokens and the share is 35-50%.
    * ``gpt-oss`` has a router bias: the boost is added to it (exact).
    * ``qwen3moe`` has no router bias, so the hidden states are made to carry a shared direction
      that the hot experts' router rows point to. Each layer gets a value bias (``attn_v.bias``,
      an optional tensor of llama.cpp's qwen3moe loader). Attention weights sum to one, so the
      attention output of every token then contains exactly ``W_o b_v``: the residual stream
      carries ``C_l = sum_{j<=l} W_o^(j) b_v^(j)``, the same for all tokens. Its size is set so
      that it makes up about ``SHARED_FRACTION`` (one half) of the router input's norm, using the
      residual stream's root mean square predicted from the weight statistics; the hot rows of
      layer ``l``'s router get ``z_r * ROUTER_STD / SHARED_FRACTION`` times the unit vector of
      ``C_l``, which gives them the boost above (first every row loses its chance component
      along ``C_l``, so that no other expert is favoured or disfavoured for all tokens).
    * Routing stays similar from one token to the next because every token carries the shared
      part (the hot experts recur) and attention mixes earlier tokens into each hidden state; the
      remaining picks vary with the token.

    Apart from the router weights and biases (and qwen3moe's added value biases) a skewed model
    has the same tensors as the unskewed one of the same seed and ``scale_signs``. The skew, the
    seed, the preset, the scale signs and the hot experts are recorded under the
    ``pyllama_moe.synth.`` metadata keys.

Public API: :func:`write_model`, :func:`plan`, :class:`Shape`, :data:`PRESETS`,
:func:`resolve_shape`, :func:`default_vocab_path`, :func:`main` (the ``synth`` command).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import math
import os
import struct
import sys
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np
import numpy.typing as npt

from pyllama_moe import synth_routing

if TYPE_CHECKING:  # pragma: no cover
    import gguf

__all__ = [
    "ARCHITECTURES",
    "DENSE_TYPES",
    "SCALE_SIGNS",
    "EXPERT_TYPES",
    "PRESETS",
    "Plan",
    "Shape",
    "TensorPlan",
    "default_vocab_path",
    "main",
    "plan",
    "resolve_shape",
    "write_model",
]

ARCH_QWEN3MOE = "qwen3moe"
ARCH_GPT_OSS = "gpt-oss"
ARCH_QWEN3 = "qwen3"
ARCHITECTURES: tuple[str, ...] = (ARCH_QWEN3MOE, ARCH_GPT_OSS, ARCH_QWEN3)
MOE_ARCHITECTURES: frozenset[str] = frozenset({ARCH_QWEN3MOE, ARCH_GPT_OSS})

VOCAB_ENV = "PYLLAMA_MOE_VOCAB"
VOCAB_FILE = "ggml-vocab-qwen2.gguf"
QWEN2_N_VOCAB = 151936  # tokens in ggml-vocab-qwen2.gguf, used by plan() when no vocab is given

META_PREFIX = "pyllama_moe.synth."
FORMAT_VERSION = 2  # 2: scale_signs (unskewed models have positive scales)

DENSE_STD = 0.02
ROUTER_STD = 0.05
BIAS_STD = 0.001  # small: a constant bias is a direction every token shares, which skews routing
SINK_STD = 0.5
Q4_0_SCALE = 0.02
EXPERT_RMS = Q4_0_SCALE * math.sqrt(21.5)  # E[(nibble - 8)^2] = 21.25 + 0.25 for uniform nibbles
SKEW_BOOST = 3.0
SHARED_FRACTION = 0.5
ATTN_MIXING = 0.1  # variance kept by attention's averaging over the context (measured ~0.1)

LLAMA_MAX_LAYERS = 512
LLAMA_MAX_EXPERTS = 1024
GGUF_ALIGNMENT = 32

_CHUNK_ELEMENTS = 1 << 23  # float tensors are generated in chunks of this many values
_CHUNK_BLOCKS = 1 << 20  # quantized tensors in chunks of this many blocks


# --------------------------------------------------------------------------------------------
# tensor types


@dataclass(frozen=True)
class GGMLType:
    """A ggml tensor type: its name, ggml id, values per block and bytes per block."""

    name: str
    type_id: int
    block_size: int
    type_size: int
    file_type: int  # the llama_ftype "mostly <type>" value for general.file_type

    @property
    def quantized(self) -> bool:
        """Whether values come in blocks with a scale."""
        return self.block_size > 1

    def nbytes(self, n_elements: int) -> int:
        """Bytes taken by ``n_elements`` values (a multiple of the block size)."""
        return n_elements // self.block_size * self.type_size


GGML_TYPES: dict[str, GGMLType] = {
    "f32": GGMLType("f32", 0, 1, 4, 0),
    "f16": GGMLType("f16", 1, 1, 2, 1),
    "q4_0": GGMLType("q4_0", 2, 32, 18, 2),
    "q8_0": GGMLType("q8_0", 8, 32, 34, 7),
}
EXPERT_TYPES: tuple[str, ...] = ("q4_0", "q8_0", "f16", "f32")
DENSE_TYPES: tuple[str, ...] = ("f16", "f32", "q8_0", "q4_0")
SCALE_SIGNS: tuple[str, ...] = ("auto", "positive", "random")
# collapsed: positive scales (today's default); uniform: random signs; realistic: pyllama_moe.synth_routing
ROUTINGS: tuple[str, ...] = ("auto", "collapsed", "uniform", "realistic")

# root mean square of the integer part of each quantized type's random values
_Q_RMS: dict[str, float] = {
    "q4_0": math.sqrt(21.5),
    "q8_0": math.sqrt(5461.5),  # E[q^2] for q uniform in [-128, 127]
}


def _ggml_type(name: str, param: str, allowed: Sequence[str]) -> GGMLType:
    """The :class:`GGMLType` called ``name``; ValueError naming ``param`` if not in ``allowed``."""
    if not isinstance(name, str) or name.lower() not in allowed:
        raise ValueError(f"{param} must be one of {', '.join(allowed)}, got {name!r}")
    return GGML_TYPES[name.lower()]


# --------------------------------------------------------------------------------------------
# shapes and presets


@dataclass(frozen=True)
class Shape:
    """The hyperparameters of a synthetic model.

    ``n_ff`` is the FFN width of dense models (``qwen3``); MoE models record it as
    ``feed_forward_length`` only. ``n_expert``, ``n_expert_used`` and ``n_ff_exp`` are 0 for dense
    models. ``sliding_window`` is used by ``gpt-oss`` only (every other layer is sliding-window).
    """

    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_expert: int
    n_expert_used: int
    n_ff_exp: int
    n_ff: int
    context_length: int
    rope_freq_base: float = 1_000_000.0
    rms_eps: float = 1e-6
    sliding_window: int = 128

    @property
    def is_moe(self) -> bool:
        """Whether the architecture is a mixture of experts."""
        return self.arch in MOE_ARCHITECTURES

    @property
    def n_embd_q(self) -> int:
        """Width of the query projection (``n_head * head_dim``)."""
        return self.n_head * self.head_dim

    @property
    def n_embd_kv(self) -> int:
        """Width of the key and value projections (``n_head_kv * head_dim``)."""
        return self.n_head_kv * self.head_dim

    def replace(self, **changes: Any) -> Shape:
        """A copy with ``changes`` applied (not validated)."""
        return dataclasses.replace(self, **changes)

    def validate(self) -> None:
        """Raise ValueError naming the first parameter that llama.cpp would reject."""
        if self.arch not in ARCHITECTURES:
            raise ValueError(f"arch must be one of {', '.join(ARCHITECTURES)}, got {self.arch!r}")
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "arch":
                continue
            if f.type in ("int", int):
                if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                    raise ValueError(f"{f.name} must be an integer, got {value!r}")
                if value < 0:
                    raise ValueError(f"{f.name} must not be negative, got {value}")
            elif isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{f.name} must be a positive finite number, got {value!r}")
        for name in ("n_layer", "n_embd", "n_head", "n_head_kv", "head_dim", "context_length", "sliding_window"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.n_layer > LLAMA_MAX_LAYERS:
            raise ValueError(f"n_layer must be at most {LLAMA_MAX_LAYERS}, got {self.n_layer}")
        if self.n_head % self.n_head_kv:
            raise ValueError(f"n_head ({self.n_head}) must be a multiple of n_head_kv ({self.n_head_kv})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even (RoPE rotates pairs), got {self.head_dim}")
        if self.is_moe:
            self._validate_moe()
        else:
            for name in ("n_expert", "n_expert_used", "n_ff_exp"):
                if getattr(self, name):
                    raise ValueError(f"{name} must be 0 for the dense architecture {self.arch}, got {getattr(self, name)}")
            if self.n_ff < 1:
                raise ValueError(f"n_ff must be at least 1 for the dense architecture {self.arch}, got {self.n_ff}")

    def _validate_moe(self) -> None:
        """The MoE part of :meth:`validate`."""
        if not 1 <= self.n_expert <= LLAMA_MAX_EXPERTS:
            raise ValueError(f"n_expert must be in [1, {LLAMA_MAX_EXPERTS}] for {self.arch}, got {self.n_expert}")
        if self.n_expert_used < 1:
            raise ValueError(f"n_expert_used must be at least 1 for {self.arch}, got {self.n_expert_used}")
        if self.n_expert_used > self.n_expert:
            raise ValueError(f"n_expert_used ({self.n_expert_used}) must not exceed n_expert ({self.n_expert})")
        if self.n_ff_exp < 1:
            raise ValueError(f"n_ff_exp must be at least 1 for {self.arch}, got {self.n_ff_exp}")


PRESETS: dict[str, Shape] = {
    # about 250 KiB of layers besides the vocabulary-sized embedding and output (19 MiB each in f16)
    "tiny": Shape(
        arch=ARCH_QWEN3MOE, n_layer=2, n_embd=64, n_head=4, n_head_kv=2, head_dim=16,
        n_expert=8, n_expert_used=2, n_ff_exp=32, n_ff=128, context_length=4096,
    ),
    # Qwen3-30B-A3B's shape: about 18.08 GiB with q4_0 experts (15552 MiB of them)
    "30b-a3b": Shape(
        arch=ARCH_QWEN3MOE, n_layer=48, n_embd=2048, n_head=32, n_head_kv=4, head_dim=128,
        n_expert=128, n_expert_used=8, n_ff_exp=768, n_ff=6144, context_length=40960,
    ),
}

SHAPE_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Shape) if f.name != "arch")
_EXPERT_FIELDS = ("n_expert", "n_expert_used", "n_ff_exp")


def resolve_shape(preset: str = "tiny", arch: str | None = None, **overrides: Any) -> Shape:
    """The validated :class:`Shape` of ``preset`` with ``arch`` and shape ``overrides`` applied.

    A dense ``arch`` drops the preset's experts (``n_expert`` etc. become 0) unless they are
    overridden, which is then an error.
    """
    if not isinstance(preset, str) or preset not in PRESETS:
        raise ValueError(f"preset must be one of {', '.join(PRESETS)}, got {preset!r}")
    unknown = sorted(set(overrides) - set(SHAPE_FIELDS))
    if unknown:
        raise ValueError(f"unknown shape parameter {unknown[0]!r}; known: {', '.join(SHAPE_FIELDS)}")
    shape = PRESETS[preset]
    if arch is not None:
        if not isinstance(arch, str) or arch not in ARCHITECTURES:
            raise ValueError(f"arch must be one of {', '.join(ARCHITECTURES)}, got {arch!r}")
        shape = shape.replace(arch=arch)
        if arch not in MOE_ARCHITECTURES:
            shape = shape.replace(**{f: 0 for f in _EXPERT_FIELDS})
    shape = shape.replace(**{k: v for k, v in overrides.items() if v is not None})
    shape.validate()
    return shape


# --------------------------------------------------------------------------------------------
# the plan: every tensor of the file


@dataclass(frozen=True)
class TensorPlan:
    """One tensor of the file.

    ``shape`` is in ggml order (``ne0`` first: the row length), as GGUF stores it; numpy order is
    the reverse. ``init`` says how its values are made: ``normal`` (``std``), ``ones``, ``router``
    (normal plus the skew), ``vbias`` (qwen3moe's skew value bias). ``role`` is one of ``expert``,
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
    routing: str = ""  # "realistic", or "" (the routing follows from skew and scale_signs)

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
    """A model's routing regime: ``realistic`` (``routing``), else ``skew``, ``collapsed`` (positive scales) or
    ``uniform``, as ``skew`` and ``scale_signs`` say (also for files written before the ``routing`` key)."""
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
    scales), ``uniform`` (random ones), ``realistic`` (:mod:`pyllama_moe.synth_routing`; qwen3moe only,
    random scales) or ``auto`` (as ``scale_signs`` and ``skew`` say).
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
    if scale_signs not in SCALE_SIGNS:
        raise ValueError(f"scale_signs must be one of {', '.join(SCALE_SIGNS)}, got {scale_signs!r}")
    scale_signs = _routing_signs(routing, scale_signs, skew, shape)
    if scale_signs == "auto":
        scale_signs = "random" if skew > 0 else "positive"
    realistic = routing == "realistic"
    tensors = tuple(_tensor_list(shape, etype, dtype, n_vocab, skew > 0))
    if realistic:
        synth_routing.layout(shape.n_embd, shape.head_dim, shape.n_expert, shape.n_layer, shape.rope_freq_base)
        tensors = tuple(dataclasses.replace(t, init="realistic") if _realistic_tensor(t.name) else t for t in tensors)
    if scale_signs == "positive":
        tensors = tuple(dataclasses.replace(t, signed=False) for t in tensors)
    return Plan(shape, etype.name, dtype.name, n_vocab, skew, tensors, scale_signs, "realistic" if realistic else "")


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
    if routing == "realistic" and shape.arch != ARCH_QWEN3MOE:
        raise ValueError(f"routing='realistic' needs the {ARCH_QWEN3MOE} arch, got {shape.arch}")
    return want


def _realistic_tensor(name: str) -> bool:
    """Whether the realistic routing writes (part of) tensor ``name`` (its router aside)."""
    recency_head = ("blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight")
    return name == "token_embd.weight" or name in recency_head or name.endswith((".attn_output.weight",
                                                                                ".ffn_down_exps.weight"))


def _check_skew(skew: float, shape: Shape) -> float:
    """``skew`` as a float; ValueError if negative, not finite, or set for a dense model."""
    if isinstance(skew, bool) or not isinstance(skew, (int, float)) or not math.isfinite(skew) or skew < 0:
        raise ValueError(f"skew must be a finite number >= 0, got {skew!r}")
    if skew > 0 and not shape.is_moe:
        raise ValueError(f"skew needs a mixture-of-experts arch ({', '.join(sorted(MOE_ARCHITECTURES))}), got {shape.arch}")
    return float(skew)


def _check_blocks(shape: Shape, etype: GGMLType, dtype: GGMLType) -> None:
    """ValueError if a row of a quantized tensor is not a whole number of blocks."""
    ffn_rows = {"n_embd": shape.n_embd}
    ffn_rows.update({"n_ff_exp": shape.n_ff_exp} if shape.is_moe else {"n_ff": shape.n_ff})
    for name, n in ffn_rows.items():
        if n % etype.block_size:
            raise ValueError(f"expert_type {etype.name} needs {name} to be a multiple of {etype.block_size}, got {n}")
    for name, n in {"n_embd": shape.n_embd, "n_head * head_dim": shape.n_embd_q}.items():
        if n % dtype.block_size:
            raise ValueError(f"dense_type {dtype.name} needs {name} to be a multiple of {dtype.block_size}, got {n}")


def _tensor_list(shape: Shape, etype: GGMLType, dtype: GGMLType, n_vocab: int, skewed: bool) -> Iterator[TensorPlan]:
    """The tensors of ``shape``'s architecture, in file order."""
    f32 = GGML_TYPES["f32"]
    yield TensorPlan("token_embd.weight", (shape.n_embd, n_vocab), dtype, "normal", DENSE_STD, "embd")
    for il in range(shape.n_layer):
        yield from _layer_tensors(shape, il, etype, dtype, skewed)
    yield TensorPlan("output_norm.weight", (shape.n_embd,), f32, "ones", 0.0, "norm")
    yield TensorPlan("output.weight", (shape.n_embd, n_vocab), dtype, "normal", DENSE_STD, "embd")


def _layer_tensors(shape: Shape, il: int, etype: GGMLType, dtype: GGMLType, skewed: bool) -> Iterator[TensorPlan]:
    """The tensors of block ``il``."""
    f32 = GGML_TYPES["f32"]
    gpt_oss = shape.arch == ARCH_GPT_OSS
    n_embd, n_q, n_kv = shape.n_embd, shape.n_embd_q, shape.n_embd_kv

    def t(name: str, dims: tuple[int, ...], typ: GGMLType, init: str, std: float, role: str) -> TensorPlan:
        return TensorPlan(f"blk.{il}.{name}", dims, typ, init, std, role)

    yield t("attn_norm.weight", (n_embd,), f32, "ones", 0.0, "norm")
    yield t("attn_q.weight", (n_embd, n_q), dtype, "normal", DENSE_STD, "attn")
    yield t("attn_k.weight", (n_embd, n_kv), dtype, "normal", DENSE_STD, "attn")
    yield t("attn_v.weight", (n_embd, n_kv), dtype, "normal", DENSE_STD, "attn")
    if gpt_oss:
        yield t("attn_q.bias", (n_q,), f32, "normal", BIAS_STD, "bias")
        yield t("attn_k.bias", (n_kv,), f32, "normal", BIAS_STD, "bias")
        yield t("attn_v.bias", (n_kv,), f32, "normal", BIAS_STD, "bias")
    elif shape.arch == ARCH_QWEN3MOE and skewed:
        yield t("attn_v.bias", (n_kv,), f32, "vbias", 0.0, "bias")
    yield t("attn_output.weight", (n_q, n_embd), dtype, "normal", DENSE_STD, "attn")
    if gpt_oss:
        yield t("attn_output.bias", (n_embd,), f32, "normal", BIAS_STD, "bias")
        yield t("attn_sinks.weight", (shape.n_head,), f32, "normal", SINK_STD, "attn")
        yield t("post_attention_norm.weight", (n_embd,), f32, "ones", 0.0, "norm")
    else:
        yield t("attn_q_norm.weight", (shape.head_dim,), f32, "ones", 0.0, "norm")
        yield t("attn_k_norm.weight", (shape.head_dim,), f32, "ones", 0.0, "norm")
        yield t("ffn_norm.weight", (n_embd,), f32, "ones", 0.0, "norm")
    if not shape.is_moe:
        yield t("ffn_gate.weight", (n_embd, shape.n_ff), etype, "normal", EXPERT_RMS, "ffn")
        yield t("ffn_up.weight", (n_embd, shape.n_ff), etype, "normal", EXPERT_RMS, "ffn")
        yield t("ffn_down.weight", (shape.n_ff, n_embd), etype, "normal", EXPERT_RMS, "ffn")
        return
    n_exp, n_ff_exp = shape.n_expert, shape.n_ff_exp
    yield t("ffn_gate_inp.weight", (n_embd, n_exp), f32, "router", ROUTER_STD, "router")
    if gpt_oss:
        yield t("ffn_gate_inp.bias", (n_exp,), f32, "router", BIAS_STD, "bias")
    yield t("ffn_gate_exps.weight", (n_embd, n_ff_exp, n_exp), etype, "normal", EXPERT_RMS, "expert")
    yield t("ffn_up_exps.weight", (n_embd, n_ff_exp, n_exp), etype, "normal", EXPERT_RMS, "expert")
    yield t("ffn_down_exps.weight", (n_ff_exp, n_embd, n_exp), etype, "normal", EXPERT_RMS, "expert")
    if gpt_oss:
        yield t("ffn_gate_exps.bias", (n_ff_exp, n_exp), f32, "normal", BIAS_STD, "bias")
        yield t("ffn_up_exps.bias", (n_ff_exp, n_exp), f32, "normal", BIAS_STD, "bias")
        yield t("ffn_down_exps.bias", (n_embd, n_exp), f32, "normal", BIAS_STD, "bias")


# --------------------------------------------------------------------------------------------
# random data


def _rng(seed: int, name: str, chunk: int) -> np.random.Generator:
    """The generator of chunk ``chunk`` of tensor ``name``: a pure function of its arguments."""
    key = int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")
    return np.random.Generator(np.random.SFC64(np.random.SeedSequence([seed, key, chunk])))


def _scale_bytes(scale: float) -> npt.NDArray[np.uint8]:
    """The two little-endian bytes of ``scale`` as an f16."""
    return np.array([scale], dtype="<f2").view(np.uint8)


def _chunk_count(t: TensorPlan) -> int:
    """How many chunks the data of ``t`` is generated in."""
    if t.type.quantized:
        return max(1, -(-(t.n_elements // t.type.block_size) // _CHUNK_BLOCKS))
    return max(1, -(-t.n_elements // _CHUNK_ELEMENTS))


def _normal_chunk(t: TensorPlan, seed: int, chunk: int) -> npt.NDArray[Any]:
    """Chunk ``chunk`` of a random tensor, as the bytes (or values) written to the file."""
    rng = _rng(seed, t.name, chunk)
    if t.type.quantized:
        n_blocks = t.n_elements // t.type.block_size
        count = min(_CHUNK_BLOCKS, n_blocks - chunk * _CHUNK_BLOCKS)
        size = count * t.type.type_size
        raw = rng.bit_generator.random_raw(-(-size // 8)).view(np.uint8)[:size]
        blocks = raw.reshape(count, t.type.type_size)
        # |scale| as chosen, its sign the block's random top bit (symmetric, zero-mean weights) or positive
        scale = _scale_bytes(t.std / _Q_RMS[t.type.name])
        blocks[:, 0] = scale[0]
        blocks[:, 1] &= 0x80 if t.signed else 0
        blocks[:, 1] |= scale[1]
        return blocks
    count = min(_CHUNK_ELEMENTS, t.n_elements - chunk * _CHUNK_ELEMENTS)
    values = rng.standard_normal(count, dtype=np.float32)
    values *= np.float32(t.std)
    return values.astype("<f2") if t.type.name == "f16" else values.astype("<f4", copy=False)


def _normal_values(t: TensorPlan, seed: int) -> npt.NDArray[np.float32]:
    """All values of a random tensor as written (after rounding), in numpy order."""
    raw = np.concatenate([_normal_chunk(t, seed, c).reshape(-1).view(np.uint8) for c in range(_chunk_count(t))])
    return decode(raw, t.type.name).reshape(tuple(reversed(t.shape)))


def decode(raw: npt.NDArray[np.uint8], type_name: str) -> npt.NDArray[np.float32]:
    """The f32 values of ``raw`` bytes of a ``f32``/``f16``/``q8_0``/``q4_0`` tensor, flat."""
    typ = GGML_TYPES[type_name]
    raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
    if not typ.quantized:
        return raw.view("<f4" if typ.name == "f32" else "<f2").astype(np.float32)
    blocks = raw.reshape(-1, typ.type_size)
    scale = blocks[:, :2].copy().view("<f2").astype(np.float32)
    if typ.name == "q8_0":
        q = blocks[:, 2:].view(np.int8).astype(np.float32)
    else:  # q4_0: byte j holds value j (low nibble) and value j + 16 (high nibble)
        qs = blocks[:, 2:]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32) - 8.0
    return (q * scale).reshape(-1)


# --------------------------------------------------------------------------------------------
# router skew


@dataclass(frozen=True)
class _Skew:
    """Per-layer hot experts with their logit boosts, and qwen3moe's value biases and shared directions."""

    hot: tuple[tuple[int, ...], ...]
    boost: tuple[float, ...]  # z_r, in router-logit standard deviations, by hot rank
    logit_std: float  # standard deviation of the random router logits
    v_bias: tuple[npt.NDArray[np.float32], ...] = ()
    direction: tuple[npt.NDArray[np.float32], ...] = ()


def _hot_experts(shape: Shape, seed: int) -> tuple[tuple[int, ...], ...]:
    """The hot experts of each layer, hottest first."""
    n_hot = min(shape.n_expert, max(1, shape.n_expert_used // 2))
    rng = _rng(seed, "pyllama_moe.synth.hot_experts", 0)
    return tuple(tuple(int(e) for e in rng.choice(shape.n_expert, n_hot, replace=False)) for _ in range(shape.n_layer))


def _silu_sq_mean(sigma: float) -> float:
    """E[silu(g)^2] for g ~ N(0, sigma^2), by quadrature."""
    z = np.linspace(-12.0, 12.0, 24001)
    g = sigma * z
    silu = g / (1.0 + np.exp(-g))
    pdf = np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
    return float(np.sum(silu * silu * pdf) * (z[1] - z[0]))


def _topk_weight_sq(shape: Shape, std: float | None = None) -> float:
    """E[sum of squared routing weights] of softmax-over-top-k with random router logits (of standard deviation
    ``std``; default: those of the random routers)."""
    rng = np.random.default_rng(12345)
    logits = rng.standard_normal((512, shape.n_expert)) * (ROUTER_STD * math.sqrt(shape.n_embd) if std is None else std)
    top = -np.sort(-logits, axis=1)[:, : shape.n_expert_used]
    w = np.exp(top - top[:, :1])
    w /= w.sum(axis=1, keepdims=True)
    return float(np.mean(np.sum(w * w, axis=1)))


def _moe_mean_square(shape: Shape, weight_sq: float) -> float:
    """What a MoE layer adds to the mean square of each residual dimension, its routing weights' squares summing to
    ``weight_sq``."""
    sigma_g = EXPERT_RMS * math.sqrt(shape.n_embd)
    return EXPERT_RMS**2 * shape.n_ff_exp * _silu_sq_mean(sigma_g) * sigma_g**2 * weight_sq


def _residual_rms(shape: Shape) -> list[float]:
    """Predicted root mean square of the token-dependent residual at each layer's MoE input.

    Sublayer inputs are RMS-normalised (unit mean square), so each attention adds
    ``DENSE_STD^2 n_q * DENSE_STD^2 n_embd * ATTN_MIXING`` (averaging values over the context
    shrinks the token-dependent part) and each MoE ``EXPERT_RMS^2 n_ff_exp E[silu(g)^2] E[u^2]
    E[sum w^2]`` to the mean square.
    """
    attn = (DENSE_STD**2 * shape.n_embd_q) * (DENSE_STD**2 * shape.n_embd) * ATTN_MIXING
    moe = _moe_mean_square(shape, _topk_weight_sq(shape))
    return [math.sqrt(DENSE_STD**2 + (il + 1) * attn + il * moe) for il in range(shape.n_layer)]


def _prepare_skew(p: Plan, seed: int) -> _Skew | None:
    """The skew data of plan ``p`` (None without skew); reads back qwen3moe's attention outputs."""
    if p.skew <= 0:
        return None
    shape = p.shape
    hot = _hot_experts(shape, seed)
    boost = tuple(SKEW_BOOST * p.skew / math.sqrt(1.0 + r) for r in range(len(hot[0])))
    logit_std = ROUTER_STD * math.sqrt(shape.n_embd)
    if shape.arch != ARCH_QWEN3MOE:
        return _Skew(hot, boost, logit_std)
    tensors = p.by_name()
    shared = np.zeros(shape.n_embd, dtype=np.float64)
    group = shape.n_head // shape.n_head_kv
    f = SHARED_FRACTION
    v_biases, directions = [], []
    for il, rms in enumerate(_residual_rms(shape)):
        target = rms * f / math.sqrt(1.0 - f * f) * math.sqrt(shape.n_embd)  # norm of C_l
        w_o = _normal_values(tensors[f"blk.{il}.attn_output.weight"], seed).astype(np.float64)  # (n_embd, n_q)
        b = _rng(seed, f"blk.{il}.attn_v.bias", 0).standard_normal(shape.n_embd_kv)
        per_head = np.repeat(b.reshape(shape.n_head_kv, shape.head_dim), group, axis=0).reshape(-1)
        c = w_o @ per_head  # what the value bias adds to every token's attention output
        unit = c / np.linalg.norm(c)
        along = float(shared @ unit)
        t = -along + math.sqrt(along * along + max(target * target - float(shared @ shared), 0.0))
        scale = t / np.linalg.norm(c)
        shared = shared + c * scale
        v_biases.append((b * scale).astype(np.float32))
        directions.append((shared / np.linalg.norm(shared)).astype(np.float32))
    return _Skew(hot, boost, logit_std, tuple(v_biases), tuple(directions))


# --------------------------------------------------------------------------------------------
# realistic routing (pyllama_moe.synth_routing)


def _prepare_routing(p: Plan, seed: int) -> synth_routing.Routing | None:
    """The realistic routing's data of plan ``p`` (None for the other regimes)."""
    if p.routing != "realistic":
        return None
    s = p.shape
    lay = synth_routing.layout(s.n_embd, s.head_dim, s.n_expert, s.n_layer, s.rope_freq_base)
    # the embedding: DENSE_STD noise outside the subspace, the constant and a token vector in it
    rho0 = math.sqrt((DENSE_STD**2 * lay.c + synth_routing.C_MAG**2 + synth_routing.T_MAG**2) / s.n_embd)
    rms = tuple(math.sqrt(r * r - DENSE_STD**2 + rho0**2) for r in _residual_rms(s))
    # what a layer's experts write into each dimension of its bank, with this layer's (not random) router logits
    new = tuple(math.sqrt(lay.d_new * _moe_mean_square(s, _topk_weight_sq(s, synth_routing.logit_std(il, s.n_layer))))
                for il in range(s.n_layer))
    return synth_routing.Routing(lay, s.n_layer, s.rope_freq_base, rho0, rms, new, functools.partial(_rng, seed))


def _realistic_chunk(t: TensorPlan, seed: int, chunk: int, r: synth_routing.Routing) -> npt.NDArray[Any]:
    """Chunk ``chunk`` of a tensor that the realistic routing writes: the random chunk with the subspace's rows and
    columns replaced (see :mod:`pyllama_moe.synth_routing`)."""
    out = _normal_chunk(t, seed, chunk)
    lay, n_row = r.lay, t.shape[0]
    if t.name.endswith(".ffn_down_exps.weight"):  # the subspace's rows zero but for the layer's bank
        bank = lay.bank(_layer_of(t.name)) if _layer_of(t.name) < lay.n_bank else slice(0, 0)
        per_row = n_row // t.type.block_size if t.type.quantized else n_row
        first = chunk * (_CHUNK_BLOCKS if t.type.quantized else _CHUNK_ELEMENTS)
        dim = (first + np.arange(len(out), dtype=np.int64)) // per_row % t.shape[1]
        out[(dim >= lay.c) & ((dim < bank.start) | (dim >= bank.stop))] = 0  # q4_0/q8_0: a zero block, scale 0
        return out
    first = chunk * _CHUNK_ELEMENTS
    idx = first + np.arange(len(out), dtype=np.int64)
    rows, cols = idx // n_row, idx % n_row
    values = out.astype(np.float32)
    if t.name == "token_embd.weight":  # rows are tokens: the constant, the token's vector, no context
        sub = cols >= lay.c
        uniq, inv = np.unique(rows[sub], return_inverse=True)
        vec = np.zeros((len(uniq), lay.n_embd - lay.c), dtype=np.float32)
        vec[:, 0] = synth_routing.C_MAG
        vec[:, 1: 1 + lay.d_tok] = r.token_vectors(uniq)
        values[sub] = vec[inv, cols[sub] - lay.c]
    elif t.name.endswith(".attn_output.weight"):  # rows are the residual's dimensions
        sub = rows >= lay.c
        values[sub] = 0.0
        if t.name.startswith("blk.0."):  # the recency head (head 0) writes the context dimensions
            ctx = (rows >= lay.ctx.start) & (rows < lay.ctx.stop) & (cols < lay.head_dim)
            values[ctx] = r.output_proj()[rows[ctx] - lay.ctx.start, cols[ctx]]
    else:  # layer 0's query, key and value: the recency head's rows (kv head 0, and q head 0)
        head = rows < lay.head_dim
        values[head] = 0.0
        if t.name.endswith("attn_v.weight"):
            tok = head & (cols >= lay.tok.start) & (cols < lay.tok.stop)
            values[tok] = r.value_proj()[rows[tok], cols[tok] - lay.tok.start]
        else:
            at_c = head & (cols == lay.c)
            values[at_c] = synth_routing.recency_query(lay)[rows[at_c]]
    return values.astype(out.dtype)


def _layer_of(name: str) -> int:
    """The block index in a ``blk.N.`` tensor name."""
    return int(name.split(".")[1])


def _special_values(t: TensorPlan, seed: int, skew: _Skew | None,
                    routing: synth_routing.Routing | None) -> npt.NDArray[np.float32]:
    """Values of a router, router bias or skew value bias, in numpy order."""
    il = _layer_of(t.name)
    if routing is not None:
        return routing.router(il, t.shape[1])
    if t.init == "vbias":
        assert skew is not None and skew.v_bias
        return skew.v_bias[il]
    values = _normal_values(t, seed)  # the unskewed router weights (or router bias)
    if skew is None:
        return values
    if t.name.endswith(".bias"):  # gpt-oss: the boosts go straight onto the logits
        for e, z in zip(skew.hot[il], skew.boost, strict=True):
            values[e] += np.float32(z * skew.logit_std)
    elif skew.direction:  # qwen3moe: rows along the shared direction of the hidden states
        d = skew.direction[il]
        values -= np.outer(values @ d, d)  # no expert leans on the shared part by chance
        for e, z in zip(skew.hot[il], skew.boost, strict=True):
            values[e] += np.float32(z * ROUTER_STD / SHARED_FRACTION) * d
    return values


# --------------------------------------------------------------------------------------------
# vocabulary


@dataclass(frozen=True)
class _Vocab:
    """The ``tokenizer.*`` key-value pairs of a vocab GGUF, ready for GGUFWriter.add_key_value."""

    entries: tuple[tuple[str, Any, int, int | None], ...]  # key, value, GGUFValueType, array sub-type
    n_tokens: int


def default_vocab_path() -> Path:
    """The vocabulary GGUF to copy: ``$PYLLAMA_MOE_VOCAB``, the packaged one, or the vendored one.

    Looks in order at the environment variable ``PYLLAMA_MOE_VOCAB``, at
    ``<package>/data/ggml-vocab-qwen2.gguf`` and at
    ``<repository>/vendor/llama.cpp/models/ggml-vocab-qwen2.gguf``.
    """
    env = os.environ.get(VOCAB_ENV)
    if env:
        path = Path(env).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"{VOCAB_ENV}={env} does not name a file")
        return path
    import pyllama_moe

    here = Path(__file__).resolve().parent
    # every folder of the package: a source checkout also looks at the installed copy's data
    candidates = [Path(d) / "data" / VOCAB_FILE for d in pyllama_moe.__path__]
    candidates.append(here.parent / "vendor" / "llama.cpp" / "models" / VOCAB_FILE)
    for path in candidates:
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"no vocabulary GGUF found: set {VOCAB_ENV} to a vocab-only GGUF (e.g. llama.cpp's models/{VOCAB_FILE}) "
        f"or pass vocab_path; looked at {', '.join(str(c) for c in candidates)}"
    )


def _load_vocab(path: Path) -> _Vocab:
    """The vocabulary of the GGUF at ``path`` (cached while the file is unchanged)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"vocab_path {path} does not name a file")
    st = path.stat()
    return _load_vocab_cached(str(path.resolve()), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=4)
def _load_vocab_cached(path: str, mtime_ns: int, size: int) -> _Vocab:
    """:func:`_load_vocab` behind a cache keyed by the file's identity."""
    try:
        kv = _read_gguf_kv(Path(path).read_bytes())
    except (ValueError, struct.error, IndexError) as e:
        raise ValueError(f"vocab_path {path} is not a readable GGUF file: {e}") from e
    entries = tuple((k, v, t, sub) for k, (v, t, sub) in kv.items() if k.startswith("tokenizer."))
    tokens = kv.get("tokenizer.ggml.tokens")
    if tokens is None or tokens[1] != _GGUF_ARRAY or tokens[2] != _GGUF_STRING or not tokens[0]:
        raise ValueError(f"vocab_path {path} has no tokenizer.ggml.tokens string array")
    return _Vocab(entries, len(tokens[0]))


# GGUF value types (gguf.GGUFValueType) and the struct format of the fixed-size ones
_GGUF_STRING = 8
_GGUF_ARRAY = 9
_GGUF_SCALARS: dict[int, str] = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def _read_gguf_kv(data: bytes) -> dict[str, tuple[Any, int, int | None]]:
    """The key-value section of a little-endian GGUF (v2/v3): key -> (value, type, array sub-type).

    Strings stay bytes, so they are copied exactly. (gguf.GGUFReader reads the same, but takes
    seconds on a 150k-token vocabulary; this takes a fraction of one.)
    """
    if data[:4] != b"GGUF":
        raise ValueError("no GGUF magic")
    version, _n_tensors, n_kv = struct.unpack_from("<IQQ", data, 4)
    if version not in (2, 3):
        raise ValueError(f"unsupported GGUF version {version}")
    off = 24
    out: dict[str, tuple[Any, int, int | None]] = {}
    for _ in range(n_kv):
        key, off = _read_str(data, off)
        (vtype,) = struct.unpack_from("<I", data, off)
        off += 4
        if vtype == _GGUF_ARRAY:
            sub, count = struct.unpack_from("<IQ", data, off)
            off += 12
            value, off = _read_array(data, off, sub, count)
            out[key.decode()] = (value, vtype, sub)
        else:
            value, off = _read_scalar(data, off, vtype)
            out[key.decode()] = (value, vtype, None)
    return out


def _read_str(data: bytes, off: int) -> tuple[bytes, int]:
    """A GGUF string at ``off`` and the offset after it."""
    (n,) = struct.unpack_from("<Q", data, off)
    end = off + 8 + n
    if end > len(data):
        raise ValueError("string runs past the end of the file")
    return data[off + 8 : end], end


def _read_scalar(data: bytes, off: int, vtype: int) -> tuple[Any, int]:
    """A GGUF string or fixed-size value at ``off`` and the offset after it."""
    if vtype == _GGUF_STRING:
        return _read_str(data, off)
    fmt = _GGUF_SCALARS.get(vtype)
    if fmt is None:
        raise ValueError(f"unknown GGUF value type {vtype}")
    return struct.unpack_from("<" + fmt, data, off)[0], off + struct.calcsize(fmt)


def _read_array(data: bytes, off: int, sub: int, count: int) -> tuple[list[Any], int]:
    """A GGUF array of ``count`` values of type ``sub`` at ``off`` and the offset after it."""
    if sub == _GGUF_STRING:
        items = []
        for _ in range(count):
            item, off = _read_str(data, off)
            items.append(item)
        return items, off
    fmt = _GGUF_SCALARS.get(sub)
    if fmt is None:
        raise ValueError(f"unsupported GGUF array type {sub}")
    size = struct.calcsize(fmt)
    dtype = np.dtype("<" + fmt) if fmt != "?" else np.dtype(np.bool_)
    if off + size * count > len(data):
        raise ValueError("array runs past the end of the file")
    return np.frombuffer(data, dtype=dtype, count=count, offset=off).tolist(), off + size * count


# --------------------------------------------------------------------------------------------
# writing


def _gguf() -> Any:
    """The ``gguf`` package, imported on first use."""
    try:
        import gguf
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "pyllama_moe.synth needs the 'gguf' package (pip install 'gguf>=0.19' or pip install 'pyllama-moe[synth]')"
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
    writer.add_uint32(f"{a}.block_count", s.n_layer)
    if s.n_ff:
        writer.add_uint32(f"{a}.feed_forward_length", s.n_ff)
    writer.add_uint32(f"{a}.attention.head_count", s.n_head)
    writer.add_uint32(f"{a}.attention.head_count_kv", s.n_head_kv)
    writer.add_uint32(f"{a}.attention.key_length", s.head_dim)
    writer.add_uint32(f"{a}.attention.value_length", s.head_dim)
    writer.add_float32(f"{a}.attention.layer_norm_rms_epsilon", s.rms_eps)
    writer.add_float32(f"{a}.rope.freq_base", s.rope_freq_base)
    writer.add_uint32(f"{a}.rope.dimension_count", s.head_dim)
    if s.is_moe:
        writer.add_uint32(f"{a}.expert_count", s.n_expert)
        writer.add_uint32(f"{a}.expert_used_count", s.n_expert_used)
        writer.add_uint32(f"{a}.expert_feed_forward_length", s.n_ff_exp)
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


_Job = tuple[int, Callable[[], npt.NDArray[Any]]]


def _jobs(p: Plan, seed: int, skew: _Skew | None, routing: synth_routing.Routing | None) -> Iterator[_Job]:
    """``(tensor index, chunk producer)`` for every chunk of every tensor, in file order."""
    for i, t in enumerate(p.tensors):
        if t.init == "ones":
            yield i, functools.partial(np.ones, t.n_elements, dtype="<f4")
        elif t.init in ("router", "vbias"):
            yield i, functools.partial(_special_values, t, seed, skew, routing)
        elif t.init == "realistic":
            assert routing is not None
            for c in range(_chunk_count(t)):
                yield i, functools.partial(_realistic_chunk, t, seed, c, routing)
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
    (see the module docstring); ``routing`` picks a regime: ``collapsed``, ``uniform`` or ``realistic``
    (see :func:`plan`); ``seed`` makes everything reproducible. The file is written to a temporary name
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


# --------------------------------------------------------------------------------------------
# command line


def _parser() -> argparse.ArgumentParser:
    """The ``synth`` command's argument parser."""
    ap = argparse.ArgumentParser(
        prog="python -m pyllama_moe synth",
        description="Write a random-weight GGUF model (qwen3moe, gpt-oss or qwen3) with a real tokenizer.",
    )
    ap.add_argument("output", type=Path, help="the GGUF file to write")
    ap.add_argument("--preset", default="tiny", choices=sorted(PRESETS), help="base shape (default tiny)")
    ap.add_argument("--arch", choices=ARCHITECTURES, help="architecture (default: the preset's, qwen3moe)")
    ap.add_argument("--expert-type", default="q4_0", choices=EXPERT_TYPES, help="type of expert/FFN weights (default q4_0)")
    ap.add_argument("--dense-type", default="f16", choices=DENSE_TYPES, help="type of attention/embedding/output (default f16)")
    ap.add_argument("--skew", type=float, default=0.0, help="router skew, 0 = uniform random routing (default 0)")
    ap.add_argument("--routing", default="auto", choices=ROUTINGS,
                    help="routing regime: collapsed (onto a few experts), uniform, realistic (like a trained MoE's, "
                         "qwen3moe) (default auto: collapsed, or as --skew and --scale-signs say)")
    ap.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    ap.add_argument("--scale-signs", default="auto", choices=SCALE_SIGNS,
                    help="signs of the quantized blocks' scales (default auto: positive without skew, random with it)")
    ap.add_argument("--vocab", type=Path,
                    help=f"vocab-only GGUF to copy the tokenizer from (default: ${VOCAB_ENV} or the packaged qwen2 one)")
    ap.add_argument("--threads", type=int, help="generator threads (default: CPU count, at most 16)")
    shape = ap.add_argument_group("shape overrides")
    for f in dataclasses.fields(Shape):
        if f.name == "arch":
            continue
        kind = float if f.type in ("float", float) else int
        shape.add_argument("--" + f.name.replace("_", "-"), dest=f.name, type=kind, metavar="N" if kind is int else "X")
    real = ap.add_argument_group("a MoE made from a real dense model (MoEfication, pyllama_moe.moefy)")
    real.add_argument("--from-dense", type=Path, metavar="DENSE.gguf",
                      help="split this dense llama or qwen3 model's FFNs into experts (the other options are ignored)")
    real.add_argument("--experts", type=int, default=64, help="experts per layer (default 64)")
    real.add_argument("--used", type=int, default=8, help="experts each token uses (default 8)")
    ap.add_argument("--plan", action="store_true", help="print the tensors and sizes, write nothing")
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    return ap


def main(argv: list[str] | None = None) -> int:
    """The ``python -m pyllama_moe synth`` command; returns the exit status."""
    args = _parser().parse_args(argv)
    overrides = {name: getattr(args, name) for name in SHAPE_FIELDS if getattr(args, name) is not None}
    try:
        if args.from_dense is not None:
            from pyllama_moe import moefy

            path = moefy.moefy(args.from_dense, args.output, args.experts, args.used, seed=args.seed,
                               progress=not args.quiet and sys.stderr.isatty())
        elif args.plan:
            p = plan(args.preset, arch=args.arch, expert_type=args.expert_type, dense_type=args.dense_type,
                     skew=args.skew, vocab_path=args.vocab, scale_signs=args.scale_signs, routing=args.routing,
                     **overrides)
            _print_plan(p)
            return 0
        else:
            path = write_model(
                args.output, args.preset, arch=args.arch, vocab_path=args.vocab, expert_type=args.expert_type,
                skew=args.skew, seed=args.seed, dense_type=args.dense_type, threads=args.threads,
                scale_signs=args.scale_signs, routing=args.routing,
                progress=not args.quiet and sys.stderr.isatty(), **overrides,
            )
    except (ValueError, FileNotFoundError) as e:
        print(f"synth: error: {e}", file=sys.stderr)
        return 2
    size = path.stat().st_size
    print(f"{path}\t{size} bytes ({size / 2**20:.1f} MiB)")
    return 0


def _print_plan(p: Plan) -> None:
    """Print every tensor of ``p`` and the totals."""
    for t in p.tensors:
        print(f"{t.name:32s} {t.type.name:5s} {'x'.join(map(str, t.shape)):>20s} {t.nbytes:>14d}")
    print(f"{p.shape.arch}: {len(p.tensors)} tensors, {p.tensor_bytes} bytes ({p.tensor_bytes / 2**30:.3f} GiB), "
          f"experts {p.expert_bytes / 2**20:.0f} MiB")

