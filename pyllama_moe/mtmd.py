"""libmtmd's handles, each owned and freed once: ``MtmdContext`` (a projector over a text model), ``Bitmap`` (one
image), ``InputChunks`` (a tokenized prompt of text and images; its chunks are views it owns).

A vision prompt goes: ``mctx = MtmdContext(mmproj_path, model)``; ``bitmap = mctx.bitmap(image_bytes)`` (the file's
header checked first by :func:`pyllama_moe.images.check_image`); ``chunks = mctx.tokenize(text_with_markers,
[bitmap])``; ``n_past = mctx.eval(context, chunks, n_past=0)``: the text chunks are decoded, each image is encoded by
the projector and its embeddings decoded into the text model's context. Every C result is checked in
:mod:`pyllama_moe.errors`; ``close()`` is idempotent and a closed object raises ``ClosedError``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyllama_moe import backend
from pyllama_moe.context import Context
from pyllama_moe.errors import (
    ImageError,
    ProjectorLoadError,
    check_closed,
    check_mtmd_eval,
    check_mtmd_tokenize,
    check_ptr,
    native_mark,
)
from pyllama_moe.ffi import ffi, lib
from pyllama_moe.images import ImageInfo, check_image, check_rgb
from pyllama_moe.model import Model

CHUNK_TEXT = 0
"""mtmd.h ``MTMD_INPUT_CHUNK_TYPE_TEXT``."""
CHUNK_IMAGE = 1
"""mtmd.h ``MTMD_INPUT_CHUNK_TYPE_IMAGE``."""
CHUNK_AUDIO = 2
"""mtmd.h ``MTMD_INPUT_CHUNK_TYPE_AUDIO``."""


def default_marker() -> str:
    """The text that stands for an image in a prompt (``mtmd_default_marker()``, ``<__media__>``)."""
    return ffi.string(lib.mtmd_default_marker()).decode()


class Bitmap:
    """One image's RGB pixels (``mtmd_bitmap``), freed by ``close()``. Made by :meth:`MtmdContext.bitmap` from a
    file's bytes or by :meth:`from_rgb` from raw pixels."""

    def __init__(self, ptr: Any, info: ImageInfo | None = None) -> None:
        self._ptr: Any = ptr
        self.info = info

    @classmethod
    def from_rgb(cls, width: int, height: int, data: bytes | bytearray | memoryview) -> Bitmap:
        """``mtmd_bitmap_init``: ``width * height`` pixels, 3 bytes each (RGBRGB...), row by row."""
        check_rgb(width, height, data)
        buf = ffi.from_buffer("unsigned char[]", data)
        ptr = check_ptr(lib.mtmd_bitmap_init(width, height, buf), ImageError,
                        f"cannot make a bitmap of {width} x {height} pixels")
        return cls(ptr)

    @property
    def ptr(self) -> Any:
        return check_closed(self._ptr, "bitmap")

    @property
    def width(self) -> int:
        return int(lib.mtmd_bitmap_get_nx(self.ptr))

    @property
    def height(self) -> int:
        return int(lib.mtmd_bitmap_get_ny(self.ptr))

    @property
    def id(self) -> str | None:
        """The bitmap's id (the file helper sets the SHA-256 of the file's bytes), None if it has none."""
        p = lib.mtmd_bitmap_get_id(self.ptr)
        return None if p == ffi.NULL else ffi.string(p).decode()

    def close(self) -> None:
        ptr, self._ptr = self._ptr, None
        if ptr is not None:
            lib.mtmd_bitmap_free(ptr)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001  # pragma: no cover - interpreter shutdown
            pass


@dataclass(frozen=True)
class Chunk:
    """One chunk of a tokenized prompt, read out of its ``InputChunks``: text tokens, or an image's token count."""

    type: int  # CHUNK_TEXT, CHUNK_IMAGE, CHUNK_AUDIO
    n_tokens: int
    n_pos: int
    tokens: tuple[int, ...]  # the text chunk's tokens; empty for an image
    id: str | None  # the image's id; None for text


class InputChunks:
    """A tokenized prompt (``mtmd_input_chunks``), freed by ``close()``; made by :meth:`MtmdContext.tokenize`."""

    def __init__(self) -> None:
        self._ptr: Any = None
        self._ptr = check_ptr(lib.mtmd_input_chunks_init(), MemoryError, "mtmd_input_chunks_init failed")

    @property
    def ptr(self) -> Any:
        return check_closed(self._ptr, "input chunks")

    def __len__(self) -> int:
        return int(lib.mtmd_input_chunks_size(self.ptr))

    def __getitem__(self, i: int) -> Chunk:
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"chunk {i} of {n}")
        c = lib.mtmd_input_chunks_get(self.ptr, i % n)
        kind = int(lib.mtmd_input_chunk_get_type(c))
        tokens: tuple[int, ...] = ()
        if kind == CHUNK_TEXT:
            n_tok = ffi.new("size_t *")
            p = lib.mtmd_input_chunk_get_tokens_text(c, n_tok)
            tokens = tuple(p[0:n_tok[0]]) if p != ffi.NULL else ()
        cid = lib.mtmd_input_chunk_get_id(c)
        return Chunk(kind, int(lib.mtmd_input_chunk_get_n_tokens(c)), int(lib.mtmd_input_chunk_get_n_pos(c)), tokens,
                     None if cid == ffi.NULL else ffi.string(cid).decode())

    def n_tokens(self) -> int:
        """Every chunk's tokens (``mtmd_helper_get_n_tokens``): the KV cells the prompt takes."""
        return int(lib.mtmd_helper_get_n_tokens(self.ptr))

    def n_pos(self) -> int:
        """Every chunk's positions (``mtmd_helper_get_n_pos``; fewer than the tokens for M-RoPE models)."""
        return int(lib.mtmd_helper_get_n_pos(self.ptr))

    def close(self) -> None:
        ptr, self._ptr = self._ptr, None
        if ptr is not None:
            lib.mtmd_input_chunks_free(ptr)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001  # pragma: no cover - interpreter shutdown
            pass


class MtmdContext:
    """A multimodal projector (an mmproj GGUF) over a loaded text model (``mtmd_init_from_file``), freed by
    ``close()`` before its model."""

    def __init__(self, path: str | os.PathLike[str], model: Model, *, use_gpu: bool = True, n_threads: int = 4,
                 media_marker: str | None = None, warmup: bool = False, flash_attn: bool | None = None,
                 verbose: bool = True) -> None:
        self._ptr: Any = None
        self.path = os.fspath(path)
        self.model = model  # freed after this context
        self.verbose = verbose
        if not os.path.isfile(self.path):
            raise ProjectorLoadError(f"Clip model path does not exist: {self.path}")
        backend.init()
        params = ffi.new("struct mtmd_context_params *", lib.mtmd_context_params_default())
        params.use_gpu = use_gpu
        params.print_timings = False
        params.n_threads = n_threads
        params.warmup = warmup
        if flash_attn is not None:  # None: the projector's own choice (auto)
            params.flash_attn_type = lib.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn \
                else lib.LLAMA_FLASH_ATTN_TYPE_DISABLED
        marker = None if media_marker is None else ffi.new("char[]", media_marker.encode())
        if marker is not None:
            params.media_marker = marker
        mark = native_mark()
        with backend.verbosity(verbose):
            ptr = lib.mtmd_init_from_file(os.fsencode(self.path), model.ptr, params[0])
        self._ptr = check_ptr(ptr, ProjectorLoadError, f"cannot load the projector {self.path}", since=mark)
        self.marker = ffi.string(lib.mtmd_get_marker(ptr)).decode()

    @property
    def ptr(self) -> Any:
        return check_closed(self._ptr, "projector context")

    def supports_vision(self) -> bool:
        return bool(lib.mtmd_support_vision(self.ptr))

    def supports_audio(self) -> bool:
        return bool(lib.mtmd_support_audio(self.ptr))

    def uses_mrope(self) -> bool:
        return bool(lib.mtmd_decode_use_mrope(self.ptr))

    def bitmap(self, data: bytes | bytearray | memoryview, what: str = "the image") -> Bitmap:
        """An image file's bytes (PNG, JPEG, GIF, BMP) decoded into a bitmap; :class:`ImageError` names ``what`` when
        the file is not a whole image of a size within ``images.MAX_IMAGE_PIXELS``, or the decoder refuses it."""
        info = check_image(bytes(data), what)
        buf = ffi.from_buffer("unsigned char[]", data)
        mark = native_mark()
        with backend.verbosity(self.verbose):
            wrapper = lib.mtmd_helper_bitmap_init_from_buf(self.ptr, buf, len(buf), False,
                                                           lib.mtmd_helper_init_opt_default())
        if wrapper.video_ctx != ffi.NULL:  # pragma: no cover - video needs MTMD_VIDEO, which this build leaves off
            lib.mtmd_helper_video_free(wrapper.video_ctx)
        ptr = check_ptr(wrapper.bitmap, ImageError, f"{what}: the {info.format.upper()} decoder refused it",
                        since=mark)
        return Bitmap(ptr, info)

    def tokenize(self, text: str, bitmaps: Sequence[Bitmap], *, add_special: bool = True,
                 parse_special: bool = True) -> InputChunks:
        """``text`` with one ``self.marker`` per bitmap, as chunks of text tokens and image embeddings to come."""
        n_markers = text.count(self.marker)
        if n_markers != len(bitmaps):  # b11549's mtmd_tokenize says so with 1 or 2 (as a preprocessing error)
            check_mtmd_tokenize(1, n_markers, len(bitmaps), native_mark())
        raw = text.encode()
        ctext = ffi.new("char[]", raw)
        inp = ffi.new("struct mtmd_input_text *", {"text": ctext, "text_len": len(raw), "add_special": add_special,
                                                    "parse_special": parse_special})
        ptrs = ffi.new("mtmd_bitmap *[]", [b.ptr for b in bitmaps] or [ffi.NULL])
        chunks = InputChunks()
        mark = native_mark()
        try:
            with backend.verbosity(self.verbose):
                code = lib.mtmd_tokenize(self.ptr, chunks.ptr, inp, ptrs, len(bitmaps))
            check_mtmd_tokenize(int(code), n_markers, len(bitmaps), mark)
        except BaseException:
            chunks.close()
            raise
        return chunks

    def eval(self, context: Context, chunks: InputChunks, *, n_past: int = 0, seq_id: int = 0,
             n_batch: int | None = None, logits_last: bool = True) -> int:
        """Decode ``chunks`` into ``context`` from position ``n_past`` (``mtmd_helper_eval_chunks``: text decoded,
        images encoded by the projector and their embeddings decoded); the position after them."""
        new_n_past = ffi.new("llama_pos *")
        mark = native_mark()
        with backend.verbosity(self.verbose):
            code = lib.mtmd_helper_eval_chunks(self.ptr, context.ptr, chunks.ptr, n_past, seq_id,
                                               n_batch or context.n_batch(), logits_last, new_n_past)
        check_mtmd_eval(int(code), mark)
        return int(new_n_past[0])

    def eval_chunk(self, context: Context, chunks: InputChunks, i: int, *, n_past: int, seq_id: int = 0,
                   n_batch: int | None = None, logits_last: bool = False) -> int:
        """Decode chunk ``i`` of ``chunks`` alone into ``context`` from position ``n_past``
        (``mtmd_helper_eval_chunk_single``: an image is encoded by the projector and its embeddings decoded in
        batches of ``n_batch``); the position after it."""
        n = len(chunks)
        if not 0 <= i < n:
            raise IndexError(f"chunk {i} of {n}")
        chunk = lib.mtmd_input_chunks_get(chunks.ptr, i)
        new_n_past = ffi.new("llama_pos *")
        mark = native_mark()
        with backend.verbosity(self.verbose):
            code = lib.mtmd_helper_eval_chunk_single(self.ptr, context.ptr, chunk, n_past, seq_id,
                                                     n_batch or context.n_batch(), logits_last, new_n_past)
        check_mtmd_eval(int(code), mark, "mtmd_helper_eval_chunk_single")
        return int(new_n_past[0])

    def close(self) -> None:
        ptr, self._ptr = self._ptr, None
        if ptr is not None:
            with backend.verbosity(self.verbose):
                lib.mtmd_free(ptr)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001  # pragma: no cover - interpreter shutdown
            pass
