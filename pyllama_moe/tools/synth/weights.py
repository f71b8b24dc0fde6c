"""The values of a synthetic model's tensors: random chunks from a counter-based seed, the router skew and the
realistic routing's weights (see :mod:`pyllama_moe.tools.synth`)."""

from __future__ import annotations

import functools
import hashlib
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from pyllama_moe.tools.synth import routing as synth_routing
from pyllama_moe.tools.synth.shapes import (
    ARCH_QWEN3MOE,
    DENSE_STD,
    EXPERT_RMS,
    GGML_TYPES,
    ROUTER_STD,
    Shape,
)
from pyllama_moe.tools.synth.tensors import Plan, TensorPlan

SKEW_BOOST = 3.0
SHARED_FRACTION = 0.5
ATTN_MIXING = 0.1  # variance kept by attention's averaging over the context (measured ~0.1)

_CHUNK_ELEMENTS = 1 << 23  # float tensors are generated in chunks of this many values
_CHUNK_BLOCKS = 1 << 20  # quantized tensors in chunks of this many blocks

# root mean square of the integer part of each quantized type's random values
_Q_RMS: dict[str, float] = {
    "q4_0": math.sqrt(21.5),
    "q8_0": math.sqrt(5461.5),  # E[q^2] for q uniform in [-128, 127]
}


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


def _decay_values(t: TensorPlan, seed: int) -> npt.NDArray[np.float32]:
    """qwen3next's per-head decay ``ssm_a``: ``-A`` for ``A`` uniform in [1, 16] (``A_log``'s initialisation), so that
    the recurrent state decays whatever the rest of the weights."""
    return np.asarray(-_rng(seed, t.name, 0).uniform(1.0, 16.0, t.n_elements), dtype="<f4")


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


def _attn_mean_square(shape: Shape) -> float:
    """What an attention adds to the mean square of each residual dimension (see :func:`_residual_rms`)."""
    return (DENSE_STD**2 * shape.n_embd_q) * (DENSE_STD**2 * shape.n_embd) * ATTN_MIXING


def _residual_rms(shape: Shape) -> list[float]:
    """Predicted root mean square of the token-dependent residual at each layer's MoE input.

    Sublayer inputs are RMS-normalised (unit mean square), so each attention adds
    ``DENSE_STD^2 n_q * DENSE_STD^2 n_embd * ATTN_MIXING`` (averaging values over the context
    shrinks the token-dependent part) and each MoE ``EXPERT_RMS^2 n_ff_exp E[silu(g)^2] E[u^2]
    E[sum w^2]`` to the mean square.
    """
    attn = _attn_mean_square(shape)
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
# the calibrated routing regimes (pyllama_moe.tools.synth.routing)


def _prepare_routing(p: Plan, seed: int) -> synth_routing.Routing | None:
    """The routing data of plan ``p`` in a calibrated regime (None for the other regimes)."""
    if p.routing not in synth_routing.REGIMES:
        return None
    regime = synth_routing.REGIMES[p.routing]
    s = p.shape
    lay = synth_routing.layout(s.n_embd, s.head_dim, s.n_expert, s.n_layer, s.rope_freq_base, regime.window)
    # the embedding: DENSE_STD noise outside the subspace, the constant and a token vector in it
    rho0 = math.sqrt((DENSE_STD**2 * lay.c + synth_routing.C_MAG**2 + synth_routing.T_MAG**2) / s.n_embd)
    rms = tuple(math.sqrt(r * r - DENSE_STD**2 + rho0**2) for r in _residual_rms(s))
    # what a layer's experts write into each dimension of its bank, with this layer's (not random) router logits
    new = tuple(math.sqrt(lay.d_new * _moe_mean_square(s, _topk_weight_sq(s, regime.logit_std(il, s.n_layer))))
                for il in range(s.n_layer))
    # the RMS of the residual at the drift head's input: the embedding, the context, and the attentions and experts
    # of the layers before, which write the dimensions outside the subspace (and the experts their banks)
    ctx = synth_routing.T_MAG / rho0 * synth_routing.context_norm(lay, s.rope_freq_base, sharpness=regime.sharpness)
    ms = rho0**2 + ctx**2 / s.n_embd
    for il in range(synth_routing.drift_layer(s.n_layer)):
        ms += ((_attn_mean_square(s) + new[il] ** 2 / lay.d_new) * lay.c + new[il] ** 2) / s.n_embd
    drift_in = math.sqrt(ms)
    return synth_routing.Routing(lay, s.n_layer, s.rope_freq_base, rho0, rms, new, functools.partial(_rng, seed),
                                 regime, drift_in)


def _routed_chunk(t: TensorPlan, seed: int, chunk: int, r: synth_routing.Routing) -> npt.NDArray[Any]:
    """Chunk ``chunk`` of a tensor that a calibrated routing regime writes: the random chunk with the subspace's rows
    and columns replaced (see :mod:`pyllama_moe.tools.synth.routing`)."""
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
        head = sub & (cols < lay.head_dim)
        if t.name.startswith("blk.0."):  # the recency head (head 0) writes the context dimensions
            ctx = head & (rows >= lay.ctx.start) & (rows < lay.ctx.stop)
            values[ctx] = r.output_proj()[rows[ctx] - lay.ctx.start, cols[ctx]]
        elif r.drift_layer and _layer_of(t.name) == r.drift_layer:  # the drift head writes the token dimensions
            tok = head & (rows >= lay.tok.start) & (rows < lay.tok.stop)
            values[tok] = r.drift_output()[rows[tok] - lay.tok.start, cols[tok]]
    elif t.name.endswith(".attn_q_norm.weight"):  # a recency head's layer: its rotary dimensions sharpened
        pairs = lay.pairs if t.name.startswith("blk.0.") else r.drift_pairs
        values = synth_routing.query_norm(lay, pairs, r.regime.sharpness)[idx]
    else:  # the query, key and value of a recency head (kv head 0, and q head 0): layer 0's, the drift head's
        head = rows < lay.head_dim
        values[head] = 0.0
        drift = not t.name.startswith("blk.0.")
        if t.name.endswith("attn_v.weight"):
            src = r.drift_banks if drift else lay.tok
            sel = head & (cols >= src.start) & (cols < src.stop)
            proj = r.drift_value() if drift else r.value_proj()
            values[sel] = proj[rows[sel], cols[sel] - src.start]
        else:
            at_c = head & (cols == lay.c)
            values[at_c] = synth_routing.recency_query(lay, r.drift_pairs if drift else None)[rows[at_c]]
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

