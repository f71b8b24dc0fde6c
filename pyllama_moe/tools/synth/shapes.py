"""The shape of a synthetic model: the architectures synth writes and what each reads of a :class:`Shape`, the tensor
types, the presets (see :mod:`pyllama_moe.tools.synth`; :mod:`.tensors` makes every tensor of the file from a shape)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

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
