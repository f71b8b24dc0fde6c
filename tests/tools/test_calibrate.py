"""``python -m pyllama_moe calibrate`` (pyllama_moe.tools.calibrate, #46): the experts each MoE layer selects on a text,
counted into the MoE cache's warm-start file under the key a Llama of the same model has."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from pyllama_moe import __main__ as cli
from pyllama_moe import moe_state
from pyllama_moe.gguf_info import GGUFInfo
from pyllama_moe.llama import Llama
from pyllama_moe.tools import calibrate
from pyllama_moe.tools.text import stdlib_text

from fixtures.models import model_path

TEXT = stdlib_text(n_chars=2000)


def key_of(path: Path) -> tuple[str, int, int]:
    """The key as a Llama of the model sees it: its model's fingerprint and block count, the GGUF's expert count."""
    with Llama(str(path), n_ctx=64, verbose=False) as llm:
        model_id, n_layer = llm._model.fingerprint(), llm._model.n_layer()
    meta = GGUFInfo.read(path).meta
    return model_id, n_layer, int(meta[f"{meta['general.architecture']}.expert_count"])


def n_expert_used(path: Path) -> int:
    meta = GGUFInfo.read(path).meta
    return int(meta[f"{meta['general.architecture']}.expert_used_count"])


def test_counts_have_the_models_shape_and_every_selection(path: Path) -> None:
    state = calibrate.calibrate(path, TEXT, n_tokens=40, threads=2)
    model_id, n_layer, n_expert = key_of(path)
    assert (state.model_id, state.n_layer, state.n_expert) == (model_id, n_layer, n_expert)
    assert state.source == "calibrate" and state.n_tokens == 40
    assert state.counts.shape == (n_layer, n_expert) and state.counts.dtype == np.uint64
    # every token selects n_expert_used distinct experts in every (MoE) layer
    assert state.counts.sum(axis=1).tolist() == [40 * n_expert_used(path)] * n_layer
    assert int(state.counts.max()) <= 40
    # a shorter text counts fewer tokens: the counts are of the text, not of the model alone
    short = calibrate.calibrate(path, "def f(x): return x", n_tokens=40, threads=2)
    assert short.n_tokens < 40 and short.counts.sum(axis=1).tolist() == [short.n_tokens * 2] * n_layer


@pytest.mark.parametrize(("arch", "moe_layers"), [("ernie4_5-moe", [1]), ("llama4", [1, 3])])
def test_dense_layers_count_nothing(arch: str, moe_layers: list[int]) -> None:
    # ERNIE-4.5: a leading dense layer; Llama 4: MoE every other layer (interleave_moe_layer_step 2)
    p = model_path(arch)
    state = calibrate.calibrate(p, TEXT, n_tokens=24, threads=2)
    sums = state.counts.sum(axis=1)
    assert state.n_layer == GGUFInfo.read(p).meta[f"{arch}.block_count"]
    assert [il for il in range(state.n_layer) if sums[il]] == moe_layers
    assert all(sums[il] == 24 * n_expert_used(p) for il in moe_layers)


def test_top_share() -> None:
    # layer 0: one expert of four takes all; layer 1: even; layer 2 selected nothing and is left out of the mean
    counts = np.array([[0, 9, 0, 0], [5, 5, 5, 5], [0, 0, 0, 0]], dtype=np.uint64)
    assert calibrate.top_share(counts, 0.25) == pytest.approx((1.0 + 0.25) / 2)
    assert calibrate.top_share(counts, 0.5) == pytest.approx((1.0 + 0.5) / 2)
    assert calibrate.top_share(np.zeros((2, 4), np.uint64)) == 0.0


def test_the_command_writes_a_file_load_accepts_with_the_models_key(path: Path, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str],
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    text = tmp_path / "text.txt"
    text.write_text(TEXT, encoding="utf-8")
    out = tmp_path / "state.json"
    assert cli.main(["calibrate", str(path), "--text", str(text), "--out", str(out), "--tokens", "32",
                     "--threads", "2"]) == 0
    model_id, n_layer, n_expert = key_of(path)
    state = moe_state.load(out, model_id, n_layer, n_expert)
    assert state is not None and state.n_tokens == 32 and state.source == "calibrate"
    assert state.counts.sum() == 32 * n_expert_used(path) * n_layer
    printed = capsys.readouterr().out
    share = calibrate.top_share(state.counts)
    assert f"32 tokens, {n_layer} MoE layers of {n_layer}, {n_expert} experts each" in printed
    assert f"take {share:.1%} of its selections" in printed and str(out) in printed
    assert 0.25 <= share <= 1.0
    # another model's key, or another shape: refused with a warning
    with caplog.at_level(logging.WARNING, logger="pyllama_moe"):
        assert moe_state.load(out, key_of(model_path("qwen3moe", seed=1))[0], n_layer, n_expert) is None
        assert moe_state.load(out, model_id, n_layer, n_expert + 1) is None
    assert "another model" in caplog.text and "its shape is" in caplog.text


def test_the_command_says_what_is_wrong(path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "state.json"
    assert calibrate.main([str(path), "--text", str(tmp_path / "none.txt"), "--out", str(out)]) == 1
    assert "calibrate: error:" in capsys.readouterr().err
    text = tmp_path / "text.txt"
    text.write_text(TEXT, encoding="utf-8")
    assert calibrate.main([str(model_path("qwen3")), "--text", str(text), "--out", str(out), "--tokens", "8"]) == 1
    assert "not a MoE model" in capsys.readouterr().err
    assert not out.exists()
    with pytest.raises(SystemExit):
        calibrate.main([str(path), "--out", str(out), "--tokens", "0"])
    with pytest.raises(ValueError, match="n_tokens must be at least 1"):
        calibrate.calibrate(path, TEXT, n_tokens=0)
