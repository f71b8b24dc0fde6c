"""The plan of a synthetic model: its architecture, shape and presets, and every tensor of the file with its type,
size and how its values are made (see :mod:`pyllama_moe.tools.synth`)."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pyllama_moe.tools.synth import routing as synth_routing
from pyllama_moe.tools.synth.vocab import QWEN2_N_VOCAB, _load_vocab

ARCH_QWEN3MOE = "qwen3moe"
ARCH_GPT_OSS = "gpt-oss"
ARCH_QWEN3 = "qwen3"
ARCH_QWEN2MOE = "qwen2moe"  # Qwen1.5/Qwen2-MoE: query, key and value biases; a shared expert with its own gate
ARCH_OLMOE = "olmoe"  # OLMoE: query and key norms over the whole width; the experts' width is feed_forward_length
ARCH_MIXTRAL = "llama"  # Mixtral: llama with expert tensors; the experts' width is feed_forward_length
ARCH_GRANITEMOE = "granitemoe"  # Granite MoE: Mixtral's tensors, the embedding, residual, attention and logits scaled
# ERNIE-4.5-MoE: a leading dense layer, a selection bias (exp_probs_b) with softmax gating, a shared expert
ARCH_ERNIE_MOE = "ernie4_5-moe"
ARCH_LLAMA4 = "llama4"  # Llama 4: MoE every other layer (dense between), a shared expert as wide as the experts
# GLM-4.5: a leading dense layer, attention biases, partial RoPE, shared experts, sigmoid gating with a selection bias,
# NextN (multi-token prediction) layers after the trunk
ARCH_GLM4MOE = "glm4moe"
# DeepSeek-V2/V3 (and Kimi-K2): multi-head latent attention (low-rank queries, keys and values through a compressed
# latent), and GLM-4.5's MoE besides: a leading dense layer, shared experts, expert groups, NextN layers
ARCH_DEEPSEEK2 = "deepseek2"
# Qwen3-Next: three layers of linear attention (a gated delta net with a recurrent state) to one of full attention
# (its queries gated), every FFN a MoE with a gated shared expert
ARCH_QWEN3NEXT = "qwen3next"
ARCHITECTURES: tuple[str, ...] = (ARCH_QWEN3MOE, ARCH_GPT_OSS, ARCH_QWEN3, ARCH_QWEN2MOE, ARCH_OLMOE, ARCH_MIXTRAL,
                                  ARCH_GRANITEMOE, ARCH_ERNIE_MOE, ARCH_LLAMA4, ARCH_GLM4MOE, ARCH_DEEPSEEK2,
                                  ARCH_QWEN3NEXT)
MOE_ARCHITECTURES: frozenset[str] = frozenset({ARCH_QWEN3MOE, ARCH_GPT_OSS, ARCH_QWEN2MOE, ARCH_OLMOE, ARCH_MIXTRAL,
                                               ARCH_GRANITEMOE, ARCH_ERNIE_MOE, ARCH_LLAMA4, ARCH_GLM4MOE,
                                               ARCH_DEEPSEEK2, ARCH_QWEN3NEXT})
# which layers' FFN is a mixture of experts: (leading dense layers, every how many layers) as the loaders read
# leading_dense_block_count and interleave_moe_layer_step; the others: every layer
MOE_LAYOUT: dict[str, tuple[int, int]] = {ARCH_ERNIE_MOE: (1, 1), ARCH_LLAMA4: (0, 2), ARCH_GLM4MOE: (1, 1),
                                          ARCH_DEEPSEEK2: (1, 1)}
# DeepSeek-V3's routing (GLM-4.5's too): shared experts counted in units of n_ff_exp, expert groups, the gating
# function, the weights' scale and norm, NextN layers after the trunk; only these read the Shape fields of each
DEEPSEEK_ROUTING: frozenset[str] = frozenset({ARCH_GLM4MOE, ARCH_DEEPSEEK2})
# b11549 takes a deepseek2 of these trunk layer counts for a "lite" one (DeepSeek-V2-Lite's 27, GigaChat3's 26) and
# reads no q_lora_rank: its queries are one projection
DEEPSEEK2_LITE_LAYERS = (26, 27)
# qwen3next: every how many layers one attends fully (full_attention_interval; the others are linear), the length of
# the linear attention's convolution (ssm.conv_kernel); its other widths are the shape's (see Shape)
QWEN3NEXT_FULL_ATTENTION_INTERVAL = 4
QWEN3NEXT_CONV_KERNEL = 4
GATING_SOFTMAX, GATING_SIGMOID = 1, 2  # llama.cpp's llama_expert_gating_func_type (expert_gating_func)
# the experts' width as feed_forward_length (their loaders read no expert_feed_forward_length)
FFN_SIZED_EXPERTS: frozenset[str] = frozenset({ARCH_OLMOE, ARCH_MIXTRAL, ARCH_GRANITEMOE})
# Granite's multipliers (Granite-3.0-MoE's: the embedding x12, each residual branch x0.22, logits / 6)
GRANITE_SCALES = {"embedding_scale": 12.0, "residual_scale": 0.22, "logit_scale": 6.0}
# llama.cpp's loaders of these size the attention output n_embd x n_embd: n_head * head_dim must be n_embd
FULL_WIDTH_ATTENTION: frozenset[str] = frozenset({ARCH_QWEN2MOE, ARCH_OLMOE})
# where the skew can steer the routers (a router bias, or qwen3moe's value biases)
SKEW_ARCHITECTURES: frozenset[str] = frozenset({ARCH_QWEN3MOE, ARCH_GPT_OSS})

DENSE_STD = 0.02
ROUTER_STD = 0.05
BIAS_STD = 0.001  # small: a constant bias is a direction every token shares, which skews routing
SINK_STD = 0.5
CONV_STD = 0.5  # qwen3next's convolution over 4 tokens: about unit gain
Q4_0_SCALE = 0.02
EXPERT_RMS = Q4_0_SCALE * math.sqrt(21.5)  # E[(nibble - 8)^2] = 21.25 + 0.25 for uniform nibbles

LLAMA_MAX_LAYERS = 512
LLAMA_MAX_EXPERTS = 1024
GGUF_ALIGNMENT = 32


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
# collapsed: positive scales (today's default); uniform: random signs; realistic and dispersed: calibrated regimes
# (pyllama_moe.tools.synth.routing)
ROUTINGS: tuple[str, ...] = ("auto", "collapsed", "uniform", *synth_routing.REGIMES)


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

    The fields after it are those of DeepSeek-V3's routing (:data:`DEEPSEEK_ROUTING`: ``glm4moe``, ``deepseek2``),
    0 in the other architectures: ``n_nextn`` NextN (multi-token prediction) layers after the ``n_layer`` of the
    trunk (the file's ``block_count`` is their sum), ``n_expert_shared`` shared experts of ``n_ff_exp`` each,
    ``n_expert_groups`` groups of experts of which a token's experts come from the best ``n_group_used`` (0: none),
    ``expert_gating`` llama.cpp's gating function (1 softmax, 2 sigmoid: then the selected weights are normalised
    and a selection bias ``exp_probs_b`` ranks the experts), ``expert_weights_scale`` the factor of the selected
    weights, ``n_rot`` the rotary dimensions of a head (0: all of ``head_dim``).

    ``deepseek2``'s multi-head latent attention reads the last two: ``q_lora_rank`` (0: queries without a low-rank
    step, as in DeepSeek-V2-Lite) and ``kv_lora_rank``, the widths of the compressed queries and keys/values; its
    ``head_dim`` is a query's and key's (``n_rot`` of it rotated), a value's is ``head_dim - n_rot`` (as in V2 and
    V3), ``n_head_kv`` is 1 (the latent is shared by the heads: the file's keys and values are those of the latent).

    ``qwen3next`` reads ``n_rot`` too; its linear attention takes its widths from the full attention's: ``n_head``
    value heads and ``n_head_kv`` key heads of ``head_dim`` each (Qwen3-Next-80B's are 32 and 16 of 128).
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
    n_nextn: int = 0
    n_expert_shared: int = 0
    n_expert_groups: int = 0
    n_group_used: int = 0
    expert_gating: int = 0
    expert_weights_scale: float = 1.0
    n_rot: int = 0
    q_lora_rank: int = 0
    kv_lora_rank: int = 0

    @property
    def is_moe(self) -> bool:
        """Whether the architecture is a mixture of experts."""
        return self.arch in MOE_ARCHITECTURES

    @property
    def n_block(self) -> int:
        """The blocks of the file: the trunk's layers and the NextN layers after them (``block_count``)."""
        return self.n_layer + self.n_nextn

    def is_moe_layer(self, il: int) -> bool:
        """Whether block ``il``'s FFN is a mixture of experts (a NextN layer's is, as the trunk's last)."""
        lead, step = MOE_LAYOUT.get(self.arch, (0, 1))
        return self.is_moe and lead <= il < self.n_block and (il >= self.n_layer or (il + 1) % step == 0)

    @property
    def moe_layers(self) -> list[int]:
        """The trunk's layers whose FFN is a mixture of experts (none for a dense model; no NextN layer)."""
        return [il for il in range(self.n_layer) if self.is_moe_layer(il)]

    def is_recurrent_layer(self, il: int) -> bool:
        """Whether block ``il`` attends linearly, with a recurrent state (qwen3next's, but every fourth)."""
        return self.arch == ARCH_QWEN3NEXT and il < self.n_layer and (il + 1) % QWEN3NEXT_FULL_ATTENTION_INTERVAL != 0

    @property
    def rot(self) -> int:
        """The rotary dimensions of a head (``rope.dimension_count``)."""
        return self.n_rot or self.head_dim

    @property
    def head_dim_v(self) -> int:
        """The width of a head's value: ``head_dim``, but deepseek2's (``head_dim - n_rot``)."""
        return self.head_dim - self.rot if self.arch == ARCH_DEEPSEEK2 else self.head_dim

    @property
    def selection_bias(self) -> bool:
        """Whether the MoE layers have the selection bias ``exp_probs_b`` (sigmoid gating; glm4moe's loader wants it
        whatever the gating)."""
        return self.arch == ARCH_GLM4MOE or (self.arch in DEEPSEEK_ROUTING and self.expert_gating == GATING_SIGMOID)

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
            if f.name != "arch":
                _check_field(f, getattr(self, f.name))
        for name in ("n_layer", "n_embd", "n_head", "n_head_kv", "head_dim", "context_length", "sliding_window"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.n_block > LLAMA_MAX_LAYERS:
            raise ValueError(f"n_layer + n_nextn must be at most {LLAMA_MAX_LAYERS}, got {self.n_block}")
        if self.n_head % self.n_head_kv:
            raise ValueError(f"n_head ({self.n_head}) must be a multiple of n_head_kv ({self.n_head_kv})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even (RoPE rotates pairs), got {self.head_dim}")
        if self.arch in FULL_WIDTH_ATTENTION and self.n_embd_q != self.n_embd:
            raise ValueError(f"{self.arch} needs n_head * head_dim == n_embd, got {self.n_head} * {self.head_dim} != "
                             f"{self.n_embd}")
        if self.arch == ARCH_OLMOE and self.n_head_kv != self.n_head:  # its key norm spans the whole width
            raise ValueError(f"{self.arch} needs n_head_kv == n_head, got {self.n_head_kv} and {self.n_head}")
        if self.arch in (ARCH_LLAMA4, ARCH_QWEN3NEXT) and self.n_layer < 4:  # b11549 aborts without a full-attention
            raise ValueError(f"{self.arch} needs n_layer >= 4 (every fourth layer attends fully), got {self.n_layer}")
        if self.n_rot % 2 or self.n_rot > self.head_dim:
            raise ValueError(f"n_rot must be even and at most head_dim ({self.head_dim}), got {self.n_rot}")
        for f in dataclasses.fields(self):
            archs = _ARCH_FIELDS.get(f.name, frozenset({self.arch}))
            if self.arch not in archs and getattr(self, f.name) != f.default:
                raise ValueError(f"{f.name} is for the {', '.join(sorted(archs))} arch only, got "
                                 f"{getattr(self, f.name)} for {self.arch}")
        if self.arch in DEEPSEEK_ROUTING:
            self._validate_deepseek_routing()
        if self.arch == ARCH_DEEPSEEK2:
            self._validate_mla()
        if self.is_moe:
            self._validate_moe()
        else:
            for name in ("n_expert", "n_expert_used", "n_ff_exp"):
                if getattr(self, name):
                    raise ValueError(f"{name} must be 0 for the dense architecture {self.arch}, "
                                     f"got {getattr(self, name)}")
            if self.n_ff < 1:
                raise ValueError(f"n_ff must be at least 1 for the dense architecture {self.arch}, got {self.n_ff}")

    def _validate_deepseek_routing(self) -> None:
        """The part of :meth:`validate` for DeepSeek-V3's routing: what b11549 refuses, or aborts the process on
        (``GGML_ASSERT``: the expert groups' counts, a rotary width over the head's)."""
        if self.n_nextn > 1:  # glm4moe's NextN graph asserts a single block
            raise ValueError(f"n_nextn must be 0 or 1 for {self.arch} (b11549 runs one NextN block), "
                             f"got {self.n_nextn}")
        if self.expert_gating not in (GATING_SOFTMAX, GATING_SIGMOID):
            raise ValueError(f"expert_gating must be {GATING_SOFTMAX} (softmax) or {GATING_SIGMOID} (sigmoid) for "
                             f"{self.arch}, got {self.expert_gating}")
        groups, used = self.n_expert_groups, self.n_group_used
        if groups and groups >= self.n_expert:
            raise ValueError(f"n_expert_groups ({groups}) must be less than n_expert ({self.n_expert})")
        if groups <= 1:
            if used > groups:
                raise ValueError(f"n_group_used must be at most n_expert_groups ({groups}), got {used}")
            return
        if self.n_expert % groups:
            raise ValueError(f"n_expert ({self.n_expert}) must be a multiple of n_expert_groups ({groups})")
        if not 1 <= used < groups:
            raise ValueError(f"n_group_used must be in [1, n_expert_groups) = [1, {groups}), got {used}")
        if self.n_expert_used > used * (self.n_expert // groups):  # else the masked groups' experts would be selected
            raise ValueError(f"n_expert_used ({self.n_expert_used}) must be at most the experts of n_group_used "
                             f"groups ({used} x {self.n_expert // groups})")

    def _validate_mla(self) -> None:
        """The part of :meth:`validate` for deepseek2's multi-head latent attention."""
        if self.n_head_kv != 1:  # b11549 aborts (GGML_ASSERT) on others as a context is made
            raise ValueError(f"{self.arch} needs n_head_kv == 1 (the heads share the latent), got {self.n_head_kv}")
        if not 1 <= self.n_rot < self.head_dim:  # b11549 aborts (GGML_ASSERT) without a part of a key unrotated
            raise ValueError(f"{self.arch} needs n_rot in [2, head_dim) = [2, {self.head_dim}), got {self.n_rot}")
        if self.kv_lora_rank < 1:
            raise ValueError(f"{self.arch} needs kv_lora_rank >= 1, got {self.kv_lora_rank}")
        if self.n_nextn and not self.q_lora_rank:  # its NextN graph asserts the queries' low-rank step
            raise ValueError(f"a NextN layer (n_nextn) of {self.arch} needs q_lora_rank >= 1 (b11549's NextN graph "
                             f"aborts without it)")
        if self.q_lora_rank and self.n_layer in DEEPSEEK2_LITE_LAYERS:
            raise ValueError(f"q_lora_rank must be 0 for a {self.arch} of {self.n_layer} layers (b11549 takes it for "
                             f"DeepSeek-V2-Lite and reads no q_lora_rank), got {self.q_lora_rank}")

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


def _check_field(f: dataclasses.Field[Any], value: Any) -> None:
    """ValueError unless ``value`` is of field ``f``'s kind: an integer >= 0, or a positive finite number."""
    if f.type in ("int", int):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ValueError(f"{f.name} must be an integer, got {value!r}")
        if value < 0:
            raise ValueError(f"{f.name} must not be negative, got {value}")
    elif isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{f.name} must be a positive finite number, got {value!r}")


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
    # GLM-4.5-Air's shape (106B-A12B): 45 MoE layers of 128 experts (8 used) and a shared one after a dense layer, a
    # NextN layer; about 66 GiB with q4_0 experts (53.4 GiB of them) and the qwen2 vocabulary
    "glm-4.5-air": Shape(
        arch=ARCH_GLM4MOE, n_layer=46, n_embd=4096, n_head=96, n_head_kv=8, head_dim=128,
        n_expert=128, n_expert_used=8, n_ff_exp=1408, n_ff=10944, context_length=131072, rms_eps=1e-5,
        n_nextn=1, n_expert_shared=1, expert_gating=GATING_SIGMOID, n_rot=64,
    ),
    # DeepSeek-V2-Lite's shape (16B-A2.4B): 26 MoE layers of 64 experts (6 used) and 2 shared after a dense layer,
    # latent attention without the queries' low-rank step, softmax gating; about 9.7 GiB with q4_0 experts (7.5 GiB
    # of them) and the qwen2 vocabulary
    "deepseek-v2-lite": Shape(
        arch=ARCH_DEEPSEEK2, n_layer=27, n_embd=2048, n_head=16, n_head_kv=1, head_dim=192,
        n_expert=64, n_expert_used=6, n_ff_exp=1408, n_ff=10944, context_length=163840, rope_freq_base=10_000.0,
        n_expert_shared=2, expert_gating=GATING_SOFTMAX, n_rot=64, kv_lora_rank=512,
    ),
    # Qwen3-8B's shape, dense: about 8 GiB at q4_0, the bench's dense model beside 30b-a3b
    "8b": Shape(
        arch=ARCH_QWEN3, n_layer=36, n_embd=4096, n_head=32, n_head_kv=8, head_dim=128,
        n_expert=0, n_expert_used=0, n_ff_exp=0, n_ff=12288, context_length=40960,
    ),
}

SHAPE_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Shape) if f.name != "arch")
_EXPERT_FIELDS = ("n_expert", "n_expert_used", "n_ff_exp")
# the fields only some architectures read, and those
_ARCH_FIELDS: dict[str, frozenset[str]] = {
    **{f: DEEPSEEK_ROUTING for f in ("n_nextn", "n_expert_shared", "n_expert_groups", "n_group_used",
                                     "expert_gating", "expert_weights_scale")},
    "n_rot": DEEPSEEK_ROUTING | {ARCH_QWEN3NEXT},
    **{f: frozenset({ARCH_DEEPSEEK2}) for f in ("q_lora_rank", "kv_lora_rank")},
}


def _arch_defaults(shape: Shape, arch: str) -> Shape:
    """``shape`` (of another architecture's preset) as ``arch`` has it: what the architecture needs of it."""
    if arch not in MOE_ARCHITECTURES:
        shape = shape.replace(**{f: 0 for f in _EXPERT_FIELDS})
    defaults = {f.name: f.default for f in dataclasses.fields(Shape)}
    shape = shape.replace(**{f: defaults[f] for f, archs in _ARCH_FIELDS.items() if arch not in archs})
    if arch == ARCH_OLMOE:  # no grouped keys and values
        shape = shape.replace(n_head_kv=shape.n_head)
    if arch == ARCH_LLAMA4:  # a full-attention layer, and MoE ones between the dense ones
        shape = shape.replace(n_layer=max(shape.n_layer, 4))
    if arch == ARCH_GLM4MOE:  # GLM-4.5's: a dense layer then two MoE ones, a NextN layer, half the head rotated
        shape = shape.replace(n_layer=max(shape.n_layer, 3), n_nextn=1, n_expert_shared=1, expert_gating=GATING_SIGMOID,
                              n_rot=shape.head_dim // 2)
    if arch == ARCH_QWEN3NEXT:  # three linear layers, a full one; a quarter of the head rotated (Qwen3-Next's)
        shape = shape.replace(n_layer=max(shape.n_layer, 4), n_rot=shape.head_dim // 4)
    if arch == ARCH_DEEPSEEK2:  # DeepSeek-V3's: GLM's and groups of experts, a scale, latent attention
        n = shape.n_expert
        groups = next((g for g in (8, 4, 2) if n % g == 0 and n // g >= 2 and 2 * shape.n_expert_used <= n), 0)
        lite = shape.n_layer in DEEPSEEK2_LITE_LAYERS  # read as V2-Lite: one query projection, so no NextN layer
        shape = shape.replace(n_layer=max(shape.n_layer, 3), n_nextn=0 if lite else 1, n_expert_shared=1,
                              expert_gating=GATING_SIGMOID, expert_weights_scale=2.5, n_expert_groups=groups,
                              n_group_used=groups // 2, n_rot=shape.head_dim // 2, n_head_kv=1,
                              q_lora_rank=0 if lite else 3 * shape.n_embd // 4, kv_lora_rank=shape.n_embd // 2)
    return shape


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
    given = {k: v for k, v in overrides.items() if v is not None}
    fields = {f.name: f for f in dataclasses.fields(Shape)}
    for name, value in given.items():
        _check_field(fields[name], value)
    if arch is not None:
        if not isinstance(arch, str) or arch not in ARCHITECTURES:
            raise ValueError(f"arch must be one of {', '.join(ARCHITECTURES)}, got {arch!r}")
        if arch != shape.arch:  # the architecture's defaults follow the widths given; what is given wins
            shape = _arch_defaults(shape.replace(**given), arch).replace(arch=arch)
    shape = shape.replace(**given)
    shape.validate()
    return shape


# --------------------------------------------------------------------------------------------
# the plan: every tensor of the file


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
        tensors = tuple(dataclasses.replace(t, init="routed") if _routed_tensor(t.name) else t for t in tensors)
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


def _routed_tensor(name: str) -> bool:
    """Whether a calibrated routing regime writes (part of) tensor ``name`` (its router aside)."""
    recency_head = ("blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight")
    return name == "token_embd.weight" or name in recency_head or name.endswith((".attn_output.weight",
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
