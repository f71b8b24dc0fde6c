"""``python -m pyllama_moe loadtest``: its figures against a running server with parallel slots."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("httpx")

from pyllama_moe.__main__ import main  # noqa: E402


def served(url: str) -> int:
    """The requests the server has answered, from its /metrics."""
    import httpx

    text = httpx.get(f"{url}/metrics").text
    return int(next(line.split()[-1] for line in text.splitlines() if line.startswith("pyllama_moe_requests_total")))


def test_loadtest_against_a_server(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pyllama_moe.server import ModelSettings, ServerSettings, create_app
    from pyllama_moe.tools import synth

    from fixtures.server import Running

    model = synth.write_model(tmp_path / "tiny.gguf", "tiny", seed=5)
    r = Running(create_app(ServerSettings(), [ModelSettings(model=str(model), model_alias="tiny", n_ctx=512,
                                                            n_batch=32, n_ubatch=32, verbose=False, n_parallel=2)]))
    try:
        out = tmp_path / "load.json"
        rc = main(["loadtest", r.url, "--clients", "1,3", "--requests", "2", "--max-tokens", "8",
                   "--json", str(out)])
        assert rc == 0
        data = json.loads(out.read_text())
        levels = data["levels"]
        assert [lv["clients"] for lv in levels] == [1, 3] and [lv["requests"] for lv in levels] == [2, 6]
        for lv in levels:
            assert lv["errors"] == 0 and lv["aggregate_tps"] > 0 and lv["ttft_p50_s"] > 0
            assert lv["ttft_p90_s"] >= lv["ttft_p50_s"]
            assert all(1 <= s["tokens"] <= 8 for s in lv["samples"])
        printed = capsys.readouterr().out
        assert "agg t/s" in printed and len(printed.strip().splitlines()) == 3
        # untimed warm-ups: one request at the start, a round of 3 before the level of 3 (not with --no-warm)
        assert served(r.url) == 1 + 2 + 3 + 6
        assert main(["loadtest", r.url, "--clients", "3", "--requests", "1", "--max-tokens", "2", "--no-warm"]) == 0
        assert served(r.url) == 12 + 1 + 3
        # a server that is not there: an error, not a hang
        assert main(["loadtest", "http://127.0.0.1:9", "--clients", "1", "--timeout", "5"]) == 1
    finally:
        r.stop()
