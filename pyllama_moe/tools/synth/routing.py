"""The calibrated routing regimes of :mod:`pyllama_moe.tools.synth` (``realistic``, ``dispersed``): random weights
whose routers behave like a trained MoE's.

A trained MoE's router logit for expert ``e`` at layer ``l`` mixes a preference of the layer for some experts, the
token itself and the recent context, and what the layers before computed adds a part that an earlier router input
cannot predict. The regimes build exactly these terms, so that on real text

    z[l, e](i) = aP(l) * P[l, e] + N[l, e](token i) + aC(l) * C[l, e](tokens i, i-1, ...)
                 + a_new * F[l, l - 1, e](i) + sum over j >= 2 of a_old[j - 2] * F[l, l - j, e](i)
                 + aD * D[l, e](i, i-1, ...)

with ``P``, ``N``, ``C``, ``F``, ``D`` of unit variance. A :class:`Regime` holds the constants: ``aP`` and ``aC`` by
depth, ``a_new`` and ``a_old``, ``aD`` (``a_drift``), the recency windows' lengths and their sharpness. Each is
fitted to the published figures of the models it stands for (``docs/routing.md``; :mod:`pyllama_moe.tools.routing_refs`
holds them): ``realistic`` to Qwen3-30B-A3B (the deep layers concentrate on fewer experts, a context of about 15
tokens, the next layer 87% predictable, three layers ahead 82%), ``dispersed`` to Mixtral- and shared-expert models
(no preferred experts, a context of a few tokens, routing that drifts). ``F[l, l - j]`` is what layer ``l - j``'s
experts computed, read by layer ``l``'s router through rows of its own: the part of layer ``l``'s routing that the
router inputs of layer ``l - j`` and before cannot predict. Layer ``l - d``'s router input holds what the layers
before it wrote, not what layers ``l - d`` to ``l - 1`` write, so a prediction of layer ``l``'s experts ``d`` layers
ahead misses ``a_new^2 + a_old[0]^2 + ... + a_old[d - 2]^2`` of the logit's variance: the further ahead, the less it
recalls, as in trained models (3.5 to 4 points a layer on Qwen3-class ones). ``a_old`` decays with the distance and
reaches back a few layers (the distances a prefetch looks ahead); further back a layer's routing reads nothing more,
so the recall stops falling there. What the banks hold changes from token to token and barely comes back with the
token, so each bank a router reads spreads its routing, those its own input holds as much as those it lacks: ``aP``
and ``aC`` (``realistic``) and ``aD`` (``dispersed``) are larger for it, which keeps the cache's figures.

``D``, the drift (``dispersed`` only; ``aD`` is 0 in ``realistic``), is a recency-weighted mean of what the experts
of a few early layers wrote at the last few tokens: it changes smoothly from token to token, so neighbouring tokens
share experts, but it comes back far less than ``N`` and ``C`` where a token or a phrase comes back. That is the
difference an LRU cache sees: reuse between neighbouring tokens fills a small cache, while the experts of the
frequent tokens (the spaces and newlines of source code), which ``N`` and ``C`` bring back all through the text,
keep a large cache hitting. ``D`` raises the first without the second.

How the weights carry them (qwen3moe): the last ``1 + d_T + d_C`` dimensions of the residual stream and the banks
form a routing subspace that only the token embedding, the recency heads and the experts' banks write to:

- dimension ``c``: every token embedding holds the constant ``C_MAG`` there; router rows hold ``aP * P / C_MAG``;
- ``d_T`` token dimensions: each token's embedding holds a random vector of norm ``T_MAG``, router rows random ones;
  the drift head adds ``D`` there (norm ``aD * T_MAG``), so the routers read it through the same rows;
- ``d_C`` context dimensions: written by head 0 of layer 0 only (the context head). Its query and key read the
  constant dimension alone, so after the per-head RMS norm they are the same vector for every token, and RoPE turns
  their product into a function of the distance between the tokens: a recency window (the rotary pairs of
  :attr:`Regime.window`). Its values read the token dimensions, so the head outputs a recency-weighted mean of the
  recent tokens' vectors, which its output projection writes into the context dimensions. A short window's few
  fast rotary pairs come back into phase now and then, so at a sharpness of 1 much of the weight lies, over
  thousands of tokens, on far tokens (``window_weights``): the context is then in part a mean of the far text, whose
  frequent tokens act as a popularity. ``dispersed`` multiplies the scores by :attr:`Regime.sharpness` (its
  layer's ``attn_q_norm`` weights on the head's rotary dimensions), which keeps the weight on the window;
- one bank of ``d_new`` dimensions per layer ``l < n_layer - 1``, written by layer ``l``'s experts (their down
  projections' random rows) and read by the routers of layers ``l + 1`` to ``l + 1 + len(a_old)``, each through
  rows of its own (nothing else writes a bank, so it reaches every later layer as written);
- the drift head, head 0 of layer ``DRIFT_LAYER`` (where ``aD`` is not 0): the context head's construction with
  its own window (:attr:`Regime.drift_window`, sharpened alike), its values reading the banks of the
  ``DRIFT_BANKS`` layers before it and its output projection writing the token dimensions. What those layers'
  experts wrote depends on the whole hidden state, so it changes from token to token and barely repeats with the
  token (unlike layer 0's, which the token embedding dominates); layers from ``DRIFT_LAYER`` on read ``D``;
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
    sharpness: float = 1.0  # what the recency heads' attention scores are multiplied by (1: their q/k norms as is)
    a_drift: float = 0.0  # the weight of the drift D (layers DRIFT_LAYER and after)
    drift_window: tuple[float, float] = (0.05, 0.3)  # rotary frequencies of the drift head
    # the weights of what the experts of layers l - 2, l - 3, ... wrote (set how the recall of a prediction falls
    # with its distance)
    a_old: tuple[float, ...] = ()

    def strengths(self, il: int, n_layer: int) -> tuple[float, float]:
        """``(aP, aC)`` of layer ``il``."""
        x = il / max(1, n_layer - 1)
        k = np.array(self.knots)
        return float(np.interp(x, k[:, 0], k[:, 1])), float(np.interp(x, k[:, 0], k[:, 2]))

    def drift(self, il: int, n_layer: int) -> float:
        """The weight of the drift at layer ``il`` (0 before the drift head's layer)."""
        return self.a_drift if 0 < drift_layer(n_layer) <= il else 0.0

    def bank_weights(self, il: int) -> tuple[float, ...]:
        """The weights of what the experts of the layers before ``il`` wrote in layer ``il``'s logit, layer
        ``il - 1``'s first (``a_new``, then ``a_old``), as far back as layer 0."""
        return (self.a_new, *self.a_old)[:il]

    def logit_std(self, il: int, n_layer: int) -> float:
        """The standard deviation of layer ``il``'s router logits over experts and tokens."""
        a_pop, a_ctx = self.strengths(il, n_layer)
        banks = sum(w * w for w in self.bank_weights(il))
        return math.sqrt(a_pop**2 + 1.0 + a_ctx**2 + banks + self.drift(il, n_layer) ** 2)


# Fitted on the routing report's standard-library text at the 30b-a3b expert topology (48 layers, 8 of 128) to the
# published figures of the models each regime stands for (docs/routing.md has them with their sources).
REGIMES: dict[str, Regime] = {
    # Qwen3-30B-A3B: MoE in every layer, no shared expert, the most consistent routing from token to token
    "realistic": Regime("realistic", ((0.0, 0.372, 0.908), (0.45, 0.618, 1.089), (0.5, 1.238, 1.452),
                                      (0.7, 1.832, 1.815), (0.85, 2.723, 2.299), (1.0, 4.208, 3.63)), 0.29,
                        (0.0125, 0.034), a_old=(0.2, 0.2, 0.17, 0.16, 0.15)),
    # Mixtral-8x7B, Qwen2-57B-A14B and the shared-expert models: routing spread wide and changing from token to token
    "dispersed": Regime("dispersed", ((0.0, 0.0, 0.45), (1.0, 0.0, 0.45)), 0.36, (0.05, 0.3), sharpness=2.25,
                        a_drift=1.0, drift_window=(0.03, 0.2), a_old=(0.18, 0.16, 0.15, 0.13, 0.12)),
}
C_MAG = 0.5  # the constant dimension of every token embedding
T_MAG = 0.5  # the norm of a token's vector in the token dimensions
DRIFT_LAYER = 6  # the layer whose head 0 is the drift head
DRIFT_BANKS = 4  # the drift head reads the banks of this many layers before its own


def drift_layer(n_layer: int) -> int:
    """The drift head's layer in a model of ``n_layer`` layers (0: none, the model has no bank before it)."""
    return max(0, min(DRIFT_LAYER, n_layer - 1))


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


def rotary_pairs(head_dim: int, rope_freq_base: float, window: tuple[float, float]) -> tuple[int, ...]:
    """The rotary pairs whose frequencies lie in ``window`` (the nearest one where none does)."""
    theta = _theta(head_dim, rope_freq_base)
    pairs = tuple(int(p) for p in np.flatnonzero((theta >= window[0]) & (theta <= window[1])))
    if not pairs:  # a shape whose frequencies skip the window: the nearest one
        pairs = (int(np.argmin(np.abs(np.log(theta / math.sqrt(window[0] * window[1]))))),)
    return pairs


def layout(n_embd: int, head_dim: int, n_expert: int, n_layer: int, rope_freq_base: float,
           window: tuple[float, float] = REGIMES["realistic"].window) -> Layout:
    """The subspace of a shape; ValueError where the shape has no room for it (it takes at most 3/4 of the width,
    with banks of 8 dimensions where they fit, else of 4, 2 or 1)."""
    d_tok = max(head_dim, min(2 * n_expert, n_embd // 4))
    n_bank = n_layer - 1
    pairs = rotary_pairs(head_dim, rope_freq_base, window)
    for d_new in (8, 4, 2, 1):
        lay = Layout(n_embd, head_dim, d_tok, head_dim, pairs, n_bank, d_new)
        if 4 * lay.size <= 3 * n_embd:
            return lay
    raise ValueError(f"calibrated routing needs n_embd >= {-(-4 * lay.size // 3)} for head_dim {head_dim}, "
                     f"{n_expert} experts and {n_layer} layers, got {n_embd}")


def recency_query(lay: Layout, pairs: tuple[int, ...] | None = None) -> npt.NDArray[np.float32]:
    """A recency head's query (= key) direction: equal weight on its rotary pairs (NEOX: ``p`` and
    ``p + head_dim / 2``; the context head's, ``lay.pairs``, by default), unit norm."""
    q = np.zeros(lay.head_dim, dtype=np.float32)
    for p in lay.pairs if pairs is None else pairs:
        q[p] = q[p + lay.head_dim // 2] = 1.0
    return q / np.float32(np.linalg.norm(q))


def query_norm(lay: Layout, pairs: tuple[int, ...], sharpness: float) -> npt.NDArray[np.float32]:
    """A recency head's layer's ``attn_q_norm`` weights: ones, ``sharpness`` on the head's rotary dimensions (every
    head of the layer shares them; only the recency head's query lies on those dimensions alone)."""
    w = np.ones(lay.head_dim, dtype=np.float32)
    w[np.flatnonzero(recency_query(lay, pairs))] = sharpness
    return w


def window_weights(lay: Layout, rope_freq_base: float, n: int = 512, pairs: tuple[int, ...] | None = None,
                   sharpness: float = 1.0) -> npt.NDArray[np.float64]:
    """A recency head's attention weights over the ``n`` most recent tokens (the newest first), as llama.cpp
    computes them: normalised query and key of RMS 1, the query's rotary dimensions times ``sharpness``, scaled by
    ``1 / sqrt(head_dim)``. With ``sharpness`` 1 the few rotary pairs come back into phase now and then: over
    thousands of tokens most of the weight lies on far tokens (about 3/4 of it over 4096 tokens for dispersed's
    window), a mean of the far context; 2.25 keeps it on the window."""
    theta = _theta(lay.head_dim, rope_freq_base)
    q = recency_query(lay, pairs).astype(np.float64) * math.sqrt(lay.head_dim)
    energy = (q[: lay.head_dim // 2] ** 2 + q[lay.head_dim // 2:] ** 2) * sharpness
    dist = np.arange(n)
    scores = (energy[None, :] * np.cos(theta[None, :] * dist[:, None])).sum(axis=1) / math.sqrt(lay.head_dim)
    w = np.exp(scores - scores.max())
    return np.asarray(w / w.sum(), dtype=np.float64)


def context_norm(lay: Layout, rope_freq_base: float, pairs: tuple[int, ...] | None = None,
                 sharpness: float = 1.0) -> float:
    """The expected norm of a recency head's mean over distinct tokens, in units of one token's: ``sqrt(sum w^2)``
    over its window (the weights of :func:`window_weights`)."""
    w = window_weights(lay, rope_freq_base, pairs=pairs, sharpness=sharpness)
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
    drift_in: float = 1.0  # predicted RMS of the residual at the drift head's layer's attention input

    @property
    def drift_layer(self) -> int:
        """The drift head's layer; 0 where the regime has no drift (or the model no bank before it)."""
        return drift_layer(self.n_layer) if self.regime.a_drift else 0

    @property
    def drift_pairs(self) -> tuple[int, ...]:
        """The drift head's rotary pairs."""
        return rotary_pairs(self.lay.head_dim, self.rope_freq_base, self.regime.drift_window)

    @property
    def drift_banks(self) -> slice:
        """The dimensions the drift head reads: the banks of the ``DRIFT_BANKS`` layers before its own."""
        first = max(0, self.drift_layer - DRIFT_BANKS)
        return slice(self.lay.bank(first).start, self.lay.bank(self.drift_layer - 1).stop)

    def drift_value(self) -> npt.NDArray[np.float32]:
        """``[head_dim, banks]``: the drift head's value rows (norm-preserving on average)."""
        n_in = self.drift_banks.stop - self.drift_banks.start
        g = self.rng("pyllama_moe.synth.drift_value", 0).standard_normal((self.lay.head_dim, n_in))
        return (g / math.sqrt(self.lay.head_dim)).astype(np.float32)

    def drift_output(self) -> npt.NDArray[np.float32]:
        """``[d_tok, head_dim]``: the drift head's output rows into the token dimensions, scaled so that the drift's
        expected norm there is ``a_drift * T_MAG`` (the token term's is ``T_MAG``)."""
        first = max(0, self.drift_layer - DRIFT_BANKS)
        banks = math.sqrt(sum(self.new[b] ** 2 for b in range(first, self.drift_layer)))  # what the value reads
        mean = context_norm(self.lay, self.rope_freq_base, self.drift_pairs, self.regime.sharpness)
        scale = self.regime.a_drift * T_MAG * self.drift_in / (banks * mean)
        g = self.rng("pyllama_moe.synth.drift_output", 0).standard_normal((self.lay.d_tok, self.lay.head_dim))
        return (g * scale / math.sqrt(self.lay.d_tok)).astype(np.float32)

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
        ctx = T_MAG / self.rho0 * context_norm(lay, self.rope_freq_base, sharpness=self.regime.sharpness)
        w[:, lay.ctx] = a_ctx * rng.standard_normal((n_expert, lay.d_ctx)) / ctx
        # the banks of the layers before, the previous layer's first (the draws of the rows above do not depend on
        # how many banks the router reads)
        for j, a_bank in enumerate(self.regime.bank_weights(il), start=1):
            if a_bank:
                rows = rng.standard_normal((n_expert, lay.d_new))
                w[:, lay.bank(il - j)] = a_bank * rows / self.new[il - j]
        # the router reads the residual divided by its RMS at this layer: scaled back, the logits are z as above
        return (w * self.rms[il]).astype(np.float32)

