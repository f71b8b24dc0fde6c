"""``bench --draft 4,8,16`` (#45): the draft sizes given, the draft tokens accepted, the drafts that bound them, the
counts of a real generation on the tiny model and the table of the generation rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pyllama_moe.tools import bench
from pyllama_moe.tools.bench.cli import draft_sizes
from pyllama_moe.tools.bench.draft import DraftLog, Replay, acceptance, drafter
from pyllama_moe.tools.bench.report import Row, draft_table, generate_label, generate_parts, table


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pyllama_moe.tools import synth

    return synth.write_model(tmp_path_factory.mktemp("draft") / "tiny.gguf", "tiny", seed=3)


def test_draft_sizes() -> None:
    assert draft_sizes("4,8,16") == [4, 8, 16]
    assert draft_sizes(" 8, 4,8,") == [8, 4]  # in the order given, once each
    assert draft_sizes("") == []
    for bad in ("0", "x", "-1", "4,2.5"):
        with pytest.raises(ValueError, match="positive integers"):
            draft_sizes(bad)


@pytest.mark.parametrize("argv", [["--draft", "4,x"], ["--draft-bounds"], ["--draft", "4", "--no-api"]])
def test_draft_options_that_cannot_run(tiny: Path, argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        bench.main([str(tiny), "--setups", "cpu_moe-none", *argv])
    assert e.value.code == 2
    assert "--draft" in capsys.readouterr().err


def test_acceptance_counts_the_prefix_that_agrees() -> None:
    tokens = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    # after 3 tokens: 4, 5 agree and 0 ends it; after 6: all three agree; after 8: the text has one token more
    calls = [(3, [4, 5, 0, 7]), (6, [7, 8, 9]), (8, [9, 10]), (1, [])]
    assert acceptance(calls, tokens) == (4 + 3 + 2, 2 + 3 + 1)
    assert acceptance([(0, [9, 2])], tokens) == (2, 0)  # the first token disagrees: none after it counts
    assert acceptance([], tokens) == (0, 0)


def test_replay_proposes_the_text_or_other_tokens() -> None:
    text = [5, 6, 7, 8, 9, 10]
    right = Replay(text, 3, n_vocab=11)
    assert right(np.array([5, 6], dtype=np.intc)).tolist() == [7, 8, 9]
    assert right(np.array([5, 6, 7, 8, 9], dtype=np.intc)).tolist() == [10]  # what the text has left
    assert right(np.array([5, 0], dtype=np.intc)).tolist() == []  # another text: nothing to replay
    assert right(np.arange(8, dtype=np.intc)).tolist() == []  # longer than the text
    wrong = Replay(text, 3, n_vocab=11, wrong=True)
    assert wrong(np.array([5, 0], dtype=np.intc)).tolist() == [8, 9, 10]  # whatever the input
    assert wrong(np.array([0, 0, 0, 0], dtype=np.intc)).tolist() == [10, 0]  # within the vocabulary
    log = DraftLog(right, limit=2)  # what the generation evaluates: a batch less the sampled token
    assert log(np.array([5, 6], dtype=np.intc)).tolist() == [7, 8, 9]
    assert log.calls == [(2, [7, 8])]
    assert type(drafter("lookup", 4, text, 11)).__name__ == "LlamaPromptLookupDecoding"
    with pytest.raises(ValueError, match="drafted_by"):
        drafter("oracle", 4, text, 11)


def test_generation_counts_agree(tiny: Path) -> None:
    # a proposal accepted saves its decode: the accepted draft tokens are the tokens generated less the decodes,
    # counted independently (the draft's calls, the proposals against the tokens evaluated)
    import inspect
    import json.decoder

    from pyllama_moe import Llama
    from pyllama_moe.tools.bench.draft import code_prompt, forced, generate, prose_prompt

    with Llama(str(tiny), n_ctx=512, n_batch=64, verbose=False) as llm:
        code = llm.tokenize(inspect.getsource(json.decoder).encode(), add_bos=False)
        prompt = code_prompt(llm, code)
        # the code quoted, then its start again (prompt lookup's case); prose of as many tokens as the prompt may have
        assert prompt[1:257] == code[:256] and prompt[-16:] == code[:16] and len(prompt) <= 320
        assert len(prose_prompt(llm)) == 320
        plain = generate(llm, prompt, 12, 0)
        reference = llm.input_ids[: llm.n_tokens].tolist()
        assert reference[: len(prompt)] == prompt and len(reference) == len(prompt) + 11  # the last is not evaluated
        assert plain["decodes"] == 12 and plain["tokens_per_decode"] == 1.0 and plain["proposed"] == 0
        assert "misses" not in plain  # no MoE cache on the CPU
        right = generate(llm, prompt, 12, 4, "replay", reference)
        wrong = generate(llm, prompt, 12, 4, "wrong", reference)
        bound = forced(llm, prompt, reference, 4)
        # teacher-forced, 5 tokens a decode: the 11 tokens generated and evaluated in 3 decodes, the text's own
        assert llm.input_ids[: llm.n_tokens].tolist() == reference
    assert bound["n"] == 11 and bound["decodes"] == 3 and bound["accepted"] == bound["proposed"] == 8
    assert bound["tokens_per_decode"] == pytest.approx(11 / 3)
    for g in (right, wrong):
        assert g["n"] == 12 and g["accepted"] == g["n"] - g["decodes"], g
    assert right["digest"] == wrong["digest"] == plain["digest"]
    # every proposal accepted: a verification of 5 tokens gives 5, then the text runs out
    assert right["accepted"] == right["proposed"] > 0 and right["decodes"] == 4
    assert wrong["accepted"] == 0 and wrong["proposed"] > 11 and wrong["decodes"] == 12


def _row(prompt: str, draft: int, ts: float, by: str = "lookup", cache: bool = True, **g: Any) -> Row:
    gen = {"draft": draft, "tokens_per_decode": 1.0, "proposed": 0, "accepted": 0, "same_text": True}
    if cache:
        gen.update(misses_per_decode=2.0, misses_per_token=2.0, host_lookups=0)
    gen.update(g)
    return Row("cache-25", {}, "python", 300, 512, 128, ts, label=generate_label(128, prompt, draft, by),
               cache={"generate": gen}, digest="d")


def test_draft_table() -> None:
    assert generate_parts(generate_label(128, "code")) == ("code", 0, "-")
    assert generate_parts(generate_label(128, "text", 8, "wrong")) == ("text", 8, "wrong")
    rows = [_row("code", 0, 50.0), _row("code", 8, 75.0, tokens_per_decode=2.5, proposed=200, accepted=150,
                                        misses_per_decode=6.0, misses_per_token=2.4),
            _row("text", 0, 40.0, cache=False), _row("text", 8, 30.0, cache=False, same_text=False),
            Row("cache-25", {}, "python", 0, 512, 128, 55.0)]
    lines = draft_table(rows).splitlines()
    head = [c.strip() for c in lines[0].split("|")[1:-1]]
    cells = [dict(zip(head, (c.strip() for c in ln.split("|")[1:-1]), strict=True)) for ln in lines[2:]]
    assert len(cells) == 4  # the generation rows only
    assert cells[0]["vs no draft"] == "-" and cells[0]["accepted"] == "-" and cells[0]["drafted by"] == "-"
    assert cells[1]["vs no draft"] == "1.50x" and cells[1]["accepted"] == "75% of 200"
    assert (cells[1]["tokens/decode"], cells[1]["misses/decode"], cells[1]["misses/token"]) == ("2.50", "6.0", "2.4")
    assert cells[2]["misses/decode"] == cells[2]["host lookups"] == "-"  # no cache
    assert cells[3]["vs no draft"] == "0.75x" and cells[3]["accepted"] == "none proposed"
    assert [c["same text"] for c in cells] == ["yes", "yes", "yes", "NO"]
    assert draft_table(rows[-1:]) == ""
    assert "gen128" not in table(rows)  # the measurements' table leaves them to this one


def test_cache_counts_give_the_misses_the_cpu_computed() -> None:
    # with moe_hybrid, a verification's misses split between uploads and the CPU: both per token
    from pyllama_moe.moe import MoeCacheStats
    from pyllama_moe.tools.bench.draft import cache_counts

    before = MoeCacheStats(hits_device=10, misses_device=6, n_host=2)
    after = MoeCacheStats(hits_device=40, misses_device=42, hits_small=5, misses_small=2, n_host=26)
    got = cache_counts(before, after, decodes=4, tokens=8)
    # the device lookups' 36 misses count the 24 the CPU computed
    assert got == {"device_lookups": 66, "host_lookups": 7, "misses": 38, "misses_per_decode": 9.5,
                   "misses_per_token": 4.75, "host_experts": 24, "host_per_token": 3.0}
    assert cache_counts(None, after, 4, 8) == {}
