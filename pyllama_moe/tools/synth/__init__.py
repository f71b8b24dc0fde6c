"""Write random-weight GGUF models that llama.cpp (b11549) loads: the MoE architectures ``qwen3moe``, ``gpt-oss``,
``qwen2moe`` (a shared expert with its gate, attention biases), ``olmoe`` (query and key norms over the whole width),
``llama`` with experts (Mixtral), ``granitemoe`` (Mixtral's tensors, Granite's multipliers), ``ernie4_5-moe`` (a
leading dense layer, a selection bias, a shared expert), ``llama4`` (MoE every other layer, a shared expert),
``glm4moe`` (DeepSeek-V3's routing: a leading dense layer, shared experts, sigmoid gating with a selection bias; a NextN
layer after the trunk), ``deepseek2`` (that routing with groups of experts, and multi-head latent attention) and
``qwen3next`` (linear attention in three layers of four, a gated shared expert), and the dense ``qwen3``.

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

Router skew (``skew > 0``, ``qwen3moe`` and ``gpt-oss`` only)
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

Layout: :mod:`.shapes` (architectures, shapes, presets), :mod:`.tensors` (the plan: every tensor of the file),
:mod:`.weights` (random values, the skew, the realistic routing's weights), :mod:`.routing` (the realistic routing's
construction), :mod:`.vocab` (the tokenizer copied from a vocab GGUF), :mod:`.writer` (the GGUF file), :mod:`.cli` (the
``synth`` command).

Public API: :func:`write_model`, :func:`plan`, :class:`Shape`, :data:`PRESETS`,
:func:`resolve_shape`, :func:`default_vocab_path`, :func:`main` (the ``synth`` command).
"""

from __future__ import annotations

from pyllama_moe.tools.synth.cli import main
from pyllama_moe.tools.synth.shapes import (
    ARCHITECTURES,
    DENSE_STD,
    DENSE_TYPES,
    EXPERT_RMS,
    EXPERT_TYPES,
    GGML_TYPES,
    MOE_ARCHITECTURES,
    PRESETS,
    ROUTER_STD,
    Shape,
    resolve_shape,
)
from pyllama_moe.tools.synth.tensors import ROUTINGS, SCALE_SIGNS, Plan, TensorPlan, plan, regime_of
from pyllama_moe.tools.synth.vocab import default_vocab_path
from pyllama_moe.tools.synth.weights import decode
from pyllama_moe.tools.synth.writer import META_PREFIX, write_model

__all__ = [
    "ARCHITECTURES",
    "DENSE_STD",
    "DENSE_TYPES",
    "EXPERT_RMS",
    "EXPERT_TYPES",
    "GGML_TYPES",
    "META_PREFIX",
    "MOE_ARCHITECTURES",
    "PRESETS",
    "ROUTER_STD",
    "ROUTINGS",
    "SCALE_SIGNS",
    "Plan",
    "Shape",
    "TensorPlan",
    "decode",
    "default_vocab_path",
    "main",
    "plan",
    "regime_of",
    "resolve_shape",
    "write_model",
]
