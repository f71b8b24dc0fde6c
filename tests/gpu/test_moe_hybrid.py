"""On a GPU: the hybrid decode (#41, ``Llama(moe_hybrid=...)``): in decode steps looked up on the device, the CPU
computes a share of each MoE layer's cache misses from the host experts while PCIe uploads the rest. The CPU's kernels
round otherwise than the GPU's, so its logits are compared for closeness with the cache alone's (top-1 agreement over
128 teacher-forced positions, a bounded logit error), with both hand-offs; ``moe_hybrid=False`` stays byte-identical
to a context made without the keyword; ``"auto"`` measures its rates.

The models (qwen3moe, and gpt-oss with its biases and clamped activation): 76 experts (4 a token), about 2 MiB of
experts in one MoE layer or two: a cache of 1 MiB holds about half of them, so decode steps miss.
``LLAMA_MOE_HYBRID_SHARE=1.0`` makes the CPU take every miss up to its most per layer and ubatch, whatever the rates
measured on this machine (on a model this small the upload may well be the faster)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pyllama_moe import Llama
from pyllama_moe.gguf_info import GGUFInfo
from pyllama_moe.moe import MoeCacheStats

pytestmark = pytest.mark.gpu
N_POSITIONS = 128
CACHE_MIB = 1
# the environment each run starts from: the library's defaults (device lookups, the prediction at 2, no forced share)
SWITCHES = ("LLAMA_MOE_HYBRID_SHARE", "LLAMA_MOE_HYBRID_HANDOFF", "LLAMA_MOE_CACHE_DEVICE", "LLAMA_MOE_CACHE_PREDICT")
FORCED = {"LLAMA_MOE_HYBRID_SHARE": "1.0"}
# How close is close. The CPU's part differs from the GPU's by rounding only: both quantize the layer's input to 8 bits
# in blocks of 32 (q8_0 on the CPU, q8_1 on CUDA; a tie may round the other way), the integer dot products are exact,
# the scaled sums and the sum of the partial outputs are added in another order: relative errors of about 1e-6 to
# 1e-4 per expert output. Measured as each position's largest logit difference in the reference's spread there (the
# standard deviation over the vocabulary):
# - One MoE layer: its router reads the attention's output, the same in both runs, so the difference is that rounding
#   alone, far under 0.02 of the spread at every position (on the CPU, where the two paths only add in another
#   order: 1.2e-7). A wrong computation is far larger: dropping one of a token's 4 experts (expert_used_count 3, on
#   the CPU build) moves every position by at least 0.54 of its spread (1.7 in the median) and keeps 27-37% of the
#   top-1 picks.
# - Two: the second layer's router reads the first's output, and a pick at a near tie flips on any rounding: that
#   position moves as far as a wrong expert would (on the CPU build, flash attention on against off, a rounding of
#   the attention: 2.2 of the spread at one position of 128, 0.06 in the median, 95% of the top-1 picks kept). So
#   the median over positions: a wrong computation moves every position (dropping an expert: 2.4 to 2.7 in the
#   median, at least 0.98), rounding with a few flips leaves most of them within 0.06.
MAX_ERROR_ONE_LAYER = 0.02  # every position
MIN_AGREEMENT_ONE_LAYER = 0.97  # top-1 picks: 3 of 128 may part at near ties, which a random-weight model has plenty of
MAX_MEDIAN_TWO_LAYERS = 0.25  # the median position: 4 times the flips' 0.06, 4 times under the smallest wrong shift
MIN_AGREEMENT_TWO_LAYERS = 0.75  # flips at the second router move the pick at a few positions; dropping an expert
# keeps at most 37% of them


@pytest.fixture(scope="module", params=[("qwen3moe", 1), ("qwen3moe", 2), ("gpt-oss", 1), ("gpt-oss", 2)],
                ids=lambda p: f"{p[0]}-{p[1]}layer")
def moe(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    # qwen3moe's SwiGLU experts, and gpt-oss's with per-expert biases and a clamped SwiGLU; one layer of experts twice
    # as wide holds as many bytes as two
    from pyllama_moe.tools import synth

    arch, n_layer = request.param
    path = synth.write_model(tmp_path_factory.mktemp("hybrid") / f"{arch}-{n_layer}.gguf", "tiny", arch=arch,
                             skew=1.0, seed=9, n_expert=76, n_expert_used=4, n_ff_exp=256 // n_layer,
                             n_layer=n_layer)
    share = (CACHE_MIB << 20) / GGUFInfo.read(path).expert_bytes
    assert 0.4 < share < 0.6, share  # "a cache of half its experts"
    return path


def tokens(bos: int) -> list[int]:
    """The fixed sequence fed one token a step: BOS and 127 ids drawn once."""
    return [bos, *(int(t) for t in np.random.default_rng(41).integers(100, 5000, N_POSITIONS - 1))]


UNSET = object()


def forced(path: Path, hybrid: Any = UNSET, env: dict[str, str] | None = None) -> tuple[np.ndarray, MoeCacheStats]:
    """The logits of every position of :func:`tokens` decoded one token a step (device lookups) through a cache of
    half the experts, with ``moe_hybrid`` as given (not passed at all: UNSET) and ``env`` set, and the cache's
    counts."""
    with pytest.MonkeyPatch.context() as mp:
        for k in SWITCHES:
            mp.delenv(k, raising=False)
        for k, v in (env or {}).items():
            mp.setenv(k, v)  # read when the context is made
        kwargs = {} if hybrid is UNSET else {"moe_hybrid": hybrid}
        with Llama(str(path), n_ctx=256, n_gpu_layers=-1, cpu_moe=True, load_mode="none", moe_cache_mib=CACHE_MIB,
                   logits_all=True, verbose=False, **kwargs) as llm:
            for t in tokens(llm.token_bos()):
                llm.eval([t])
            logits = llm.scores[:N_POSITIONS].copy()
            stats = llm.moe_cache_stats()
    assert stats is not None and np.isfinite(logits).all()
    return logits, stats


@pytest.fixture(scope="module")
def reference(moe: Path) -> tuple[np.ndarray, MoeCacheStats]:
    """The cache alone (``moe_hybrid=False``): what the hybrid's logits are compared with."""
    return forced(moe, False)


def assert_close(got: np.ndarray, want: np.ndarray, what: str, n_layer: int) -> None:
    """Close as rounding leaves the logits (see MAX_ERROR_ONE_LAYER and what follows it)."""
    agreement = float((got.argmax(axis=1) == want.argmax(axis=1)).mean())
    error = np.abs(got - want).max(axis=1) / want.std(axis=1)  # per position
    print(f"{what} ({n_layer} MoE layers): top-1 agreement {agreement:.3f}, logit error of the spread: largest "
          f"{error.max():.2e}, median {np.median(error):.2e}")
    if n_layer == 1:
        assert agreement >= MIN_AGREEMENT_ONE_LAYER, (what, agreement)
        assert error.max() <= MAX_ERROR_ONE_LAYER, (what, error.max())
    else:
        assert agreement >= MIN_AGREEMENT_TWO_LAYERS, (what, agreement)
        assert np.median(error) <= MAX_MEDIAN_TWO_LAYERS, (what, np.median(error))


def n_moe_layers(path: Path) -> int:
    return GGUFInfo.read(path).require_block_count()


def test_hybrid_is_close_to_the_cache_alone(moe: Path, reference: tuple[np.ndarray, MoeCacheStats]) -> None:
    logits, stats = forced(moe, True, FORCED)
    assert_close(logits, reference[0], "moe_hybrid=True", n_moe_layers(moe))
    # the CPU computed some of the misses (the device lookups' misses count them too), in hand-offs it was busy in
    assert stats.host_max > 0 and stats.n_host > 0, stats
    assert stats.n_host_calls > 0 and stats.host_busy_us > 0, stats
    # never more than its most per MoE layer and ubatch (one token a ubatch)
    assert stats.n_host <= N_POSITIONS * n_moe_layers(moe) * stats.host_max, stats
    assert stats.hits_device + stats.misses_device > 0, stats  # decode looked up on the device
    # the cache alone: nothing on the CPU
    assert (reference[1].n_host, reference[1].n_host_calls, reference[1].host_max) == (0, 0, 0), reference[1]
    print(f"split: host_max {stats.host_max}, {stats.n_host} experts on the CPU in {stats.n_host_calls} hand-offs, "
          f"rates: CPU {stats.host_expert_us:.1f} us/expert, upload {stats.upload_expert_us:.1f} us/expert, "
          f"hand-off {stats.handoff_us:.1f} us")


def test_off_is_byte_identical_to_no_keyword(moe: Path, reference: tuple[np.ndarray, MoeCacheStats]) -> None:
    # moe_hybrid=False is the library's default: the same graph, the same logits byte for byte, nothing on the CPU
    logits, stats = forced(moe)
    assert logits.tobytes() == reference[0].tobytes()
    assert (stats.n_host, stats.n_host_calls, stats.host_busy_us, stats.host_max) == (0, 0, 0, 0), stats
    # the forced share does nothing while the hybrid is off
    logits, stats = forced(moe, False, FORCED)
    assert logits.tobytes() == reference[0].tobytes() and stats.n_host == 0, stats


@pytest.mark.parametrize("handoff", ["func", "flags"])
def test_both_handoffs_are_close(moe: Path, reference: tuple[np.ndarray, MoeCacheStats], handoff: str) -> None:
    # LLAMA_MOE_HYBRID_HANDOFF chooses between the two ways the CPU learns its experts and hands back its part (a
    # measurement; one of them goes): each computes on the CPU and stays close
    logits, stats = forced(moe, True, {**FORCED, "LLAMA_MOE_HYBRID_HANDOFF": handoff})
    assert stats.n_host > 0 and stats.host_max > 0, (handoff, stats)
    assert_close(logits, reference[0], f"handoff {handoff}", n_moe_layers(moe))


def test_auto_measures_its_rates(moe: Path, reference: tuple[np.ndarray, MoeCacheStats]) -> None:
    # "auto" chooses from the rates it measures when the context is made: both measured; where it chose a share the
    # logits are close, where it chose none they are the cache alone's, byte for byte
    logits, stats = forced(moe, "auto")
    assert stats.host_expert_us > 0 and stats.upload_expert_us > 0 and stats.handoff_us >= 0, stats
    print(f"auto: host_max {stats.host_max}, CPU {stats.host_expert_us:.1f} us/expert, upload "
          f"{stats.upload_expert_us:.1f} us/expert, hand-off {stats.handoff_us:.1f} us")
    if stats.host_max == 0:
        assert stats.n_host == 0 and logits.tobytes() == reference[0].tobytes(), stats
    else:
        assert_close(logits, reference[0], "moe_hybrid='auto'", n_moe_layers(moe))
