"""The OpenAI-compatible server on loopback, driven by the real openai client."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")

from pyllama_moe.server import ModelSettings, ServerSettings, create_app, parse_args  # noqa: E402

from fixtures.server import Running  # noqa: E402

SMALL = {"n_ctx": 512, "n_batch": 64, "n_ubatch": 64, "verbose": False}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pyllama_moe.tools import synth

    return synth.write_model(tmp_path_factory.mktemp("server") / "tiny.gguf", "tiny", seed=5)


@pytest.fixture(scope="module")
def server(tiny: Path) -> Iterator[Running]:
    models = [ModelSettings(model=str(tiny), model_alias="tiny", **SMALL),
              ModelSettings(model=str(tiny), model_alias="embed", embedding=True, pooling_type=1, **SMALL)]
    r = Running(create_app(ServerSettings(interrupt_requests=False), models))
    yield r
    r.stop()


def test_completion(server: Running) -> None:
    res = server.client().completions.create(model="tiny", prompt="Hello there", max_tokens=8, temperature=0)
    assert res.object == "text_completion" and res.choices[0].text
    assert res.usage.completion_tokens == 8 and res.usage.prompt_tokens > 0


def test_chat(server: Running) -> None:
    res = server.client().chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Say hi"}], max_tokens=6, temperature=0)
    assert res.object == "chat.completion"
    assert res.choices[0].message.role == "assistant" and res.choices[0].message.content


def test_streaming_matches_and_ends_with_done(server: Running) -> None:
    client = server.client()
    whole = client.completions.create(model="tiny", prompt="Once upon", max_tokens=10, temperature=0)
    parts = [c.choices[0].text for c in client.completions.create(
        model="tiny", prompt="Once upon", max_tokens=10, temperature=0, stream=True)]
    assert "".join(parts) == whole.choices[0].text
    with httpx.stream("POST", server.url + "/v1/chat/completions", timeout=60, json={
            "model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 4, "stream": True}) as r:
        lines = [ln for ln in r.iter_lines() if ln]
    assert r.headers["content-type"].startswith("text/event-stream")
    assert lines[-1] == "data: [DONE]" and all(ln.startswith("data: ") for ln in lines)


def test_metrics_count_the_tokens_of_streamed_requests(server: Running) -> None:
    # a streamed request counts the tokens its whole twin reports (its chunks carry no usage: the stream returns it)
    client = server.client()
    chat = [{"role": "user", "content": "Say hi"}]
    before = server.counters("tiny")
    for _ in client.completions.create(model="tiny", prompt="Hello there", max_tokens=5, temperature=0, stream=True):
        pass
    for _ in client.chat.completions.create(model="tiny", messages=chat, max_tokens=4, temperature=0, stream=True):
        pass
    streamed = server.counters("tiny")
    a = client.completions.create(model="tiny", prompt="Hello there", max_tokens=5, temperature=0).usage
    b = client.chat.completions.create(model="tiny", messages=chat, max_tokens=4, temperature=0).usage
    for name, n in (("prompt", a.prompt_tokens + b.prompt_tokens),
                    ("completion", a.completion_tokens + b.completion_tokens)):
        key = f"pyllama_moe_{name}_tokens_total"
        assert streamed[key] - before[key] == n > 0
        assert server.counters("tiny")[key] - streamed[key] == n


def test_embeddings(server: Running) -> None:
    res = server.client().embeddings.create(model="embed", input=["one", "two words"])
    assert len(res.data) == 2 and len(res.data[0].embedding) == 64
    assert res.data[0].embedding != res.data[1].embedding


def test_models_and_tokenizer_extras(server: Running) -> None:
    assert [m.id for m in server.client().models.list().data] == ["tiny", "embed"]
    toks = httpx.post(server.url + "/extras/tokenize", json={"input": "hello world", "model": "tiny"}).json()["tokens"]
    assert toks and all(isinstance(t, int) for t in toks)
    count = httpx.post(server.url + "/extras/tokenize/count", json={"input": "hello world"}).json()["count"]
    assert count == len(toks)
    text = httpx.post(server.url + "/extras/detokenize", json={"tokens": toks}).json()["text"]
    assert text == "hello world"
    assert httpx.get(server.url + "/health").json()["status"] == "ok"


def test_bad_requests_get_4xx(server: Running) -> None:
    r = httpx.post(server.url + "/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "message" in r.json()["error"]
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": "many"})
    assert r.status_code == 400 and "max_tokens" in r.json()["error"]["message"]
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": []})
    assert r.status_code == 400
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "x", "logit_bias": {"abc": 1.0}})
    assert r.status_code == 400 and "logit_bias" in r.json()["error"]["message"]
    with pytest.raises(openai.NotFoundError, match="not served here"):
        server.client().completions.create(model="nope", prompt="x", max_tokens=1)
    # the server still answers
    assert server.client().completions.create(model="tiny", prompt="x", max_tokens=1).choices


def test_disconnect_stops_generation(server: Running) -> None:
    full = server.client().completions.create(model="tiny", prompt="a", max_tokens=400, temperature=0)
    n_full = full.usage.completion_tokens
    assert n_full >= 100  # this prompt runs long enough to see the stream stop early
    stats = server.app.state.pool.get("tiny").stats
    before = stats.completion_tokens
    with httpx.stream("POST", server.url + "/v1/completions", timeout=60, json={
            "model": "tiny", "prompt": "a", "max_tokens": 400, "temperature": 0, "stream": True}) as r:
        first = next(r.iter_lines())
        assert first.startswith("data: ")
    # the client is gone: the next request gets the model, and the stream stopped early
    assert server.client().completions.create(model="tiny", prompt="b", max_tokens=2).choices
    assert stats.completion_tokens - before < n_full // 2


def test_concurrent_clients_lose_nothing(server: Running) -> None:
    client = server.client()
    prompts = [f"Request number {i}:" for i in range(20)]
    alone = [client.completions.create(model="tiny", prompt=p, max_tokens=4, temperature=0).choices[0].text
             for p in prompts]
    with ThreadPoolExecutor(20) as pool:
        together = list(pool.map(lambda p: server.client().completions.create(
            model="tiny", prompt=p, max_tokens=4, temperature=0).choices[0].text, prompts))
    assert together == alone
    metrics = httpx.get(server.url + "/metrics").text
    assert 'pyllama_moe_requests_total{model="tiny"}' in metrics


def test_api_key_is_required_everywhere(tiny: Path) -> None:
    r = Running(create_app(ServerSettings(api_key="s3cret"), [ModelSettings(model=str(tiny), **SMALL)]))
    try:
        with pytest.raises(openai.AuthenticationError):
            r.client("wrong").completions.create(model="x", prompt="x", max_tokens=1)
        for path in ("/health", "/metrics", "/v1/models"):
            assert httpx.get(r.url + path).status_code == 401
        assert r.client("s3cret").completions.create(model="x", prompt="x", max_tokens=1).choices
        assert httpx.get(r.url + "/health", headers={"authorization": "Bearer s3cret"}).status_code == 200
    finally:
        r.stop()


def test_command_line(tmp_path: Path, tiny: Path) -> None:
    server, models = parse_args(["--model", str(tiny), "--n_gpu_layers", "-1", "--moe_cache_mib", "512",
                                 "--cpu_moe", "true", "--port", "9000", "--api_key", "k"])
    assert server.port == 9000 and server.api_key == "k"
    kw = models[0].llama_kwargs()
    assert kw["n_gpu_layers"] == -1 and kw["moe_cache_mib"] == 512 and kw["cpu_moe"] is True
    cfg = tmp_path / "config.json"
    cfg.write_text('{"port": 9001, "models": [{"model": "%s", "model_alias": "a"}, '
                   '{"model": "%s", "model_alias": "b"}]}' % (tiny, tiny))
    server, models = parse_args(["--config_file", str(cfg)])
    assert server.port == 9001 and [m.alias for m in models] == ["a", "b"]
    with pytest.raises(SystemExit):
        parse_args([])


def test_batch_sizes_follow_llamas_rule() -> None:
    # not given: left out of Llama's keywords, so that Llama chooses the ubatch for the placement (#68); given: passed
    kw = ModelSettings(model="m.gguf").llama_kwargs()
    assert "n_batch" not in kw and "n_ubatch" not in kw
    _, models = parse_args(["--model", "m.gguf", "--n_ubatch", "512"])
    kw = models[0].llama_kwargs()
    assert kw["n_ubatch"] == 512 and "n_batch" not in kw
    _, models = parse_args(["--model", "m.gguf", "--n_batch", "4096", "--n_ubatch", "1024"])
    assert (models[0].llama_kwargs()["n_batch"], models[0].llama_kwargs()["n_ubatch"]) == (4096, 1024)
    for bad in ({"n_ubatch": 0}, {"n_batch": -1}):
        with pytest.raises(ValueError):
            ModelSettings(model="m.gguf", **bad)


def test_the_servers_llama_chooses_the_ubatch(monkeypatch: pytest.MonkeyPatch, tiny: Path) -> None:
    # the defaults reach Llama as its own: with the experts in host memory on a GPU (faked) it chooses, and a
    # given --n_ubatch is kept
    from pyllama_moe import moe
    from pyllama_moe.llama import Llama

    monkeypatch.setattr(moe.backend, "gpu_available", lambda: True)
    monkeypatch.setattr(moe, "device_room", lambda *_: ([1 << 30], [1.0]))
    settings = {"n_ctx": 4096, "n_gpu_layers": -1, "cpu_moe": True, "verbose": False}
    for given, want in (({}, 2048), ({"n_ubatch": 512}, 512)):
        llm = Llama(str(tiny), **ModelSettings(model=str(tiny), **settings, **given).llama_kwargs())
        with llm:
            assert (llm.placement["n_ubatch"], llm.placement["n_ubatch_chosen"]) == (want, not given)


def test_a_model_that_fails_to_load_fails_the_start(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf at all")
    with pytest.raises(Exception, match="bad.gguf"):
        create_app(ServerSettings(), [ModelSettings(model=str(bad), **SMALL)])


def _post(server: Running, path: str, body: Any = None, content: bytes | None = None, method: str = "POST") -> Any:
    return httpx.request(method, server.url + path, json=body if content is None else None, content=content,
                         headers={"content-type": "application/json"}, timeout=60)


def _is_openai_error(r: Any, status: int) -> dict[str, Any]:
    assert r.status_code == status, (r.status_code, r.text)
    err = r.json()["error"]
    assert isinstance(err["message"], str) and err["message"] and isinstance(err["type"], str), err
    return err


def test_hostile_requests_get_openai_errors_and_the_server_lives(server: Running) -> None:
    # each used to kill the server, hang a stream after its 200 headers, or answer in plain text or {"detail": ...}
    chat = "/v1/chat/completions"
    cases = [
        (chat, {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "grammar": "root ::= [z-a]"}, 400),
        (chat, {"model": "tiny", "messages": [{"role": "user", "content": "x"}],
                "grammar": "root ::= " + "(" * 20000 + '"a"' + ")" * 20000}, 400),
        (chat, {"model": "tiny", "messages": [{"role": "user"}]}, 400),
        (chat, {"model": "tiny", "messages": [{"role": "user", "content": 5}]}, 400),
        (chat, {"model": "tiny", "messages": [{"role": None, "content": "x"}]}, 400),
        ("/v1/completions", {"model": "tiny", "prompt": "x", "top_k": 2**40}, 400),
        ("/v1/completions", {"model": "tiny", "prompt": [-1], "max_tokens": 2}, 400),
        ("/v1/embeddings", {"model": "tiny", "input": "x"}, 400),
    ]
    for path, body, status in cases:
        _is_openai_error(_post(server, path, body), status)
        # streamed, the failure comes before the first chunk: the same error, not a 200 that never ends
        if path != "/v1/embeddings":
            _is_openai_error(_post(server, path, {**body, "stream": True}), status)
    _is_openai_error(_post(server, chat, content=b"{not json"), 400)
    _is_openai_error(_post(server, "/v1/nothing", {}), 404)
    _is_openai_error(_post(server, chat, method="GET"), 405)
    assert httpx.get(server.url + "/health", timeout=10).json()["status"] == "ok"


def test_a_stream_failing_after_its_first_chunk_ends_with_an_error_and_done(tiny: Path) -> None:
    # a failure while the stream runs (here: the model is closed under it) is an error event, then [DONE]
    models = [ModelSettings(model=str(tiny), model_alias="tiny", **SMALL)]
    r = Running(create_app(ServerSettings(interrupt_requests=False), models))
    try:
        llama = r.app.state.pool.models["tiny"].llama
        with httpx.stream("POST", r.url + "/v1/completions", timeout=60, json={
                "model": "tiny", "prompt": "a", "max_tokens": 200, "temperature": 0, "stream": True}) as resp:
            assert resp.status_code == 200
            lines = []
            for line in resp.iter_lines():
                if line:
                    lines.append(line)
                if len(lines) == 2:
                    threading.Thread(target=llama.close).start()
        assert lines[-1] == "data: [DONE]"
        assert '"error"' in lines[-2] and "closed" in lines[-2], lines[-3:]
    finally:
        r.stop()


def test_request_limits(tiny: Path) -> None:
    models = [ModelSettings(model=str(tiny), model_alias="tiny", **SMALL)]
    r = Running(create_app(ServerSettings(interrupt_requests=False, max_request_bytes=4096, max_messages=3), models))
    try:
        big = {"model": "tiny", "messages": [{"role": "user", "content": "x" * 5000}]}
        _is_openai_error(_post(r, "/v1/chat/completions", big), 413)
        many = {"model": "tiny", "messages": [{"role": "user", "content": "x"}] * 4, "max_tokens": 1}
        _is_openai_error(_post(r, "/v1/chat/completions", many), 400)
        ok = {"model": "tiny", "messages": [{"role": "user", "content": "x"}] * 3, "max_tokens": 1}
        assert _post(r, "/v1/chat/completions", ok).status_code == 200
    finally:
        r.stop()


def _exchange(sock: socket.socket, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    """One HTTP/1.1 request on a kept-alive socket and its JSON answer (the body read by its Content-Length)."""
    import json

    data = json.dumps(body).encode() if body is not None else b""
    sock.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    buf = b""
    while b"\r\n\r\n" not in buf:
        got = sock.recv(65536)
        assert got, "the server closed the connection"
        buf += got
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    assert headers.get("connection", "").lower() != "close", lines
    n = int(headers["content-length"])
    while len(rest) < n:
        got = sock.recv(65536)
        assert got, "the server closed the connection"
        rest += got
    return int(lines[0].split()[1]), json.loads(rest[:n])


def test_a_prompt_too_long_to_fit_is_refused_before_it_is_tokenized(server: Running) -> None:
    # issue #72: 10 MB were tokenized whole (9.7 s) to be refused then; its length alone shows it cannot fit
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", server.port), timeout=120) as sock:
        status, body = _exchange(sock, "POST", "/v1/completions", {"model": "tiny", "prompt": "hello world " * 900_000})
    assert time.monotonic() - t0 < 5, time.monotonic() - t0
    assert status == 400 and body["error"]["code"] == "context_length_exceeded", body
    assert body["error"]["param"] == "prompt" and "you requested at least" in body["error"]["message"], body


def test_errors_are_openais_and_keep_the_connection(server: Running) -> None:
    long_text = "word " * 1000  # more tokens than the 512 of the context
    with socket.create_connection(("127.0.0.1", server.port), timeout=120) as sock:
        # embeddings from a model started without them: the client's mistake, said so
        status, body = _exchange(sock, "POST", "/v1/embeddings", {"model": "tiny", "input": "hi"})
        assert status == 400 and "embedding=True" in body["error"]["message"]
        assert body["error"]["type"] == "invalid_request_error" and body["error"]["code"] is None
        # a prompt over the context: OpenAI's code, with the parameter to shorten
        status, body = _exchange(sock, "POST", "/v1/completions", {"model": "tiny", "prompt": long_text})
        assert status == 400 and body["error"]["code"] == "context_length_exceeded"
        assert body["error"]["param"] == "prompt" and "maximum context length is 512 tokens" in body["error"]["message"]
        status, body = _exchange(sock, "POST", "/v1/chat/completions",
                                 {"model": "tiny", "messages": [{"role": "user", "content": long_text}]})
        assert status == 400 and body["error"]["code"] == "context_length_exceeded"
        assert body["error"]["param"] == "messages"
        status, body = _exchange(sock, "POST", "/v1/completions", {"model": "nope", "prompt": "hi"})
        assert status == 404 and body["error"]["code"] == "model_not_found"
        # the same connection still answers
        status, body = _exchange(sock, "GET", "/v1/models")
        assert status == 200 and {m["id"] for m in body["data"]} == {"tiny", "embed"}
    # the openai client sees the code too
    with pytest.raises(openai.BadRequestError) as info:
        server.client().completions.create(model="tiny", prompt=long_text, max_tokens=4)
    assert info.value.code == "context_length_exceeded"


def test_the_model_field_is_the_name_asked_for(server: Running, tiny: Path) -> None:
    # as llama-cpp-python's server: the request's model name, or the model's path when it names none
    def field(path: str, body: dict[str, Any]) -> str:
        return httpx.post(server.url + path, json=body, timeout=120).json()["model"]

    user = [{"role": "user", "content": "x"}]
    assert field("/v1/completions", {"model": "tiny", "prompt": "a", "max_tokens": 1}) == "tiny"
    assert field("/v1/completions", {"prompt": "a", "max_tokens": 1}) == str(tiny)
    assert field("/v1/chat/completions", {"model": "tiny", "messages": user, "max_tokens": 1}) == "tiny"
    assert field("/v1/embeddings", {"model": "embed", "input": "x"}) == "embed"


# --------------------------------------------------------------------------------------------
# issue #48: what one request may cost, and the requests that got a 500, a 404 or a 200 they should not have


def _raw(server: Running, data: bytes) -> tuple[int, dict[str, str], bytes]:
    """Bytes sent as they are (not HTTP a client library would write); the answer's status, headers and body."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(data)
        buf = b""
        while True:
            got = sock.recv(65536)
            if not got:
                break
            buf += got
    head, _, body = buf.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    return int(lines[0].split()[1]), headers, body


def test_a_malformed_http_request_gets_an_openai_error(server: Running) -> None:
    import json

    for data in (b"GARBAGE\r\n\r\n", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
                 b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
                 b"GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n"):
        status, headers, body = _raw(server, data)
        assert status == 400 and headers["content-type"] == "application/json", (data, headers, body)
        err = json.loads(body)["error"]
        assert err["type"] == "invalid_request_error" and err["message"]
    deep = b"[" * 100_000  # deeper than Python's json reads
    status, _, body = _raw(server, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                   b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(deep) + deep)
    assert status == 400 and "error" in json.loads(body)
    assert httpx.get(server.url + "/health", timeout=10).json()["status"] == "ok"


def test_null_content_tools_and_schemas(server: Running) -> None:
    chat = "/v1/chat/completions"
    user = [{"role": "user", "content": "x"}]
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    # an assistant's tool calls with "content": null (OpenAI's shape): a 500 before, TypeError in the template
    r = _post(server, chat, {"model": "tiny", "max_tokens": 2, "messages": [
        *user, {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "content": "done", "tool_call_id": "c1"}]})
    assert r.status_code == 200, r.text
    # malformed functions: a 404 model_not_found whose message was "name"
    err = _is_openai_error(_post(server, chat, {"model": "tiny", "messages": user, "functions": [{"foo": 1}],
                                                "function_call": {"name": "f"}}), 400)
    assert err["param"] == "functions" and "name" in err["message"] and err["code"] is None
    err = _is_openai_error(_post(server, chat, {"model": "tiny", "messages": user, "tools": [{"type": "function"}],
                                                "tool_choice": "auto"}), 400)
    assert err["param"] == "tools"
    # invalid response_format schemas: a 200 with any JSON before
    for schema in ({"type": "array", "minItems": 3, "maxItems": 1}, {"type": "foo"}, 5,
                   {"type": "string", "maxLength": -1}):
        err = _is_openai_error(_post(server, chat, {"model": "tiny", "messages": user, "max_tokens": 2,
                                                    "response_format": {"type": "json_object", "schema": schema}}), 400)
        assert err["param"] == "response_format" and "invalid JSON schema" in err["message"]
    err = _is_openai_error(_post(server, chat, {"model": "tiny", "messages": user,
                                                "response_format": {"type": "json_schema", "json_schema": "x"}}), 400)
    assert err["param"] == "response_format"


def test_per_request_bounds_are_400s_at_once_even_while_the_model_is_busy(server: Running) -> None:
    import json

    chat, comp = "/v1/chat/completions", "/v1/completions"
    user = [{"role": "user", "content": "x"}]
    cases = [
        (comp, {"prompt": "x", "max_tokens": 100_000}, "max_tokens"),
        (chat, {"messages": user, "max_tokens": 513}, "max_tokens"),
        (comp, {"prompt": "x", "logprobs": 21}, "logprobs"),
        (chat, {"messages": user, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        (comp, {"prompt": "x", "best_of": 2}, None),
        (comp, {"prompt": "x", "n": 2}, None),
        (comp, {"prompt": "x", "grammar": 'root ::= "a"{3,1}'}, "grammar"),
        (chat, {"messages": user, "grammar": 'root ::= "a"{0,100000}'}, "grammar"),
        (chat, {"messages": user, "grammar": 'r ::= "a"{0,300}\nroot ::= r{0,300}'}, "grammar"),
        (comp, {"prompt": "x", "grammar": 'root ::= "' + "a" * (200 << 10) + '"'}, "grammar"),
    ]
    # a long stream holds the model (interrupt_requests is off): the refusals do not wait for it
    with httpx.stream("POST", server.url + comp, timeout=120, json={
            "model": "tiny", "prompt": "a", "max_tokens": 400, "temperature": 0, "stream": True}) as busy:
        lines = busy.iter_lines()
        assert next(lines).startswith("data: ")
        for path, body, param in cases:
            t0 = time.monotonic()
            err = _is_openai_error(_post(server, path, {"model": "tiny", **body}), 400)
            assert time.monotonic() - t0 < 1, (body, time.monotonic() - t0)
            assert param is None or err["param"] == param, (err, param)
        rest = [ln for ln in lines if ln]
    assert rest[-1] == "data: [DONE]" and not any('"error"' in ln for ln in rest)
    # within the bounds: a prompt and its completion share the context, which ends the completion ("length")
    r = _post(server, comp, {"model": "tiny", "prompt": "a", "max_tokens": 512, "temperature": 0,
                             "logit_bias": {str(t): -100.0 for t in (151643, 151645)}})
    assert r.status_code == 200 and r.json()["usage"]["total_tokens"] <= 512
    assert json.dumps(r.json()["choices"][0]["finish_reason"]) in ('"length"', '"stop"')


def test_thread_counts_are_refused_with_the_settings() -> None:
    from pydantic import ValidationError

    from pyllama_moe.params import max_threads

    for name in ("n_threads", "n_threads_batch"):
        with pytest.raises(ValidationError, match=name):
            ModelSettings(model="m.gguf", **{name: 100_000})
        assert getattr(ModelSettings(model="m.gguf", **{name: max_threads()}), name) == max_threads()
    with pytest.raises(ValidationError, match="n_threads"):
        parse_args(["--model", "m.gguf", "--n_threads", "100000"])


def test_moe_hybrid_setting_and_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic import ValidationError

    # --moe_hybrid false / true / auto (any case) become Llama's False / True / "auto"; unset leaves Llama's default
    for word, want in (("false", False), ("true", True), ("auto", "auto"), ("True", True), ("AUTO", "auto")):
        _, models = parse_args(["--model", "m.gguf", "--moe_hybrid", word])
        assert models[0].llama_kwargs()["moe_hybrid"] == want, word
    _, models = parse_args(["--model", "m.gguf"])
    assert models[0].llama_kwargs()["moe_hybrid"] is None
    assert ModelSettings(model="m.gguf", moe_hybrid=True).llama_kwargs()["moe_hybrid"] is True
    monkeypatch.setenv("PYLLAMA_MOE_MOE_HYBRID", "auto")
    assert ModelSettings(model="m.gguf").moe_hybrid == "auto"
    monkeypatch.delenv("PYLLAMA_MOE_MOE_HYBRID")
    # pydantic alone would read "on", "yes" or "1" as true, which Llama refuses: refused when the settings are read
    for bad in ("on", "1", "yes", "2"):
        with pytest.raises(ValidationError, match="moe_hybrid must be false, true or auto"):
            parse_args(["--model", "m.gguf", "--moe_hybrid", bad])
    for value in (1, 2, 0.5):
        with pytest.raises(ValidationError, match="moe_hybrid"):
            ModelSettings(model="m.gguf", moe_hybrid=value)


class CachedModel:
    """A served model's stand-in with a MoE cache whose counts are given: what /metrics reads of it."""

    def __init__(self, path: str, **kwargs: Any) -> None:
        self.kwargs = kwargs
        from pyllama_moe.moe import MoeCacheStats

        self.stats = MoeCacheStats(hits_device=30, misses_device=10, n_host=4, n_host_calls=5,
                                   host_busy_us=1_500_000, host_max=4, upload_expert_us=20.0)

    def n_ctx(self) -> int:
        return 512

    def moe_cache_stats(self) -> Any:
        return self.stats

    def close(self) -> None:
        pass


def test_metrics_give_the_experts_the_cpu_computed() -> None:
    # --moe_hybrid reaches Llama; /metrics adds the hybrid decode's experts computed on the CPU and its busy seconds
    # beside the cache's hit rate (4 of its 10 misses computed on the CPU are misses still: 30 hits of 40)
    settings = ModelSettings(model="m.gguf", model_alias="moe", moe_hybrid=True, moe_cache_mib=64)
    r = Running(create_app(ServerSettings(), [settings], factory=CachedModel))
    try:
        model = r.app.state.pool.get("moe").llama
        assert model.kwargs["moe_hybrid"] is True and model.kwargs["moe_cache_mib"] == 64
        lines = httpx.get(r.url + "/metrics").text.splitlines()
    finally:
        r.stop()
    assert 'pyllama_moe_moe_cache_hit_rate{model="moe"} 0.7500' in lines
    assert 'pyllama_moe_moe_cache_host_experts_total{model="moe"} 4' in lines
    assert 'pyllama_moe_moe_cache_host_busy_seconds_total{model="moe"} 1.500000' in lines
