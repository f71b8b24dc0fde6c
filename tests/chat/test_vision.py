"""The vision chat handlers (#71): llama-cpp-python 0.3.36's handlers over libmtmd, on synth's llama4 MoE and a
random-weight llama4 projector, on the CPU.

The handler's greedy answer is checked against a decode that shares none of its position bookkeeping (libmtmd's
own ``mtmd_helper_eval_chunks`` for the prompt, then one token at a time from the position libmtmd returned); an
image is seen (another image, or the same images in another order, gives other logits); every form of
``image_url`` gives the same answer; bad images are clear ``ValueError``s and leave the model usable; a later
text prompt never takes an image's placeholder ids for the image."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pyllama_moe import llama_chat_format, mtmd
from pyllama_moe.batch import Batch
from pyllama_moe.chat import vision
from pyllama_moe.errors import ClosedError, ImageError, LlamaError, MediaMismatchError, ProjectorLoadError
from pyllama_moe.llama import Llama
from pyllama_moe.session import MEDIA_TOKEN
from pyllama_moe.tools.synth.projector import ProjectorShape, write_projector

from fixtures.images import data_uri, huge_png_header, png, serving
from fixtures.models import model_path

N_EMBD_TEXT = 64  # synth's tiny preset
GREEDY = {"temperature": 0.0, "max_tokens": 8}


@pytest.fixture(scope="module")
def projector(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_projector(tmp_path_factory.mktemp("vision") / "mmproj-llama4.gguf", N_EMBD_TEXT)


@pytest.fixture(scope="module")
def handler(projector: Path) -> vision.Llava15ChatHandler:
    return vision.Llava15ChatHandler(clip_model_path=str(projector), verbose=False, use_gpu=False)


def _llama(handler: Any = None) -> Llama:
    return Llama(str(model_path("llama4")), n_ctx=512, n_batch=256, n_threads=2, seed=1, chat_handler=handler,
                 verbose=False)


@pytest.fixture(scope="module")
def llm(handler: vision.Llava15ChatHandler) -> Iterator[Llama]:
    with _llama(handler) as llm:
        yield llm


def ask(*parts: Any, text: str = "What is this?") -> list[dict[str, Any]]:
    content = [{"type": "image_url", "image_url": {"url": p}} if isinstance(p, str) else p for p in parts]
    return [{"role": "user", "content": [*content, {"type": "text", "text": text}]}]


def first_logprobs(llm: Llama, messages: list[dict[str, Any]]) -> dict[str, float]:
    out = llm.create_chat_completion(messages=messages, temperature=0.0, max_tokens=1, logprobs=True, top_logprobs=5)
    return {t["token"]: t["logprob"] for t in out["choices"][0]["logprobs"]["content"][0]["top_logprobs"]}


def test_names_are_llama_cpp_pythons() -> None:
    for name in ("MTMDChatHandler", "Llava15ChatHandler", "Llava16ChatHandler", "ObsidianChatHandler",
                 "MoondreamChatHandler", "NanoLlavaChatHandler", "Llama3VisionAlphaChatHandler", "Llama3VisionAlpha",
                 "MiniCPMv26ChatHandler", "Qwen25VLChatHandler", "Gemma4ChatHandler"):
        cls = getattr(llama_chat_format, name)
        assert issubclass(cls, vision.Llava15ChatHandler)
    assert issubclass(vision.Gemma4ChatHandler, vision.MTMDChatHandler)
    with pytest.raises(ProjectorLoadError, match="Clip model path does not exist") as e:
        vision.Llava15ChatHandler(clip_model_path="/nonexistent/mmproj.gguf")
    assert isinstance(e.value, ValueError)


def test_greedy_answer_matches_a_decode_from_libmtmds_positions(llm: Llama, handler: Any) -> None:
    image = png(40, 40)
    messages = ask(data_uri(image))
    out = llm.create_chat_completion(messages=messages, **GREEDY)
    answer = out["choices"][0]["message"]["content"]
    usage = out["usage"]

    # the reference: the same text and image evaluated by libmtmd in one call, then greedy steps from its n_past
    projector = llm.load_projector(handler.clip_model_path, use_gpu=False)
    text = handler.render(llm, messages, projector.marker)
    assert text.count(projector.marker) == 1 and text.endswith("ASSISTANT: ")
    with _llama() as ref:
        ctx = ref._ctx
        p = mtmd.MtmdContext(handler.clip_model_path, ref._model, use_gpu=False, n_threads=2, verbose=False)
        chunks = p.tokenize(text, [p.bitmap(image)])
        n_past = p.eval(ctx, chunks, n_batch=256)
        assert usage["prompt_tokens"] == n_past == chunks.n_pos()
        assert [c.type for c in (chunks[i] for i in range(len(chunks)))] == \
            [mtmd.CHUNK_TEXT, mtmd.CHUNK_IMAGE, mtmd.CHUNK_TEXT]
        batch = Batch(1)
        tokens = []
        for step in range(GREEDY["max_tokens"]):
            token = int(np.argmax(ctx.logits_ith(-1)))
            if ref._vocab.is_eog(token):
                break
            tokens.append(token)
            batch.set_one(token, n_past + step)
            ctx.decode(batch)
        batch.close()
        p.close()
        expected = ref.detokenize(tokens).decode("utf-8", errors="ignore")
    assert usage["completion_tokens"] == len(tokens) > 0
    assert answer == expected


def test_the_image_is_seen(llm: Llama) -> None:
    a, b = data_uri(png(40, 40, seed=1)), data_uri(png(40, 40, seed=2))
    first = first_logprobs(llm, ask(a))
    assert first == first_logprobs(llm, ask(a))  # the same image: the same answer, the context reset between
    assert first != first_logprobs(llm, ask(b))
    assert first != first_logprobs(llm, [{"role": "user", "content": "What is this?"}])


def test_several_images_in_a_message_in_their_order(llm: Llama, handler: Any) -> None:
    a, b = data_uri(png(40, 40, seed=3)), data_uri(png(24, 48, seed=4))
    out = llm.create_chat_completion(messages=ask(a, b, text="Compare them."), **GREEDY)
    one = llm.create_chat_completion(messages=ask(a, text="Compare them."), **GREEDY)
    # each image's positions are in the prompt: as libmtmd counts them, and at least a tile's 4 tokens more
    projector = llm.load_projector(handler.clip_model_path, use_gpu=False)
    text = handler.render(llm, ask(a, b, text="Compare them."), projector.marker)
    chunks = projector.tokenize(text, [projector.bitmap(png(40, 40, seed=3)), projector.bitmap(png(24, 48, seed=4))])
    assert sum(chunks[i].type == mtmd.CHUNK_IMAGE for i in range(len(chunks))) >= 2
    assert out["usage"]["prompt_tokens"] == chunks.n_pos()
    assert out["usage"]["prompt_tokens"] >= one["usage"]["prompt_tokens"] + ProjectorShape().tokens_per_tile
    assert first_logprobs(llm, ask(a, b)) != first_logprobs(llm, ask(b, a))
    # images in two messages of a conversation
    two = [*ask(a, text="This one?"), {"role": "assistant", "content": "Yes."}, *ask(b, text="And this?")]
    assert llm.create_chat_completion(messages=two, **GREEDY)["usage"]["prompt_tokens"] > out["usage"]["prompt_tokens"]


def test_every_form_of_image_url_gives_the_same_answer(llm: Llama, tmp_path: Path) -> None:
    image = png(32, 32, seed=5)
    path = tmp_path / "cat.png"
    path.write_bytes(image)
    want = first_logprobs(llm, ask(data_uri(image)))
    assert first_logprobs(llm, ask(str(path))) == want
    assert first_logprobs(llm, ask(path.as_uri())) == want
    assert first_logprobs(llm, ask({"type": "image_url", "image_url": data_uri(image)})) == want  # a bare string
    pct = "data:image/png," + "".join(f"%{c:02X}" for c in image)  # a data URI without base64
    assert first_logprobs(llm, ask(pct)) == want


def test_http_image_is_fetched(llm: Llama) -> None:
    image = png(32, 32, seed=6)
    with serving("/cat.png", image) as url:
        assert first_logprobs(llm, ask(url + "/cat.png")) == first_logprobs(llm, ask(data_uri(image)))
        with pytest.raises(ImageError, match="HTTP 404"):
            llm.create_chat_completion(messages=ask(url + "/missing.png"), **GREEDY)


@pytest.mark.parametrize("url,message", [
    (data_uri(png(16, 16)[:-20]), "truncated PNG"),
    (data_uri(b"plain text, no image"), "not an image"),
    (data_uri(huge_png_header()), "larger than the limit"),
    (data_uri(b"RIFF\x00\x00\x00\x00WEBPVP8 "), "WebP"),
    ("data:image/png;base64,@@@@", "not an image"),
    ("data:image/png;base64", "no ','"),
    ("/nonexistent/cat.png", "does not exist"),
    ("ftp://example.com/cat.png", "scheme 'ftp'"),
])
def test_bad_images_are_clear_errors_and_the_model_goes_on(llm: Llama, url: str, message: str) -> None:
    with pytest.raises(ImageError, match=message) as e:
        llm.create_chat_completion(messages=ask(url), **GREEDY)
    assert isinstance(e.value, ValueError)
    assert llm.create_chat_completion(messages=ask(data_uri(png(8, 8))), **GREEDY)["choices"][0]["message"]


def test_image_url_without_url_and_marker_in_text(llm: Llama) -> None:
    with pytest.raises(ImageError, match="needs a URL string"):
        llm.create_chat_completion(messages=ask({"type": "image_url", "image_url": {}}), **GREEDY)
    with pytest.raises(MediaMismatchError):  # the user's text holds libmtmd's marker: more markers than images
        llm.create_chat_completion(messages=ask(data_uri(png(8, 8)), text="see <__media__>"), **GREEDY)


def test_placeholders_are_not_taken_for_the_image(llm: Llama) -> None:
    llm.create_chat_completion(messages=ask(data_uri(png(40, 40, seed=7))), **GREEDY)
    session = llm._session
    assert session.media_from is not None
    ids = session.input_ids[:session.n_tokens].tolist()
    assert MEDIA_TOKEN in ids
    # the same ids as a text prompt: evaluated from the first image on, as a fresh model evaluates them
    got = llm.create_completion(prompt=ids, max_tokens=1, temperature=0.0, logprobs=5)
    with _llama() as fresh:
        want = fresh.create_completion(prompt=ids, max_tokens=1, temperature=0.0, logprobs=5)
    assert got["choices"][0]["logprobs"]["top_logprobs"] == want["choices"][0]["logprobs"]["top_logprobs"]
    assert session.media_from is None
    # a state saved with an image keeps that: its placeholders are not reused after load_state either
    llm.create_chat_completion(messages=ask(data_uri(png(40, 40, seed=7))), **GREEDY)
    state = llm.save_state()
    assert state.media_from is not None
    llm.reset()
    llm.load_state(state)
    assert llm._session.media_from == state.media_from
    again = llm.create_completion(prompt=ids, max_tokens=1, temperature=0.0, logprobs=5)
    assert again["choices"][0]["logprobs"]["top_logprobs"] == want["choices"][0]["logprobs"]["top_logprobs"]


def test_streaming_gives_the_same_answer(llm: Llama) -> None:
    messages = ask(data_uri(png(40, 40, seed=8)))
    whole = llm.create_chat_completion(messages=messages, **GREEDY)["choices"][0]["message"]["content"]
    chunks = list(llm.create_chat_completion(messages=messages, stream=True, **GREEDY))
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == whole


# a ChatML template that takes a content of parts (synth's, qwen2's, concatenates a content as a string)
PARTS_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for p in m['content'] %}{% if p['type'] == 'text' %}{{ p['text'] }}{% endif %}{% endfor %}"
    "{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_mtmd_handler_renders_the_models_template(projector: Path) -> None:
    handler = vision.MTMDChatHandler(clip_model_path=str(projector), verbose=False, use_gpu=False)
    with _llama(handler) as llm:
        messages = ask(data_uri(png(40, 40, seed=9)), text="Describe it.")
        assert "tokenizer.chat_template" in llm.metadata  # synth's: qwen2's, which cannot render parts
        with pytest.raises(ValueError, match="cannot render"):
            llm.create_chat_completion(messages=messages, **GREEDY)
        llm.metadata["tokenizer.chat_template"] = PARTS_TEMPLATE
        text = handler.render(llm, messages, "<__media__>")
        assert "<|im_start|>user\n<__media__>Describe it.<|im_end|>" in text
        out = llm.create_chat_completion(messages=messages, **GREEDY)
        p = llm.load_projector(str(projector), use_gpu=False)
        chunks = p.tokenize(text, [p.bitmap(png(40, 40, seed=9))])
        assert out["usage"]["prompt_tokens"] == chunks.n_pos()
        assert any(chunks[i].type == mtmd.CHUNK_IMAGE for i in range(len(chunks)))
        llm.metadata.pop("tokenizer.chat_template")
        with pytest.raises(ValueError, match="requires tokenizer.chat_template"):
            llm.create_chat_completion(messages=messages, **GREEDY)


def test_family_templates(handler: Any) -> None:
    class Stub:
        def token_eos(self) -> int:
            return 2

        def token_bos(self) -> int:
            return 1

        def detokenize(self, tokens: list[int]) -> bytes:
            return b"</s>" if tokens == [2] else b"<s>"

    m = "<__media__>"
    chat = ask("data:x", text="Hi")
    # llama-cpp-python's templates as its environment renders them: trim_blocks drops the newline that follows a
    # block tag ("{% if ... %}\nUSER: "), and the template's last newline goes
    assert handler.render(Stub(), chat, m) == (vision.Llava15ChatHandler.DEFAULT_SYSTEM_MESSAGE
                                               + f"USER: {m}HiASSISTANT: ")
    q = vision.Qwen25VLChatHandler.__new__(vision.Qwen25VLChatHandler)
    assert q.render(Stub(), [{"role": "user", "content": [{"type": "text", "text": "A"},
                                                          {"type": "image_url", "image_url": "u"}]}], m) == \
        f"<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nA{m}<|im_end|>\n" \
        "<|im_start|>assistant"
    moon = vision.MoondreamChatHandler.__new__(vision.MoondreamChatHandler)
    assert moon.render(Stub(), chat, m) == f"{m}\n\nQuestion: Hi\n\nAnswer:"


def test_the_projector_is_owned_by_the_llama(projector: Path, handler: Any) -> None:
    llm = _llama(handler)
    p = llm.load_projector(str(projector), use_gpu=False)
    assert llm.load_projector(str(projector), use_gpu=False) is p
    llm.create_chat_completion(messages=ask(data_uri(png(8, 8))), **GREEDY)
    llm.close()
    with pytest.raises(ClosedError):
        p.supports_vision()
    with pytest.raises(ClosedError):
        llm.create_chat_completion(messages=ask(data_uri(png(8, 8))), **GREEDY)


def test_load_image_bounds(tmp_path: Path) -> None:
    assert vision.load_image(data_uri(b"abc")) == b"abc"
    with pytest.raises(ImageError, match="does not read local files"):
        vision.load_image(str(tmp_path / "x.png"), local_files=False)
    with pytest.raises(ImageError, match="does not read local files"):
        vision.load_image((tmp_path / "x.png").as_uri(), local_files=False)
    big = tmp_path / "big.bin"
    with open(big, "wb") as f:
        f.truncate(vision.MAX_FILE_BYTES + 1)  # sparse: no disk used
    with pytest.raises(ImageError, match="larger than"):
        vision.load_image(str(big))
    assert os.path.getsize(big) == vision.MAX_FILE_BYTES + 1


def test_a_stream_refuses_a_context_moved_under_its_images(llm: Llama) -> None:
    stream = llm.create_chat_completion(messages=ask(data_uri(png(40, 40, seed=10))), stream=True, **GREEDY)
    llm.create_completion("Hello", max_tokens=1)  # this thread moves the context before the stream's first step
    with pytest.raises(LlamaError, match="moved the context"):
        list(stream)
    assert llm.create_chat_completion(messages=ask(data_uri(png(8, 8))), **GREEDY)["choices"][0]["message"]


def test_mutated_and_cut_images_are_decoded_or_refused(llm: Llama, handler: Any) -> None:
    # what a client may send: bytes changed or cut anywhere after the signature (libmtmd's decoder, stb_image, took
    # 12000 such files without a crash); each is a bitmap or an ImageError, nothing else
    import random

    projector = llm.load_projector(handler.clip_model_path, use_gpu=False)
    rng = random.Random(71)
    base = [png(23, 17, seed=1), png(64, 40, seed=2)]
    refused = 0
    for _ in range(400):
        data = bytearray(rng.choice(base))
        if rng.random() < 0.2:
            data = data[:rng.randrange(8, len(data))]
        else:
            for _ in range(rng.randint(1, 8)):
                data[rng.randrange(8, len(data))] = rng.randrange(256)
        try:
            projector.bitmap(bytes(data)).close()
        except ImageError:
            refused += 1
    assert 0 < refused < 400


def test_inline_images(tmp_path: Path) -> None:
    image = png(12, 10, seed=11)
    path = tmp_path / "x.png"
    path.write_bytes(image)
    messages = [{"role": "system", "content": "s"}, *ask(str(path), data_uri(image))]
    out = vision.inline_images(messages)
    assert out[0] == messages[0] and messages[1]["content"][0]["image_url"]["url"] == str(path)  # not changed
    urls = vision.image_urls(out)
    assert urls == [data_uri(image), data_uri(image)]
    with pytest.raises(ImageError, match="image 2: a truncated PNG"):
        vision.inline_images(ask(str(path), data_uri(image[:-20])))
    with pytest.raises(ImageError, match="does not read local files"):
        vision.inline_images(ask(str(path)), local_files=False)


def test_inline_images_of_a_request_share_a_budget(tmp_path: Path) -> None:
    # the server passes max_request_bytes: images read from URLs and files take at most that much together, as
    # images sent in the body do (a request of many large URLs is refused, not held in memory)
    paths = []
    for i in range(3):
        p = tmp_path / f"{i}.png"
        p.write_bytes(png(64, 64, seed=i))
        paths.append(p)
    size = sum(p.stat().st_size for p in paths)
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": str(p)}} for p in paths]}]
    assert len(vision.inline_images(messages, max_bytes=size)[0]["content"]) == 3
    with pytest.raises(ImageError, match="left to the request's images"):
        vision.inline_images(messages, max_bytes=size - 1)
