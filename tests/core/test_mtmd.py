"""libmtmd built and bound (#71): a synthetic llama4 projector over synth's llama4 MoE, an image through it into the
text model's context on the CPU, llama-cpp-python's ``mtmd_cpp`` names, and bad images refused before C."""

from __future__ import annotations

import ctypes
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pyllama_moe import images, mtmd, mtmd_cpp
from pyllama_moe.errors import ClosedError, ImageError, MediaMismatchError, ProjectorLoadError
from pyllama_moe.llama import Llama
from pyllama_moe.tools.synth.projector import ProjectorShape, write_projector

from fixtures.images import png
from fixtures.models import model_path

N_EMBD_TEXT = 64  # synth's tiny preset


@pytest.fixture(scope="module")
def projector(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_projector(tmp_path_factory.mktemp("mmproj") / "mmproj-llama4.gguf", N_EMBD_TEXT)


@pytest.fixture(scope="module")
def llm() -> Any:
    with Llama(str(model_path("llama4")), n_ctx=512, n_batch=256, n_threads=2, verbose=False) as llm:
        yield llm


@pytest.fixture(scope="module")
def mctx(projector: Path, llm: Any) -> Any:
    ctx = mtmd.MtmdContext(projector, llm._model, use_gpu=False, n_threads=2, verbose=False)
    yield ctx
    ctx.close()


def test_projector_file_is_small_and_reproducible(tmp_path: Path) -> None:
    a = write_projector(tmp_path / "a.gguf", N_EMBD_TEXT, seed=3)
    b = write_projector(tmp_path / "b.gguf", N_EMBD_TEXT, seed=3)
    c = write_projector(tmp_path / "c.gguf", N_EMBD_TEXT, seed=4)
    assert a.read_bytes() == b.read_bytes() != c.read_bytes()
    assert a.stat().st_size < 512 * 1024
    with pytest.raises(ValueError, match="family"):
        write_projector(tmp_path / "x.gguf", N_EMBD_TEXT, family="nope")
    with pytest.raises(ValueError, match="image_size"):
        write_projector(tmp_path / "x.gguf", N_EMBD_TEXT, shape=ProjectorShape(image_size=50))


def test_context_reports_the_projector(mctx: Any) -> None:
    assert mctx.supports_vision() and not mctx.supports_audio()
    assert not mctx.uses_mrope()
    assert mctx.marker == mtmd.default_marker() == "<__media__>"


def test_image_through_the_projector_gives_finite_logits(mctx: Any, llm: Any) -> None:
    ctx = llm._ctx
    bitmap = mctx.bitmap(png(40, 40), "a PNG")
    assert (bitmap.width, bitmap.height) == (40, 40)
    assert bitmap.id is not None and len(bitmap.id) == 64  # the helper's SHA-256 of the file
    chunks = mctx.tokenize(f"Describe this: {mctx.marker} in one word.", [bitmap])
    kinds = [c.type for c in (chunks[i] for i in range(len(chunks)))]
    assert kinds == [mtmd.CHUNK_TEXT, mtmd.CHUNK_IMAGE, mtmd.CHUNK_TEXT]
    # a 40 x 40 image fits one 56-pixel tile: 16 patches, 4 tokens after the 2 x 2 pixel shuffle
    assert chunks[1].n_tokens == ProjectorShape().tokens_per_tile
    assert chunks.n_tokens() == sum(chunks[i].n_tokens for i in range(len(chunks)))
    lib_ctx = ctx.ptr
    from pyllama_moe.ffi import lib

    lib.llama_memory_clear(lib.llama_get_memory(lib_ctx), True)
    n_past = mctx.eval(ctx, chunks)
    assert n_past == chunks.n_pos()
    logits = ctx.logits_ith(-1)
    assert logits.shape == (llm.n_vocab(),) and np.isfinite(logits).all() and logits.std() > 0

    # another image gives other logits at the same place: the image reaches the text model
    lib.llama_memory_clear(lib.llama_get_memory(lib_ctx), True)
    other = mctx.tokenize(f"Describe this: {mctx.marker} in one word.", [mctx.bitmap(png(40, 40, seed=1))])
    mctx.eval(ctx, other)
    assert not np.array_equal(ctx.logits_ith(-1), logits)
    for obj in (bitmap, chunks, other):
        obj.close()
        obj.close()  # idempotent
    with pytest.raises(ClosedError):
        _ = bitmap.width


def test_large_image_is_tiled(mctx: Any) -> None:
    # llava-uhd slicing: an image wider than a tile gives the overview and its slices
    chunks = mctx.tokenize(mctx.marker, [mctx.bitmap(png(112, 56))])
    image = [chunks[i] for i in range(len(chunks)) if chunks[i].type == mtmd.CHUNK_IMAGE]
    assert sum(c.n_tokens for c in image) > ProjectorShape().tokens_per_tile


def test_raw_rgb_bitmap(mctx: Any) -> None:
    b = mtmd.Bitmap.from_rgb(8, 4, bytes(range(96)))
    assert (b.width, b.height) == (8, 4)
    chunks = mctx.tokenize(mctx.marker, [b])
    assert any(chunks[i].type == mtmd.CHUNK_IMAGE for i in range(len(chunks)))
    with pytest.raises(ImageError, match="96 bytes, got 95"):
        mtmd.Bitmap.from_rgb(8, 4, bytes(95))
    with pytest.raises(ImageError, match="larger than the limit"):
        mtmd.Bitmap.from_rgb(100_000, 1, b"")


def test_markers_and_images_must_match(mctx: Any) -> None:
    with pytest.raises(MediaMismatchError, match="2 media markers for 1 images"):
        mctx.tokenize(f"{mctx.marker} and {mctx.marker}", [mctx.bitmap(png(8, 8))])


@pytest.mark.parametrize("data,message", [
    (png(16, 16)[:-20], "truncated PNG"),
    (png(16, 16)[:30], "truncated PNG"),
    (b"hello, this is text and not an image", "not an image"),
    (b"", "not an image"),
    (b"RIFF\x00\x00\x00\x00WEBPVP8 ", "WebP"),
    # a PNG whose header says 60000 x 60000 (stb_image would allocate 10 GiB before it found the data missing)
    (png(1, 1)[:16] + struct.pack(">II", 60000, 60000) + png(1, 1)[24:], "larger than the limit"),
    (b"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
     b"\xff\xc0\x00\x11\x08\x00\x10\x00\x10\x03\x01\x22\x00\x02\x11\x01\x03\x11\x01", "truncated JPEG"),
    (b"GIF89a\x10\x00\x10\x00\x00\x00\x00", "truncated GIF"),
    (b"BM" + struct.pack("<I", 5000) + bytes(8) + struct.pack("<Iii", 40, 4, 4), "truncated BMP"),
])
def test_bad_images_are_clear_errors(mctx: Any, data: bytes, message: str) -> None:
    with pytest.raises(ImageError, match=message) as e:
        mctx.bitmap(data, "image 1")
    assert isinstance(e.value, ValueError) and "image 1" in str(e.value)


def test_corrupt_image_body_is_refused_by_the_decoder(mctx: Any) -> None:
    # a whole PNG structure whose compressed pixels are garbage: the header passes, stb_image refuses it
    good = png(16, 16)
    idat = good.index(b"IDAT")
    (n,) = struct.unpack(">I", good[idat - 4:idat])
    bad = good[:idat + 4] + bytes(n) + good[idat + 4 + n:]
    with pytest.raises(ImageError, match="decoder refused it"):
        mctx.bitmap(bad)


def test_images_module_reads_sizes() -> None:
    assert images.check_image(png(7, 5)) == images.ImageInfo("png", 7, 5)
    with pytest.raises(TypeError):
        images.check_image("a string")  # type: ignore[arg-type]


def test_projector_errors(projector: Path, llm: Any, tmp_path: Path) -> None:
    with pytest.raises(ProjectorLoadError, match="does not exist") as e:
        mtmd.MtmdContext(tmp_path / "missing.gguf", llm._model, use_gpu=False, verbose=False)
    assert isinstance(e.value, ValueError)
    wrong = write_projector(tmp_path / "wide.gguf", N_EMBD_TEXT * 2)
    with pytest.raises(ProjectorLoadError, match="mismatch between text model"):
        mtmd.MtmdContext(wrong, llm._model, use_gpu=False, verbose=False)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(projector.read_bytes()[:4000])
    with pytest.raises(ProjectorLoadError):
        mtmd.MtmdContext(cut, llm._model, use_gpu=False, verbose=False)
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"not a gguf" * 100)
    with pytest.raises(ProjectorLoadError):
        mtmd.MtmdContext(garbage, llm._model, use_gpu=False, verbose=False)


def test_mtmd_cpp_names_as_llama_cpp_python_calls_them(projector: Path, llm: Any) -> None:
    # the calls of llama-cpp-python 0.3.36's MTMDChatHandler, through our module of its name
    assert mtmd_cpp.mtmd_default_marker() == b"<__media__>"
    params = mtmd_cpp.mtmd_context_params_default()
    params.use_gpu = False
    params.n_threads = 2
    params.warmup = False
    ctx = mtmd_cpp.mtmd_init_from_file(str(projector).encode(), llm.model, params)
    assert ctx is not None
    try:
        assert mtmd_cpp.mtmd_support_vision(ctx) is True
        assert mtmd_cpp.mtmd_get_audio_bitrate(ctx) == mtmd_cpp.mtmd_get_audio_sample_rate(ctx) == -1
        data = png(24, 24)
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        wrapper = mtmd_cpp.mtmd_helper_bitmap_init_from_buf(ctx, buf, len(data), False,
                                                            mtmd_cpp.mtmd_helper_init_opt_default())
        bitmap = wrapper.bitmap
        assert mtmd_cpp.mtmd_bitmap_get_nx(bitmap) == 24
        assert len(mtmd_cpp.mtmd_bitmap_get_id(bitmap)) == 64
        chunks = mtmd_cpp.mtmd_input_chunks_init()
        prompt = b"look: <__media__> now"
        text = mtmd_cpp.mtmd_input_text(text=prompt, text_len=len(prompt), add_special=True, parse_special=True)
        bitmaps = (mtmd_cpp.mtmd_bitmap_p * 1)(bitmap)
        assert mtmd_cpp.mtmd_tokenize(ctx, chunks, mtmd_cpp.byref(text), bitmaps, 1) == 0
        n = mtmd_cpp.mtmd_input_chunks_size(chunks)
        types = [mtmd_cpp.mtmd_input_chunk_get_type(mtmd_cpp.mtmd_input_chunks_get(chunks, i)) for i in range(n)]
        assert types == [mtmd_cpp.MTMD_INPUT_CHUNK_TYPE_TEXT, mtmd_cpp.MTMD_INPUT_CHUNK_TYPE_IMAGE,
                         mtmd_cpp.MTMD_INPUT_CHUNK_TYPE_TEXT]
        n_tok = ctypes.c_size_t()
        tokens = mtmd_cpp.mtmd_input_chunk_get_tokens_text(mtmd_cpp.mtmd_input_chunks_get(chunks, 0),
                                                           ctypes.byref(n_tok))
        assert n_tok.value > 0 and tokens[0] >= 0
        llm.reset()
        from pyllama_moe import llama_cpp

        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(llm.ctx), True)
        new_n_past = llama_cpp.llama_pos(0)
        assert mtmd_cpp.mtmd_helper_eval_chunks(ctx, llm.ctx, chunks, 0, 0, 256, True,
                                                ctypes.byref(new_n_past)) == 0
        assert new_n_past.value == mtmd_cpp.mtmd_helper_get_n_pos(chunks)
        mtmd_cpp.mtmd_input_chunks_free(chunks)
        mtmd_cpp.mtmd_bitmap_free(bitmap)
    finally:
        mtmd_cpp.mtmd_free(ctx)
    with pytest.raises(AttributeError, match="mtmd.h of this build"):
        mtmd_cpp.mtmd_no_such_function  # noqa: B018


def test_synth_command_writes_a_projector_for_its_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pyllama_moe.tools.synth.cli import main

    assert main([str(tmp_path / "m.gguf"), "--arch", "llama4", "--n-embd", "96", "--n-layer", "4",
                 "--mmproj", str(tmp_path / "p.gguf"), "-q"]) == 0
    with Llama(str(tmp_path / "m.gguf"), n_ctx=256, verbose=False) as llm:
        ctx = mtmd.MtmdContext(tmp_path / "p.gguf", llm._model, use_gpu=False, verbose=False)
        assert ctx.supports_vision()  # its width is the model's 96
        ctx.close()
    assert main([str(tmp_path / "q.gguf"), "--mmproj", str(tmp_path / "q-p.gguf"), "-q"]) == 2
    assert "no projector for --arch qwen3moe" in capsys.readouterr().err
    assert not (tmp_path / "q.gguf").exists()
