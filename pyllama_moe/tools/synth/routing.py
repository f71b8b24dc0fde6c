"""The calibrated routing regimes of :mod:`pyllama_moe.tools.synth` (``realistic``, ``dispersed``): random weights
whose routers behave like a trained MoE's.

A trained MoE's router logit for expert ``e`` at layer ``l`` mixes a preference of the layer for some experts, the
token itself and the recent context, and what the layer before computed adds a part that its own router input cannot
predict. The regimes build exactly these terms, so that on real text

    z[l, e](i) = aP(l) * P[l, e] + N[l, e](token i) + aC(l) * C[l, e](tokens i, i-1, ...) + a_new * F[l, e](i)

with ``P``, ``N``, ``C``, ``F`` of unit variance. A :class:`Regime` holds the constants: ``aP`` and ``aC`` by depth,
``a_new`` and the length of the recency window. Each is fitted to the published figures of the models it stands for
(``docs/routing.md``; :mod:`pyllama_moe.tools.routing_refs` holds them): ``realistic`` to Qwen3-30B-A3B (the deep
layers concentrate on fewer experts, a context of about 15 tokens, the next layer 86% predictable), ``dispersed`` to
Mixtral- and shared-expert models (no preferred experts, a context of a few tokens). ``F`` is what layer ``l - 1``'s
experts computed: the part of layer ``l``'s routing that layer ``l - 1``'s router input cannot predict.

How the weights carry them (qwen3moe): the last ``1 + d_T + d_C`` dimensions of the residual stream form a routing
subspace that only the token embedding and one attention head write to:

- dimension ``c``: every token embedding holds the constant ``C_MAG`` there; router rows hold ``aP * P / C_MAG``;
- ``d_T`` token dimensions: each token's embedding holds a random vector of norm ``T_MAG``, router rows random ones;
- ``d_C`` context dimensions: written by head 0 of layer 0 only. Its query and key read the constant dimension
  alone, so after the per-head RMS norm they are the same vector for every token, and RoPE turns their product into
  a function of the distance between the tokens: a recency window (the rotary pairs of :attr:`Regime.window`). Its
  values read the token dimensions, so the head outputs a recency-weighted mean of the recent tokens' vectors, which
  its output projection writes into the context dimensions;
- one bank of ``d_new`` dimensions per layer ``l < n_layer - 1``, written by layer ``l``'s experts (their down
  projections' random rows) and read by layer ``l + 1``'s router only;
- every other writer of the residual stream (the other attention heads and layers, the rest of the experts' down
  projections) has zero rows there.

The router input is the RMS-normalised residual: a factor per token, which leaves the top-k unchanged. Everything
outside the subspace (the rest of attention and the experts, random as in the other regimes) changes the mixture
weights and the logits, not which experts are selected. The expert tensors have the same size and types as in the
other regimes, so the speed of a forward pass is the same; only which experts a token selects differs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class Regime:
    """The constants of one calibrated regime: the strengths of the terms of the logit above, nothing else (the
    weights' structure and the compute are the same in every regime)."""

    name: str
    # depth (layer / (n_layer - 1)) -> (aP, aC), interpolated linearly between the knots
    knots: tuple[tuple[float, float, float], ...]
    a_new: float  # the weight of what the previous layer's experts add (sets the next-layer recall)
    window: tuple[float, float]  # rotary frequencies (radians per token) of the recency head: its window's length

    def strengths(self, il: int, n_layer: int) -> tuple[float, float]:
        """``(aP, aC)`` of layer ``il``."""
        x = il / max(1, n_layer - 1)
        k = np.array(self.knots)
        return float(np.interp(x, k[:, 0], k[:, 1])), float(np.interp(x, k[:, 0], k[:, 2]))

    def logit_std(self, il: int, n_layer: int) -> float:
        """The standard deviation of layer ``il``'s router logits over experts and tokens."""
        a_pop, a_ctx = self.strengths(il, n_layer)
        return math.sqrt(a_pop**2 + 1.0 + a_ctx**2 + (self.a_new**2 if il else 0.0))


# Fitted on the routing report's standard-library text at the 30b-a3b expert topology (48 layers, 8 of 128) to the
# published figures of the models each regime stands for (docs/routing.md has them with their sources).
REGIMES: dict[str, Regime] = {
    # Qwen3-30B-A3B: MoE in every layer, no shared expert, the most consistent routing from token to token
    "realistic": Regime("realistic", ((0.0, 0.338, 0.825), (0.45, 0.562, 0.99), (0.5, 1.125, 1.32),
                                      (0.7, 1.665, 1.65), (0.85, 2.475, 2.09), (1.0, 3.825, 3.3)), 0.3,
                        (0.0125, 0.034)),
    # Mixtral-8x7B, Qwen2-57B-A14B and the shared-expert models: routing spread wide and changing from token to token
    "dispersed": Regime("dispersed", ((0.0, 0.0, 1.25), (1.0, 0.0, 1.25)), 0.35, (0.1, 0.3)),
}
C_MAG = 0.5  # the constant dimension of every token embedding
T_MAG = 0.5  # the norm of a token's vector in the token dimensions


@dataclass(frozen=True)
class Layout:
    """Where the routing subspace lies in the residual stream, and the recency head's rotary pairs."""

    n_embd: int
    head_dim: int
    d_tok: int
    d_ctx: int
    pairs: tuple[int, ...]
    n_bank: int  # banks of new information (n_layer - 1)
    d_new: int  # dimensions per bank

    @property
    def size(self) -> int:
        """Dimensions of the subspace."""
        return 1 + self.d_tok + self.d_ctx + self.n_bank * self.d_new

    @property
    def c(self) -> int:
        """The constant dimension, the subspace's first."""
        return self.n_embd - self.size

    @property
    def tok(self) -> slice:
        return slice(self.c + 1, self.c + 1 + self.d_tok)

    @property
    def ctx(self) -> slice:
        return slice(self.c + 1 + self.d_tok, self.c + 1 + self.d_tok + self.d_ctx)

    def bank(self, il: int) -> slice:
        """The dimensions layer ``il``'s experts write (``il < n_bank``)."""
        first = self.ctx.stop + il * self.d_new
        return slice(first, first + self.d_new)


def _theta(head_dim: int, rope_freq_base: float) -> npt.NDArray[np.float64]:
    """RoPE's angle per token of each rotary pair."""
    return np.asarray(rope_freq_base ** (-2.0 * np.arange(head_dim // 2) / head_dim), dtype=np.float64)


def layout(n_embd: int, head_dim: int, n_expert: int, n_layer: int, rope_freq_base: float,
           window: tuple[float, float] = REGIMES["realistic"].window) -> Layout:
    """The subspace of a shape; ValueError where the shape has no room for it (it takes at most 3/4 of the width,
    with banks of 8 dimensions where they fit, else of 4, 2 or 1)."""
    d_tok = max(head_dim, min(2 * n_expert, n_embd // 4))
    n_bank = n_layer - 1
    theta = _theta(head_dim, rope_freq_base)
    pairs = tuple(int(p) for p in np.flatnonzero((theta >= window[0]) & (theta <= window[1])))
    if not pairs:  # a shape whose frequencies skip the window: the nearest one
        pairs = (int(np.argmin(np.abs(np.log(theta / math.sqrt(window[0] * window[1]))))),)
    for d_new in (8, 4, 2, 1):
        lay = Layout(n_embd, head_dim, d_tok, head_dim, pairs, n_bank, d_new)
        if 4 * lay.size <= 3 * n_embd:
            return lay
    raise ValueError(f"calibrated routing needs n_embd >= {-(-4 * lay.size // 3)} for head_dim {head_dim}, "
                     f"{n_expert} experts and {n_layer} layers, got {n_embd}")


def recency_query(lay: Layout) -> npt.NDArray[np.float32]:
    """The recency head's query (= key) direction: equal weight on its rotary pairs (NEOX: ``p`` and
    ``p + head_dim / 2``), unit norm."""
    q = np.zeros(lay.head_dim, dtype=np.float32)
    for p in lay.pairs:
        q[p] = q[p + lay.head_dim // 2] = 1.0
    return q / np.float32(np.linalg.norm(q))


def window_weights(lay: Layout, rope_freq_base: float, n: int = 512) -> npt.NDArray[np.float64]:
    """The recency head's attention weights over the ``n`` most recent tokens (the newest first), as llama.cpp
    computes them: normalised query and key of RMS 1, scaled by ``1 / sqrt(head_dim)``."""
    theta = _theta(lay.head_dim, rope_freq_base)
    q = recency_query(lay).astype(np.float64) * math.sqrt(lay.head_dim)
    energy = q[: lay.head_dim // 2] ** 2 + q[lay.head_dim // 2:] ** 2
    dist = np.arange(n)
    scores = (energy[None, :] * np.cos(theta[None, :] * dist[:, None])).sum(axis=1) / math.sqrt(lay.head_dim)
    w = np.exp(scores - scores.max())
    return np.asarray(w / w.sum(), dtype=np.float64)


def context_norm(lay: Layout, rope_freq_base: float) -> float:
    """The expected norm of the context dimensions' content, in units of a token vector's norm (after layer 0's
    attention norm): the recency head's mean over ``sum w^2`` worth of distinct tokens."""
    w = window_weights(lay, rope_freq_base)
    return float(math.sqrt(np.sum(w * w)))


TOKEN_BLOCK = 4096  # token vectors are drawn in blocks of this many tokens (so any chunk can make its own)


@dataclass(frozen=True)
class Routing:
    """The weights' routing parts of one model: its layout, the recency head's projections and the popularities."""

    lay: Layout
    n_layer: int
    rope_freq_base: float
    rho0: float  # RMS of a token embedding (layer 0's attention input)
    rms: tuple[float, ...]  # predicted RMS of the residual at each layer's router input (scales the logits)
    new: tuple[float, ...]  # predicted norm of what each layer's experts write into their bank
    rng: Callable[[str, int], np.random.Generator]
    regime: Regime

    def token_vectors(self, tokens: npt.NDArray[np.int64]) -> npt.NDArray[np.float32]:
        """``[len(tokens), d_tok]``: each token's unit vector times ``T_MAG``."""
        out = np.empty((len(tokens), self.lay.d_tok), dtype=np.float32)
        blocks = tokens // TOKEN_BLOCK
        for b in np.unique(blocks):
            u = self.rng("pyllama_moe.synth.token_vectors", int(b)).standard_normal((TOKEN_BLOCK, self.lay.d_tok))
            u *= T_MAG / np.linalg.norm(u, axis=1, keepdims=True)
            sel = blocks == b
            out[sel] = u[tokens[sel] % TOKEN_BLOCK]
        return out

    def value_proj(self) -> npt.NDArray[np.float32]:
        """``[head_dim, d_tok]``: the recency head's value rows (norm-preserving on average)."""
        g = self.rng("pyllama_moe.synth.recency_value", 0).standard_normal((self.lay.head_dim, self.lay.d_tok))
        return (g / math.sqrt(self.lay.head_dim)).astype(np.float32)

    def output_proj(self) -> npt.NDArray[np.float32]:
        """``[d_ctx, head_dim]``: the recency head's output rows into the context dimensions."""
        g = self.rng("pyllama_moe.synth.recency_output", 0).standard_normal((self.lay.d_ctx, self.lay.head_dim))
        return (g / math.sqrt(self.lay.head_dim)).astype(np.float32)

    def router(self, il: int, n_expert: int) -> npt.NDArray[np.float32]:
        """``[n_expert, n_embd]``: layer ``il``'s router, zero outside the subspace."""
        lay = self.lay
        a_pop, a_ctx = self.regime.strengths(il, self.n_layer)
        rng = self.rng(f"pyllama_moe.synth.router.{il}", 0)
        pop = rng.standard_normal(n_expert)
        w = np.zeros((n_expert, lay.n_embd), dtype=np.float64)
        w[:, lay.c] = a_pop * pop / C_MAG
        w[:, lay.tok] = rng.standard_normal((n_expert, lay.d_tok)) / T_MAG
        # the context's scale: the token vectors after layer 0's attention norm, through the window
        ctx = T_MAG / self.rho0 * context_norm(lay, self.rope_freq_base)
        w[:, lay.ctx] = a_ctx * rng.standard_normal((n_expert, lay.d_ctx)) / ctx
        if il:
            w[:, lay.bank(il - 1)] = self.regime.a_new * rng.standard_normal((n_expert, lay.d_new)) / self.new[il - 1]
        # the router reads the residual divided by its RMS at this layer: scaled back, the logits are z as above
        return (w * self.rms[il]).astype(np.float32)

