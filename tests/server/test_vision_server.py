"""The server with a projector (#71): ``clip_model_path`` and the vision ``chat_format``s, an OpenAI chat request with
an image, and bad images answered with OpenAI-shaped 400s."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

from pyllama_moe.chat import vision  # noqa: E402
from pyllama_moe.server import ModelSettings, ServerSettings, create_app, parse_args  # noqa: E402
from pyllama_moe.tools.synth.projector import write_projector  # noqa: E402

from fixtures.images import data_uri, huge_png_header, png, serving  # noqa: E402
from fixtures.models import model_path  # noqa: E402
from fixtures.server import Running  # noqa: E402

SMALL = {"n_ctx": 512, "n_batch": 256, "n_threads": 2, "verbose": False}


@pytest.fixture(scope="module")
def projector(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_projector(tmp_path_factory.mktemp("vision-server") / "mmproj.gguf", 64)


@pytest.fixture(scope="module")
def server(projector: Path) -> Iterator[Running]:
    models = [ModelSettings(model=str(model_path("llama4")), model_alias="vision", chat_format="llava-1-5",
                            clip_model_path=str(projector), **SMALL)]
    r = Running(create_app(ServerSettings(interrupt_requests=False), models))
    yield r
    r.stop()


def image_message(url: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": "What is in the picture?"}]}]


def test_chat_with_an_image(server: Running) -> None:
    client = server.client()
    res = client.chat.completions.create(model="vision", messages=image_message(data_uri(png(40, 40))),
                                         max_tokens=6, temperature=0)
    assert res.object == "chat.completion" and res.choices[0].message.content
    text_only = client.chat.completions.create(
        model="vision", messages=[{"role": "user", "content": [{"type": "text", "text": "What is in the picture?"}]}],
        max_tokens=6, temperature=0)
    # a tile's 4 tokens, and the text llama4's projector puts around an image (<|image_start|>, ...)
    assert res.usage.prompt_tokens >= text_only.usage.prompt_tokens + 4
    again = client.chat.completions.create(model="vision", messages=image_message(data_uri(png(40, 40))),
                                           max_tokens=6, temperature=0)
    assert again.choices[0].message.content == res.choices[0].message.content
    parts = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="vision", messages=image_message(data_uri(png(40, 40))), max_tokens=6, temperature=0, stream=True)]
    assert "".join(parts) == res.choices[0].message.content


@pytest.mark.parametrize("url,message", [
    (data_uri(png(16, 16)[:-20]), "truncated PNG"),
    (data_uri(b"%PDF-1.4 not an image"), "not an image"),
    (data_uri(huge_png_header()), "larger than the limit"),
    ("/etc/passwd", "does not read local files"),
    ("file:///etc/passwd", "does not read local files"),
])
@pytest.mark.parametrize("stream", [False, True])
def test_bad_images_are_openai_400s(server: Running, url: str, message: str, stream: bool) -> None:
    r = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
        "model": "vision", "messages": image_message(url), "max_tokens": 4, "stream": stream})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and message in error["message"]
    # the model still answers
    ok = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
        "model": "vision", "messages": image_message(data_uri(png(8, 8))), "max_tokens": 2})
    assert ok.status_code == 200


def test_an_http_image_is_read_before_the_model(server: Running) -> None:
    image = png(40, 40, seed=3)
    with serving("/cat.png", image) as url:
        client = server.client()
        by_url = client.chat.completions.create(model="vision", messages=image_message(url + "/cat.png"),
                                                max_tokens=6, temperature=0)
        by_data = client.chat.completions.create(model="vision", messages=image_message(data_uri(image)),
                                                 max_tokens=6, temperature=0)
        assert by_url.choices[0].message.content == by_data.choices[0].message.content
        assert by_url.usage == by_data.usage
        r = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
            "model": "vision", "messages": image_message(url + "/missing.png"), "max_tokens": 2})
        assert r.status_code == 400 and "HTTP 404" in r.json()["error"]["message"]


def test_a_model_without_a_projector_refuses_images(projector: Path) -> None:
    r = Running(create_app(ServerSettings(), [ModelSettings(model=str(model_path("llama4")), model_alias="text",
                                                            **SMALL)]))
    try:
        res = httpx.post(r.url + "/v1/chat/completions", timeout=60, json={
            "model": "text", "messages": image_message(data_uri(png(8, 8))), "max_tokens": 2})
        assert res.status_code == 400
        assert "started without clip_model_path" in res.json()["error"]["message"]
    finally:
        r.stop()


def test_settings(projector: Path) -> None:
    with pytest.raises(ValueError, match="needs clip_model_path"):
        ModelSettings(model="m.gguf", chat_format="llava-1-5")
    with pytest.raises(ValueError, match="n_parallel"):
        ModelSettings(model="m.gguf", clip_model_path=str(projector), n_parallel=2)
    # no chat format: the model's own template (mtmd); a text chat format: the projector is not used
    handler = ModelSettings(model="m.gguf", clip_model_path=str(projector)).llama_kwargs()["chat_handler"]
    assert type(handler) is vision.MTMDChatHandler and handler.local_files is False
    assert "chat_handler" not in ModelSettings(model="m.gguf", clip_model_path=str(projector),
                                               chat_format="chatml").llama_kwargs()
    for name, cls in vision.VISION_CHAT_FORMATS.items():
        kw = ModelSettings(model="m.gguf", clip_model_path=str(projector), chat_format=name).llama_kwargs()
        assert type(kw["chat_handler"]) is cls and "clip_model_path" not in kw
    with pytest.raises(ValueError, match="does not exist"):
        ModelSettings(model="m.gguf", clip_model_path="/nonexistent.gguf", chat_format="mtmd").llama_kwargs()
    _, models = parse_args(["--model", "m.gguf", "--clip_model_path", str(projector), "--chat_format", "llava-1-6"])
    assert models[0].clip_model_path == str(projector) and models[0].chat_format == "llava-1-6"
