"""The server with parallel slots (``n_parallel`` > 1): concurrent clients in one batch per step, their streams
complete and each the text it gets alone, disconnects and the queue's bound, no slot left behind."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

from pyllama_moe.server import ModelSettings, ServerSettings, create_app  # noqa: E402

from fixtures.server import Running  # noqa: E402

# four slots of 256 tokens each
PARALLEL = {"n_ctx": 1024, "n_batch": 64, "n_ubatch": 64, "verbose": False, "n_parallel": 4, "max_queue": 64}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pyllama_moe.tools import synth

    return synth.write_model(tmp_path_factory.mktemp("parallel") / "tiny.gguf", "tiny", seed=5)


@pytest.fixture(scope="module")
def server(tiny: Path) -> Iterator[Running]:
    r = Running(create_app(ServerSettings(), [ModelSettings(model=str(tiny), model_alias="tiny", **PARALLEL)]))
    yield r
    r.stop()


def _health(server: Running) -> dict[str, Any]:
    return httpx.get(server.url + "/health", timeout=10).json()["slots"]["tiny"]


def _idle(server: Running, timeout: float = 10) -> dict[str, Any]:
    """The slots once no request runs or waits (they free at the next step after a request ends)."""
    deadline = time.monotonic() + timeout
    while True:
        h = _health(server)
        if h["slots_busy"] == 0 and h["queued"] == 0 or time.monotonic() > deadline:
            return h
        time.sleep(0.02)


def _raw_stream(server: Running, body: dict[str, Any], path: str = "/v1/completions") -> list[dict[str, Any]]:
    """A stream read with http.client, the events parsed by hand: the chunks, checked to end with [DONE]."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        conn.request("POST", path, json.dumps({**body, "stream": True}), {"content-type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200 and resp.getheader("content-type", "").startswith("text/event-stream")
        events = [e for e in resp.read().decode().split("\n\n") if e]
    finally:
        conn.close()
    assert events[-1] == "data: [DONE]" and all(e.startswith("data: ") for e in events), events[-3:]
    return [json.loads(e[len("data: "):]) for e in events[:-1]]


PROMPTS = [f"Request number {i}: the" for i in range(12)]
# a batch's logits may round apart from a request's alone (the CI wheel's batched kernels did, by a few hundredths
# of a log-probability): a greedy text is the same up to the first token whose two best log-probabilities are within
# TIE, as in the speculative decoding tests. The tiny model's are close almost everywhere, so these tests check the
# streams' completeness more than their texts; tests/core/test_slots.py compares batched texts with those alone
TIE = 0.05


def _alone(server: Running, body: dict[str, Any]) -> dict[str, Any]:
    """One request on its own, with the two best log-probabilities of each token."""
    return httpx.post(server.url + "/v1/completions", json={**body, "logprobs": 2}, timeout=60).json()["choices"][0]


def _sure(choice: dict[str, Any]) -> tuple[list[str], str]:
    """The tokens of a greedy choice before its first near tie, and their text."""
    lp = choice["logprobs"]
    sure: list[str] = []
    for token, top in zip(lp["tokens"], lp["top_logprobs"], strict=True):
        best = sorted(top.values(), reverse=True)
        if len(best) > 1 and best[0] - best[1] < TIE:
            break
        sure.append(token)
    return sure, "".join(sure)


def test_concurrent_streams_are_complete_and_each_the_text_alone(server: Running) -> None:
    # alone: one request at a time, non-streamed
    alone = {p: _alone(server, {"prompt": p, "max_tokens": 24, "temperature": 0}) for p in PROMPTS}
    assert len({a["text"] for a in alone.values()}) > 1  # the prompts lead to different texts: a mixed-up routing shows
    sure = {p: _sure(a)[1] for p, a in alone.items()}

    def openai_stream(p: str) -> tuple[str, str | None]:
        chunks = list(server.client().completions.create(model="tiny", prompt=p, max_tokens=24, temperature=0,
                                                         stream=True))
        return "".join(c.choices[0].text for c in chunks), chunks[-1].choices[0].finish_reason

    def raw_stream(p: str) -> tuple[str, str | None]:
        chunks = _raw_stream(server, {"prompt": p, "max_tokens": 24, "temperature": 0})
        return "".join(c["choices"][0]["text"] for c in chunks), chunks[-1]["choices"][0]["finish_reason"]

    jobs = [(p, openai_stream if i % 2 else raw_stream) for i, p in enumerate(PROMPTS)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        got = list(pool.map(lambda job: job[1](job[0]), jobs))
    for (p, _), (text, finish) in zip(jobs, got, strict=True):
        assert text.startswith(sure[p]) and alone[p]["text"].startswith(sure[p]), p
        assert finish in ("length", "stop")
    metrics = httpx.get(server.url + "/metrics").text
    steps = int(metrics.split('pyllama_moe_steps_total{model="tiny"} ')[1].split()[0])
    assert steps > 0 and "pyllama_moe_aggregate_tokens_per_second" in metrics
    assert _idle(server)["slots_busy"] == 0


def test_concurrent_chat_stop_strings_and_logprobs(server: Running) -> None:
    client = server.client()
    base = PROMPTS[0]
    whole_choice = _alone(server, {"prompt": base, "max_tokens": 24, "temperature": 0})
    whole = whole_choice["text"]
    stop = whole[5:8]
    assert stop
    cases: list[dict[str, Any]] = [
        {"prompt": base, "max_tokens": 24, "temperature": 0, "stop": [stop]},
        {"prompt": PROMPTS[1], "max_tokens": 6, "temperature": 0, "logprobs": 3},
        {"prompt": PROMPTS[2], "max_tokens": 8, "temperature": 0, "grammar": 'root ::= "yes" | "no"'},
        {"prompt": PROMPTS[3], "max_tokens": 8, "temperature": 0.9, "seed": 7},
    ]
    alone = [httpx.post(server.url + "/v1/completions", json=c, timeout=60).json()["choices"][0] for c in cases]
    assert alone[0]["text"] == whole[:whole.index(stop)] and alone[0]["finish_reason"] == "stop"
    assert alone[2]["text"] in ("yes", "no")
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 6, "temperature": 0}
    assert isinstance(client.chat.completions.create(**chat).choices[0].message.content, str)
    for _ in range(2):
        with ThreadPoolExecutor(len(cases) + 1) as pool:
            futs = [pool.submit(lambda c: httpx.post(server.url + "/v1/completions", json=c, timeout=60).json(), c)
                    for c in cases]
            chat_fut = pool.submit(lambda: server.client().chat.completions.create(**chat))
            together = [f.result()["choices"][0] for f in futs]
            chat_together = chat_fut.result().choices[0]
            assert isinstance(chat_together.message.content, str) and chat_together.finish_reason in ("length", "stop")
        # a batch's logits may round apart from a request's alone: the sampled one (temperature 0.9) may draw
        # another token, a greedy one part at a near tie; each still ends as asked
        for b in together:
            assert isinstance(b["text"], str) and b["finish_reason"] in ("length", "stop")
        # the stop string: the greedy text is cut where it comes, up to the first near tie of the text alone
        if len(_sure(whole_choice)[1]) >= whole.index(stop) + len(stop):
            assert together[0]["text"] == alone[0]["text"] and together[0]["finish_reason"] == "stop"
        assert together[2]["text"] in ("yes", "no")
        # logprobs: the same tokens before the first near tie, their values close
        la, lb = alone[1]["logprobs"], together[1]["logprobs"]
        k = len(_sure(alone[1])[0])
        assert la["tokens"][:k] == lb["tokens"][:k]
        assert all(abs(x - y) < TIE for x, y in zip(la["token_logprobs"][:k], lb["token_logprobs"][:k], strict=True))


def test_a_disconnected_client_frees_its_slot_at_the_next_step(server: Running) -> None:
    stats = server.app.state.pool.get("tiny").llama.slots.stats
    before = stats.tokens_generated
    # logprobs slow each token down (a few ms on the tiny model), so the client leaves long before the end
    with httpx.stream("POST", server.url + "/v1/completions", timeout=60, json={
            "model": "tiny", "prompt": "a", "max_tokens": 250, "temperature": 0, "logprobs": 20,
            "stream": True}) as r:
        assert next(r.iter_lines()).startswith("data: ")
    h = _idle(server)
    assert h["slots_busy"] == 0 and h["queued"] == 0
    assert stats.tokens_generated - before < 200  # it stopped early, not at max_tokens
    assert server.app.state.pool.get("tiny").in_flight == 0


def test_no_request_starves_beside_a_long_one(server: Running) -> None:
    long_prompt = " ".join(f"word{i}" for i in range(40))  # about 120 tokens: two steps' chunks of n_batch 64
    done: dict[str, float] = {}

    def run(name: str, body: dict[str, Any]) -> dict[str, Any]:
        res = httpx.post(server.url + "/v1/completions", json={"temperature": 0, **body}, timeout=120).json()
        done[name] = time.monotonic()
        return res

    with ThreadPoolExecutor(13) as pool:
        long = pool.submit(run, "long", {"prompt": long_prompt, "max_tokens": 100,
                                         "logit_bias": {str(t): -100.0 for t in (151643, 151645)}})
        time.sleep(0.05)
        short = [pool.submit(run, f"s{i}", {"prompt": f"Short {i}", "max_tokens": 3}) for i in range(12)]
        shorts = [f.result() for f in short]
        res = long.result()
    assert all(s["usage"]["completion_tokens"] >= 1 for s in shorts), shorts
    assert res["usage"]["completion_tokens"] == 100 and res["usage"]["prompt_tokens"] > 64, res
    # the long one ran beside them: every short one ended before it
    assert max(done[f"s{i}"] for i in range(12)) < done["long"]


def test_the_queue_bound_is_a_429_and_the_server_goes_on(tiny: Path) -> None:
    settings = {**PARALLEL, "n_parallel": 2, "max_queue": 1}
    r = Running(create_app(ServerSettings(), [ModelSettings(model=str(tiny), model_alias="tiny", **settings)]))
    model = r.app.state.pool.get("tiny")
    body = {"model": "tiny", "prompt": "a", "max_tokens": 8, "temperature": 0, "stream": True}

    def read() -> list[str]:
        with httpx.stream("POST", r.url + "/v1/completions", timeout=60, json=body) as resp:
            return [ln for ln in resp.iter_lines() if ln]

    pool = ThreadPoolExecutor(3)
    try:
        # a step that takes long: the slots' worker waits for the Llama's lock, so three requests are in flight
        # (two in slots, one waiting) however fast the tiny model is
        with model.llama._lock:
            held = [pool.submit(read) for _ in range(3)]
            deadline = time.monotonic() + 20
            while model.in_flight < 3 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert model.in_flight == 3
            over = httpx.post(r.url + "/v1/completions", json={**body, "stream": False}, timeout=60)
            assert over.status_code == 429, over.text
            err = over.json()["error"]
            assert err["code"] == "rate_limit_exceeded" and "busy" in err["message"] and err["type"] == "requests"
            with pytest.raises(openai.RateLimitError):
                r.client().chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}],
                                                   max_tokens=2, stream=True)
            assert model.in_flight == 3
        for f in held:  # the three complete once the step runs
            lines = f.result()
            assert lines[-1] == "data: [DONE]" and '"finish_reason": "length"' in lines[-2]
        deadline = time.monotonic() + 20
        while model.in_flight and time.monotonic() < deadline:
            time.sleep(0.01)
        assert model.in_flight == 0
        assert r.client().completions.create(model="tiny", prompt="x", max_tokens=2).choices
    finally:
        pool.shutdown()
        r.stop()


def test_no_slot_leaks_over_500_requests(server: Running) -> None:
    threads_before = threading.active_count()
    model = server.app.state.pool.get("tiny")
    slots = model.llama.slots
    requests_before = slots.stats.requests

    def one(i: int) -> str:
        with httpx.Client(timeout=60) as c:  # a connection per worker would do; this is the worst case
            body = {"model": "tiny", "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": 2, "temperature": 0}
            if i % 5 == 0:  # a stream dropped after its first chunk
                with c.stream("POST", server.url + "/v1/completions", json={**body, "max_tokens": 50,
                                                                          "stream": True}) as r:
                    return next(r.iter_lines())[:6]
            if i % 5 == 1:
                return _raw_stream(server, body)[-1]["choices"][0]["finish_reason"]
            return c.post(server.url + "/v1/completions", json=body).json()["choices"][0]["finish_reason"]

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(one, range(500)))
    assert got.count("data: ") == 100 and all(g in ("data: ", "length", "stop") for g in got)
    h = _idle(server)
    assert h == {**h, "slots_busy": 0, "queued": 0}
    assert model.in_flight == 0
    assert all(s.job is None and s.sampler is None and not s.pending for s in slots.slots)
    assert slots.stats.requests - requests_before >= 400  # the dropped streams count when they end unread
    assert threading.active_count() <= threads_before + len(slots.slots) + 64  # no thread per request left


def test_settings() -> None:
    from pydantic import ValidationError

    from pyllama_moe.server import parse_args

    _, models = parse_args(["--model", "m.gguf", "--n_parallel", "8", "--max_queue", "3", "--n_ctx", "4096"])
    assert models[0].n_parallel == 8 and models[0].max_queue == 3
    kw = models[0].llama_kwargs()
    assert kw["n_seq_max"] == 8 and "n_parallel" not in kw and "max_queue" not in kw
    assert "n_seq_max" not in ModelSettings(model="m.gguf").llama_kwargs()  # n_parallel 1: the Llama of before
    for bad in ({"n_parallel": 0}, {"n_parallel": 257}, {"max_queue": -1}, {"n_parallel": 65, "n_batch": 64}):
        with pytest.raises(ValidationError):
            ModelSettings(model="m.gguf", **bad)


def test_metrics_count_the_tokens_of_streamed_requests(server: Running) -> None:
    # through the slots too: a streamed request counts the tokens its whole twin reports
    _idle(server)
    body = {"model": "tiny", "prompt": "Hello there", "max_tokens": 5, "temperature": 0}
    before = server.counters("tiny")
    assert _raw_stream(server, body)
    streamed = server.counters("tiny")
    usage = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()["usage"]
    for name in ("prompt", "completion"):
        key = f"pyllama_moe_{name}_tokens_total"
        assert streamed[key] - before[key] == usage[f"{name}_tokens"] > 0
        assert server.counters("tiny")[key] - streamed[key] == usage[f"{name}_tokens"]


def test_the_moe_hit_rate_of_metrics_is_since_the_last_read() -> None:
    """The steps do not read the MoE cache's counts: /metrics gives the hit rate between two of its reads."""
    from pyllama_moe.moe import MoeCacheStats
    from pyllama_moe.server.model import ServedModel

    m = ServedModel(ModelSettings(model="unused.gguf", n_parallel=2, n_batch=8), llama=None, n_ctx=64)
    alone = ServedModel(ModelSettings(model="unused.gguf"), llama=None, n_ctx=64)
    try:
        assert m.moe_hit_rate_since_read(None) is None  # no cache
        first = MoeCacheStats(hits_device=3, misses_device=1)
        assert alone.moe_hit_rate_since_read(first) is None  # one request at a time: no slots' figure
        assert m.moe_hit_rate_since_read(first) == 0.75  # since the start
        second = MoeCacheStats(hits_device=3, misses_device=5, hits_small=2)
        assert m.moe_hit_rate_since_read(second) == 2 / 6  # the lookups since the first read only
        assert m.moe_hit_rate_since_read(second) == 2 / 6  # none since: the last interval's
    finally:
        assert m.executor is not None
        m.executor.shutdown()
