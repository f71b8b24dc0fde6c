"""Vision chat handlers: llama-cpp-python 0.3.36's ``MTMDChatHandler``, ``Llava15ChatHandler`` and the family handlers,
over libmtmd (:mod:`pyllama_moe.mtmd`).

A handler is made with a projector's path and passed to the model: ``Llama(model_path,
chat_handler=Llava15ChatHandler(clip_model_path="mmproj.gguf"))``. A call of it

1. renders the chat with its template, an image part of a message becoming libmtmd's media marker where the template
   puts the image: the family handlers have their own template (``CHAT_FORMAT``, Jinja2, and a system message added
   when the chat has none, ``DEFAULT_SYSTEM_MESSAGE``), ``MTMDChatHandler`` renders the GGUF's
   ``tokenizer.chat_template``, where an image part is a text part holding the marker;
2. reads each image of an ``image_url`` part (:func:`load_image`: a data URI, a file, an http(s) URL) and checks it
   before C (:func:`pyllama_moe.images.check_image`);
3. tokenizes the text and the images together and evaluates them into the model's context from its start
   (``Llama.eval_chunks``: the text as a prompt's tokens, each image encoded by the projector and its embeddings
   decoded);
4. completes from there with ``llama.create_completion``, as the text handlers do (``response_format``, a forced tool).

The prompts are those llama-cpp-python 0.3.36 renders, quirks included (a string content of a user message is
rendered twice by ``Llava15ChatHandler``'s template, ``MoondreamChatHandler`` writes a null assistant content as
``None``), so that a model answers both alike. A handler loads its projector once per ``Llama``, which owns it.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import logging
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from typing import Any, ClassVar

from pyllama_moe.chat.handler import check_tools, complete_chat
from pyllama_moe.chat.template import Jinja2ChatFormatter, compile_template
from pyllama_moe.errors import ImageError, ProjectorLoadError
from pyllama_moe.images import MAX_FILE_BYTES, check_image

__all__ = [
    "VISION_CHAT_FORMATS",
    "Gemma4ChatHandler",
    "Llama3VisionAlpha",
    "Llama3VisionAlphaChatHandler",
    "Llava15ChatHandler",
    "Llava16ChatHandler",
    "MTMDChatHandler",
    "MiniCPMv26ChatHandler",
    "MoondreamChatHandler",
    "NanoLlavaChatHandler",
    "ObsidianChatHandler",
    "Qwen25VLChatHandler",
    "image_urls",
    "inline_images",
    "load_image",
]

logger = logging.getLogger("pyllama_moe")

FETCH_TIMEOUT_S = 30.0  # an http(s) image's fetch


# -- images: where an image_url part points, and its bytes


def _part_url(part: Any) -> str | None:
    """The URL of an ``image_url`` content part (``{"image_url": {"url": ...}}`` or ``{"image_url": "..."}``)."""
    if not isinstance(part, dict) or part.get("type") != "image_url":
        return None
    value = part.get("image_url")
    url = value.get("url") if isinstance(value, dict) else value
    if not isinstance(url, str) or not url:
        raise ImageError(f"an image_url part needs a URL string (image_url.url), got {value!r:.100}")
    return url


def image_urls(messages: Iterable[dict[str, Any]], roles: tuple[str, ...] | None = ("user",)) -> list[str]:
    """The URLs of the ``image_url`` parts of the messages of ``roles`` (None: every message), in order."""
    out: list[str] = []
    for message in messages:
        if roles is not None and message.get("role") not in roles:
            continue
        content = message.get("content")
        if isinstance(content, list):
            out.extend(url for part in content if (url := _part_url(part)) is not None)
    return out


def _short(url: str) -> str:
    return url if len(url) <= 60 else url[:40] + "..." + url[-12:]


def _data_uri(url: str) -> bytes:
    head, comma, payload = url.partition(",")
    if not comma:
        raise ImageError(f"the data URI {_short(url)!r} has no ',' before its data")
    if head.endswith(";base64"):
        try:
            return base64.b64decode(payload, validate=False)
        except (binascii.Error, ValueError) as e:
            raise ImageError(f"the data URI's base64 data cannot be decoded: {e}") from None
    return urllib.parse.unquote_to_bytes(payload)


def _read_bounded(stream: Any, what: str, limit: int) -> bytes:
    data = stream.read(min(limit, MAX_FILE_BYTES) + 1)
    if len(data) > MAX_FILE_BYTES:
        raise ImageError(f"{what} is larger than {MAX_FILE_BYTES >> 20} MiB")
    if len(data) > limit:
        raise ImageError(f"{what} does not fit in the {limit} bytes left to the request's images")
    return bytes(data)


def _fetch(url: str, limit: int) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as response:  # noqa: S310 - http(s) only here
            return _read_bounded(response, f"the image at {_short(url)}", limit)
    except urllib.error.HTTPError as e:
        raise ImageError(f"cannot fetch the image at {_short(url)}: HTTP {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise ImageError(f"cannot fetch the image at {_short(url)}: {reason}") from None


def _read_file(path: str, local_files: bool, limit: int) -> bytes:
    if not local_files:
        raise ImageError("this server does not read local files: send the image as a data URI "
                         "(data:image/png;base64,...) or an http(s) URL")
    try:
        with open(path, "rb") as f:
            return _read_bounded(f, f"the image file {path}", limit)
    except FileNotFoundError:
        raise ImageError(f"the image file {path} does not exist") from None
    except OSError as e:
        raise ImageError(f"cannot read the image file {path}: {e.strerror or e}") from None


def load_image(image_url: str, *, local_files: bool = True, limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of the image at ``image_url``: a ``data:`` URI (base64 or percent-encoded), an ``http(s)://`` URL
    (fetched, as llama-cpp-python fetches it, within ``FETCH_TIMEOUT_S``), a ``file://`` URL or a path (unless
    ``local_files`` is False: a server's requests). At most ``limit`` bytes read (and never more than
    ``images.MAX_FILE_BYTES``); anything else is an
    :class:`ImageError` (a ``ValueError``)."""
    if not isinstance(image_url, str):
        raise ImageError(f"an image URL must be a string, got {type(image_url).__name__}")
    scheme = urllib.parse.urlsplit(image_url).scheme.lower()
    if scheme == "data":
        return _data_uri(image_url)
    if scheme in ("http", "https"):
        return _fetch(image_url, limit)
    if scheme == "file":
        return _read_file(urllib.request.url2pathname(urllib.parse.urlsplit(image_url).path), local_files, limit)
    if scheme and len(scheme) > 1:  # (a one-letter scheme is a Windows drive)
        raise ImageError(f"an image URL of scheme {scheme!r} cannot be read: use a data URI, an http(s) URL or "
                         "a file")
    return _read_file(image_url, local_files, limit)


def inline_images(messages: list[dict[str, Any]], *, local_files: bool = True,
                  max_bytes: int | None = None) -> list[dict[str, Any]]:
    """``messages`` with the image of each ``image_url`` part read (:func:`load_image`), checked
    (:func:`pyllama_moe.images.check_image`) and put back as a data URI: the server does this before a request
    waits for its model, so that a slow URL does not hold the model and a bad image is refused at once. With
    ``max_bytes`` (the server's ``max_request_bytes``), the images read from URLs and files take at most that many
    bytes together, as images sent in the body do: a request of many large URLs is refused, not held in memory."""
    out = []
    n = 0
    left = sys.maxsize if max_bytes is None else max_bytes  # each image is bounded by MAX_FILE_BYTES anyway
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            out.append(message)
            continue
        parts = []
        for part in content:
            url = _part_url(part)
            if url is not None and not url.startswith("data:"):
                n += 1
                data = load_image(url, local_files=local_files, limit=left)
                left -= len(data)
                info = check_image(data, f"image {n} ({_short(url)})")
                part = {**part, "image_url": {"url": f"data:image/{info.format};base64,"
                                                     + base64.b64encode(data).decode()}}
            elif url is not None:
                n += 1
                check_image(_data_uri(url), f"image {n}")
            parts.append(part)
        out.append({**message, "content": parts})
    return out


# -- the handlers


def _with_markers(messages: list[dict[str, Any]], marker: str, roles: tuple[str, ...] | None,
                  as_text: bool) -> list[dict[str, Any]]:
    """``messages`` with each image part of ``roles`` pointing at ``marker`` (``as_text``: a text part holding it)."""
    out = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list) and (roles is None or message.get("role") in roles):
            parts = []
            for part in content:
                if _part_url(part) is None:
                    parts.append(part)
                elif as_text:
                    parts.append({"type": "text", "text": marker})
                else:
                    parts.append({**part, "image_url": marker})
            message = {**message, "content": parts}
        out.append(message)
    return out


def _token_text(llama: Any, token: int) -> str:
    raw = llama.detokenize([token]) if token is not None and token >= 0 else b""
    return raw.decode("utf-8", errors="ignore") if isinstance(raw, bytes) else str(raw)


class Llava15ChatHandler:
    """llava-1.5's prompt (``USER: <image>...\\nASSISTANT:``) with images through the projector at
    ``clip_model_path``; the base of the family handlers, which change ``CHAT_FORMAT`` and
    ``DEFAULT_SYSTEM_MESSAGE``. ``use_gpu=False`` keeps the projector on the CPU. ``local_files=False`` refuses
    ``file://`` URLs and paths (the server sets it)."""

    DEFAULT_SYSTEM_MESSAGE: ClassVar[str | None] = (
        "A chat between a curious human and an artificial intelligence assistant. The assistant gives helpful, "
        "detailed, and polite answers to the human's questions.")
    # the template: an image part's image_url is the media marker when it is rendered; the macros write a user
    # message's images, then its texts (a string content has neither: its characters have no type)
    CHAT_FORMAT: ClassVar[str] = (
        "{% for m in messages %}"
        "{% if m.role == 'system' %}{{ m.content }}"
        "{% elif m.role == 'user' %}"
        "{% if m.content is string %}\nUSER: {{ m.content }}{% endif %}"
        "{% if m.content is iterable %}\nUSER: {{ images(m) }}{{ texts(m) }}{% endif %}"
        "{% elif m.role == 'assistant' and m.content is not none %}\nASSISTANT: {{ m.content }}"
        "{% endif %}"
        "{% endfor %}"
        "{% if add_generation_prompt %}\nASSISTANT: {% endif %}"
    )
    # what the templates share: a message's images (each followed by ``after``), its texts (each between ``before``
    # and ``after``)
    MACROS: ClassVar[str] = (
        "{% macro images(m, after='') %}{% for p in m.content if p.type == 'image_url' %}"
        "{{ p.image_url.url if p.image_url is mapping else p.image_url }}{{ after }}{% endfor %}{% endmacro %}"
        "{% macro texts(m, before='', after='') %}{% for p in m.content if p.type == 'text' %}"
        "{{ before }}{{ p.text }}{{ after }}{% endfor %}{% endmacro %}"
    )
    IMAGE_ROLES: ClassVar[tuple[str, ...] | None] = ("user",)  # the messages whose images the template writes

    def __init__(self, clip_model_path: str | os.PathLike[str], verbose: bool = True, use_gpu: bool = True,
                 local_files: bool = True) -> None:
        self.clip_model_path = os.fspath(clip_model_path)
        self.verbose = verbose
        self.use_gpu = use_gpu
        self.local_files = local_files
        if not os.path.exists(self.clip_model_path):
            raise ProjectorLoadError(f"Clip model path does not exist: {self.clip_model_path}")

    # llama-cpp-python's helpers, under its names
    def load_image(self, image_url: str) -> bytes:
        return load_image(image_url, local_files=self.local_files)

    @staticmethod
    def _load_image(image_url: str) -> bytes:
        return load_image(image_url)

    @staticmethod
    def get_image_urls(messages: list[dict[str, Any]]) -> list[str]:
        return image_urls(messages)

    @staticmethod
    def split_text_on_image_urls(text: str, image_urls: list[str]) -> list[tuple[str, str]]:
        """``text`` cut at the first occurrence of any of ``image_urls``, again and again: ``("text", ...)`` and
        ``("image_url", url)`` pieces (kept from llama-cpp-python's API; the handlers do not use it)."""
        out: list[tuple[str, str]] = []
        rest = text
        while rest:
            found = [(pos, url) for url in image_urls if (pos := rest.find(url)) >= 0]
            if not found:
                out.append(("text", rest))
                break
            pos, url = min(found, key=lambda f: f[0])
            if pos:
                out.append(("text", rest[:pos]))
            out.append(("image_url", url))
            rest = rest[pos + len(url):]
        return out

    @classmethod
    def from_pretrained(cls, repo_id: str, filename: str | None, local_dir: str | os.PathLike[str] | None = None,
                        local_dir_use_symlinks: Any = "auto", cache_dir: str | os.PathLike[str] | None = None,
                        **kwargs: Any) -> Any:
        """The handler of the projector matching ``filename`` in a Hugging Face repository (downloaded)."""
        from pyllama_moe.hub import download

        return cls(clip_model_path=download(repo_id, filename, None, local_dir, cache_dir), **kwargs)

    # the prompt
    def _image_urls(self, messages: list[dict[str, Any]]) -> list[str]:
        return image_urls(messages, self.IMAGE_ROLES)

    def render(self, llama: Any, messages: list[dict[str, Any]], marker: str) -> str:
        """The prompt's text, ``marker`` where each image goes."""
        system = next((m.get("content") or "" for m in messages if m.get("role") == "system"), "")
        if system == "" and self.DEFAULT_SYSTEM_MESSAGE is not None:
            messages = [{"role": "system", "content": self.DEFAULT_SYSTEM_MESSAGE}, *messages]
        template = compile_template(self.MACROS + self.CHAT_FORMAT)
        try:
            return template.render(messages=_with_markers(messages, marker, self.IMAGE_ROLES, as_text=False),
                                   add_generation_prompt=True, eos_token=_token_text(llama, llama.token_eos()),
                                   bos_token=_token_text(llama, llama.token_bos()))
        except (TypeError, AttributeError) as e:
            raise ValueError(f"{type(self).__name__} cannot render these messages: {e}") from e

    def __call__(self, *, llama: Any, messages: list[dict[str, Any]], **kwargs: Any) -> Any:
        check_tools(kwargs)
        projector = llama.load_projector(self.clip_model_path, use_gpu=self.use_gpu)
        if not projector.supports_vision():
            raise ProjectorLoadError(f"the projector {self.clip_model_path} has no vision encoder")
        urls = self._image_urls(messages)
        text = self.render(llama, messages, projector.marker)
        if self.verbose:
            logger.info("%s prompt: %s", type(self).__name__, text)
        images = [self.load_image(url) for url in urls]
        # one turn of the model from the images to the completion: another thread's call between them would move
        # the context, and the completion would refuse to go on (a stream's steps then hold the model themselves)
        with getattr(llama, "_lock", None) or contextlib.nullcontext():
            prompt = self._evaluate(llama, projector, text, images, urls)
            return complete_chat(llama, prompt, kwargs)

    @staticmethod
    def _evaluate(llama: Any, projector: Any, text: str, images: list[bytes], urls: list[str]) -> list[int]:
        """Decode the images, tokenize them with ``text`` and evaluate both into ``llama``: the prompt to
        complete."""
        bitmaps = []
        try:
            for i, (data, url) in enumerate(zip(images, urls, strict=True)):
                what = f"image {i + 1} ({_short(url)})" if not url.startswith("data:") else f"image {i + 1}"
                bitmaps.append(projector.bitmap(data, what))
            chunks = projector.tokenize(text, bitmaps)
            try:
                return list(llama.eval_chunks(projector, chunks))
            finally:
                chunks.close()
        finally:
            for b in bitmaps:
                b.close()


class MTMDChatHandler(Llava15ChatHandler):
    """Any model's own chat template (its GGUF's ``tokenizer.chat_template``) with images through the projector at
    ``clip_model_path``: an image part is rendered as a text part holding the media marker."""

    DEFAULT_SYSTEM_MESSAGE = None
    IMAGE_ROLES = None  # a text part of any message holds its marker

    def __init__(self, clip_model_path: str | os.PathLike[str], verbose: bool = True, use_gpu: bool = True,
                 local_files: bool = True) -> None:
        super().__init__(clip_model_path, verbose=verbose, use_gpu=use_gpu, local_files=local_files)

    def _get_chat_template(self, llama: Any) -> str:
        template = (getattr(llama, "metadata", None) or {}).get("tokenizer.chat_template")
        if not isinstance(template, str) or not template:
            raise ValueError(f"{type(self).__name__} requires tokenizer.chat_template metadata")
        return template

    def render(self, llama: Any, messages: list[dict[str, Any]], marker: str) -> str:
        formatter = Jinja2ChatFormatter(self._get_chat_template(llama), eos_token=_token_text(llama, llama.token_eos()),
                                        bos_token=_token_text(llama, llama.token_bos()))
        return formatter.render(_with_markers(messages, marker, None, as_text=True))


class Gemma4ChatHandler(MTMDChatHandler):
    """Gemma 4's vision models: their GGUF's chat template, as ``MTMDChatHandler``."""


class ObsidianChatHandler(Llava15ChatHandler):
    """Obsidian's ChatML with ``###`` after each message."""

    CHAT_FORMAT = (
        "{% for m in messages %}"
        "{% if m.role == 'system' %}<|im_start|>system\n{{ m.content }}\n###\n"
        "{% elif m.role == 'user' %}<|im_start|>user\n"
        "{% if m.content is string %}{{ m.content }}{% endif %}"
        "{% if m.content is iterable %}{{ images(m) }}{{ texts(m) }}{% endif %}###\n"
        "{% elif m.role == 'assistant' %}<|im_start|>assistant\n{{ m.content }}###\n"
        "{% endif %}"
        "{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )


class MoondreamChatHandler(Llava15ChatHandler):
    """moondream2's ``<image>\\n\\nQuestion: ...\\n\\nAnswer:`` (a system message is not rendered)."""

    CHAT_FORMAT = (
        "{% for m in messages %}"
        "{% if m.role == 'user' %}"
        "{% if m.content is iterable %}{{ images(m, '\\n\\n') }}{{ texts(m, 'Question: ', '\\n\\n') }}{% endif %}"
        "{% if m.content is string %}Question: {{ m.content }}\n\n{% endif %}"
        "{% elif m.role == 'assistant' %}Answer:{{ m.content }}\n\n"
        "{% endif %}"
        "{% endfor %}"
        "{% if add_generation_prompt %}Answer:{% endif %}"
    )


class Llava16ChatHandler(Llava15ChatHandler):
    """llava-1.6's prompt: each image on its own line before the text, then ``Answer:``."""

    DEFAULT_SYSTEM_MESSAGE = (
        "A chat between a curious human and an artificial intelligence assistant. The assistant gives helpful, "
        "detailed, and polite answers to the human's questions. ")
    CHAT_FORMAT = (
        "{% for m in messages %}"
        "{% if m.role == 'system' %}{{ m.content }}"
        "{% elif m.role == 'user' %}"
        "{% if m.content is iterable %}{{ images(m, '\\n') }}{{ texts(m) }}{% endif %}"
        "{% if m.content is string %}{{ m.content }}{% endif %}"
        "{% elif m.role == 'assistant' %}{{ m.content }}"
        "{% endif %}"
        "{% endfor %}"
        "{% if add_generation_prompt %}Answer:{% endif %}"
    )


class NanoLlavaChatHandler(Llava15ChatHandler):
    """nanoLLaVA's ChatML without a newline after ``<|im_end|>``."""

    DEFAULT_SYSTEM_MESSAGE = "Answer the question"
    CHAT_FORMAT = (
        "{% for m in messages %}"
        "{% if m.role == 'system' %}<|im_start|>system\n{{ m.content }}<|im_end|>"
        "{% elif m.role == 'user' %}<|im_start|>user\n"
        "{% if m.content is string %}{{ m.content }}{% endif %}"
        "{% if m.content is iterable %}{{ images(m) }}{{ texts(m) }}{% endif %}<|im_end|>"
        "{% elif m.role == 'assistant' %}<|im_start|>assistant\n{{ m.content }}<|im_end|>"
        "{% endif %}"
        "{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )


class Llama3VisionAlphaChatHandler(Llava15ChatHandler):
    """llama-3-vision-alpha's Llama 3 headers (a system message's header is left empty, as upstream's)."""

    DEFAULT_SYSTEM_MESSAGE = None
    CHAT_FORMAT = (
        "{% for m in messages %}<|start_header_id|>"
        "{% if m.role == 'user' %}user<|end_header_id|>\n\n"
        "{% if m.content is iterable %}{{ images(m) }}{{ texts(m) }}{% endif %}"
        "{% if m.content is string %}{{ m.content }}{% endif %}"
        "{% elif m.role == 'assistant' %}assistant<|end_header_id|>\n\n{{ m.content }}"
        "{% endif %}<|eot_id|>"
        "{% endfor %}"
        "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
    )


Llama3VisionAlpha = Llama3VisionAlphaChatHandler


class MiniCPMv26ChatHandler(Llava15ChatHandler):
    """MiniCPM-V 2.6's ChatML."""

    DEFAULT_SYSTEM_MESSAGE = "You are a helpful assistant."
    CHAT_FORMAT = (
        "{% for m in messages %}"
        "{% if loop.first and messages[0].role != 'system' %}"
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
        "<|im_start|>{{ m.role }}\n"
        "{% if m.content is iterable %}{{ images(m) }}{{ texts(m) }}{% endif %}"
        "{% if m.content is string %}{{ m.content }}{% endif %}<|im_end|>\n"
        "{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )


class Qwen25VLChatHandler(Llava15ChatHandler):
    """Qwen2.5-VL's ChatML, images and texts in the order of the parts (its positions are M-RoPE's)."""

    DEFAULT_SYSTEM_MESSAGE = "You are a helpful assistant."
    # (the system message is always there: DEFAULT_SYSTEM_MESSAGE is added to a chat without one)
    CHAT_FORMAT = (
        "{% for m in messages %}"
        "{% if loop.first and m.role != 'system' %}<|im_start|>system\n<|im_end|>\n{% endif %}"
        "<|im_start|>{{ m.role }}\n"
        "{% if m.content is string %}{{ m.content }}"
        "{% else %}{% for p in m.content %}"
        "{% if p.type == 'image_url' %}{{ p.image_url.url if p.image_url is mapping else p.image_url }}"
        "{% elif p.type == 'text' %}{{ p.text }}{% endif %}"
        "{% endfor %}{% endif %}<|im_end|>\n"
        "{% endfor %}"
        "<|im_start|>assistant\n"
    )


# the server's chat_format names of the vision handlers (llama-cpp-python's, which need clip_model_path)
VISION_CHAT_FORMATS: dict[str, type[Llava15ChatHandler]] = {
    "llava-1-5": Llava15ChatHandler,
    "obsidian": ObsidianChatHandler,
    "llava-1-6": Llava16ChatHandler,
    "mtmd": MTMDChatHandler,
    "gemma4": Gemma4ChatHandler,
    "moondream": MoondreamChatHandler,
    "nanollava": NanoLlavaChatHandler,
    "llama-3-vision-alpha": Llama3VisionAlphaChatHandler,
    "minicpm-v-2.6": MiniCPMv26ChatHandler,
    "qwen2.5-vl": Qwen25VLChatHandler,
}
