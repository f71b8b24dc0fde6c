"""On a GPU: the MoE cache's warm start (#46, patch 0022). A state file of the model (``calibrate``) fills the cache at
load: the first tokens hit more than from a cold cache, with the same logits and greedy tokens byte for byte; at close
the experts held are written back, and the next load restores them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pyllama_moe import moe_state
from pyllama_moe.llama import Llama

pytestmark = pytest.mark.gpu
PROMPT = "The quick brown fox jumps over the lazy dog"


@pytest.fixture(scope="module")
def moe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pyllama_moe.tools import synth

    return synth.write_model(tmp_path_factory.mktemp("warm") / "qwen3moe.gguf", "tiny", arch="qwen3moe", skew=1.0,
                             seed=9, n_layer=4)


def run(path: Path, state: Path | None) -> tuple[int, list[int], np.ndarray, float]:
    """Experts restored, 24 greedy tokens after PROMPT, their logits, and the hit rate of the device lookups."""
    with Llama(str(path), n_ctx=256, n_gpu_layers=-1, cpu_moe=True, moe_cache_mib=1, logits_all=True,
               moe_cache_state=state, verbose=False) as llm:
        before = llm.moe_cache_stats()
        tokens = llm.tokenize(PROMPT.encode())
        out = []
        llm.eval(tokens)
        for _ in range(24):
            t = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            out.append(t)
            llm.eval([t])
        logits = np.array(llm.scores[: llm.n_tokens])
        after = llm.moe_cache_stats()
        assert before is not None and after is not None
        hits, misses = (after - before).hits("small", "large", "device")
        return llm.moe_cache_restored, out, logits, hits / max(hits + misses, 1)


def test_warm_start_hits_more_with_the_same_results(moe: Path, tmp_path: Path) -> None:
    from pyllama_moe.tools import calibrate

    state = tmp_path / "state.json"
    moe_state.save(calibrate.calibrate(str(moe), PROMPT * 20, n_tokens=256), state)
    n0, cold_tokens, cold_logits, cold_hits = run(moe, None)
    n1, warm_tokens, warm_logits, warm_hits = run(moe, state)
    assert n0 == 0 and n1 > 0
    assert warm_tokens == cold_tokens and warm_logits.tobytes() == cold_logits.tobytes()
    assert warm_hits > cold_hits, (warm_hits, cold_hits)
    # at close the held experts were written back (source "run"), and the next load restores them
    st = moe_state.load(state, *_key(moe))
    assert st is not None and st.source == "run" and int(st.counts.sum()) > 0
    n2, again, _, _ = run(moe, state)
    assert n2 > 0 and again == cold_tokens


def _key(path: Path) -> tuple[str, int, int]:
    from pyllama_moe.model import Model
    from pyllama_moe.params import ModelParams

    m = Model(str(path), ModelParams(), verbose=False)
    try:
        return m.fingerprint(), m.n_layer(), m.n_expert()
    finally:
        m.close()


def test_a_state_of_another_model_is_a_cold_start(moe: Path, tmp_path: Path) -> None:
    state = tmp_path / "other.json"
    model_id, n_layer, n_expert = _key(moe)
    moe_state.save(moe_state.MoeCacheState("0" * 32, n_layer, n_expert, np.ones((n_layer, n_expert), np.uint32), 1,
                                           "calibrate"), state)
    n, _, _, _ = run(moe, state)
    assert n == 0
