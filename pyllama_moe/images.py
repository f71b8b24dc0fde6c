"""What an image file says about itself, read before libmtmd decodes it: its format, its size, whether it is whole.

libmtmd decodes images with stb_image, which takes a file's stated width and height at their word: a PNG header of
60000 x 60000 pixels makes it allocate 10 GiB before it finds that the data is missing. :func:`check_image` reads the
header of the formats stb_image decodes (PNG, JPEG, GIF, BMP), bounds the size, and checks that the file ends where
its format ends, so that a truncated file, a file of another kind and a huge image are each an :class:`ImageError`
naming what is wrong, in microseconds, and never reach C. Nothing here calls C.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from pyllama_moe.errors import ImageError

# at most this many pixels (PIL's own default bound for a "decompression bomb" is 89.5 million): 8192 x 8192 RGB is
# 192 MiB once decoded, and every vision projector resizes far below it
MAX_IMAGE_PIXELS = 8192 * 8192
MAX_IMAGE_SIDE = 16384
# at most this many bytes are read of an image file or URL: an uncompressed BMP of MAX_IMAGE_PIXELS (3 bytes each,
# rows padded) fits, and nothing larger is read into memory
MAX_FILE_BYTES = 3 * MAX_IMAGE_PIXELS + 4 * MAX_IMAGE_SIDE + (1 << 20)


@dataclass(frozen=True)
class ImageInfo:
    format: str  # "png", "jpeg", "gif", "bmp"
    width: int
    height: int


def _png(data: bytes) -> tuple[int, int]:
    if len(data) < 33 or data[12:16] != b"IHDR":
        raise ImageError("a truncated PNG: its header chunk (IHDR) is incomplete")
    width, height = struct.unpack(">II", data[16:24])
    # the chunks after the header, each length + type + data + CRC, up to IEND: a file that ends before it is cut
    pos = 8
    while True:
        if pos + 8 > len(data):
            raise ImageError(f"a truncated PNG: it ends inside its chunks at byte {len(data)}, before IEND")
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        pos += 12 + length
        if pos > len(data):
            raise ImageError(f"a truncated PNG: its {kind.decode('latin-1')!r} chunk needs {pos} bytes, the file has "
                             f"{len(data)}")
        if kind == b"IEND":
            return width, height


_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def _jpeg(data: bytes) -> tuple[int, int]:
    pos = 2
    size: tuple[int, int] | None = None
    while size is None:
        while pos < len(data) and data[pos] == 0xFF:  # fill bytes before a marker
            pos += 1
        if pos + 3 > len(data):
            raise ImageError("a truncated JPEG: it ends before its frame header (SOF)")
        marker = data[pos]
        (length,) = struct.unpack(">H", data[pos + 1:pos + 3])
        if marker in _SOF:
            if pos + 8 > len(data):
                raise ImageError("a truncated JPEG: its frame header (SOF) is incomplete")
            height, width = struct.unpack(">HH", data[pos + 4:pos + 8])
            size = (width, height)
        elif marker in (0xD9, 0xDA):
            raise ImageError("not a JPEG that can be decoded: no frame header (SOF) before its image data")
        pos += 1 + length
    # entropy-coded data follows, then the end-of-image marker; trailing bytes after it are allowed
    if data.rfind(b"\xff\xd9", pos) < 0:
        raise ImageError("a truncated JPEG: no end-of-image marker (FFD9) after its data")
    return size


def _gif(data: bytes) -> tuple[int, int]:
    if len(data) < 13:
        raise ImageError("a truncated GIF: its screen descriptor is incomplete")
    if not data.rstrip(b"\x00").endswith(b";"):
        raise ImageError("a truncated GIF: no trailer (0x3B) at its end")
    width, height = struct.unpack("<HH", data[6:10])
    return width, height


def _bmp(data: bytes) -> tuple[int, int]:
    if len(data) < 26:
        raise ImageError("a truncated BMP: its header is incomplete")
    (file_size,) = struct.unpack("<I", data[2:6])
    (header_size,) = struct.unpack("<I", data[14:18])
    if header_size == 12:
        width, height = struct.unpack("<hh", data[18:22])
    else:
        width, height = struct.unpack("<ii", data[18:26])
    if file_size > len(data):
        raise ImageError(f"a truncated BMP: its header says {file_size} bytes, the file has {len(data)}")
    return width, abs(height)


_SIGNATURES = (
    (b"\x89PNG\r\n\x1a\n", "png", _png),
    (b"\xff\xd8\xff", "jpeg", _jpeg),
    (b"GIF87a", "gif", _gif),
    (b"GIF89a", "gif", _gif),
    (b"BM", "bmp", _bmp),
)


def check_image(data: bytes, what: str = "the image") -> ImageInfo:
    """The format and size of an image file's bytes; :class:`ImageError` (a ``ValueError``) naming ``what`` unless it
    is a whole PNG, JPEG, GIF or BMP of at most ``MAX_IMAGE_SIDE`` pixels a side and ``MAX_IMAGE_PIXELS`` in all."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError(f"{what}: image data must be bytes, got {type(data).__name__}")
    data = bytes(data)
    found = next(((fmt, read) for magic, fmt, read in _SIGNATURES if data.startswith(magic)), None)
    if found is None:
        head = data[:12]
        kind = "WebP (decoding it needs ffmpeg, which this build does not use)" \
            if head[:4] == b"RIFF" and head[8:12] == b"WEBP" else f"not an image (it starts with {head[:8]!r})"
        raise ImageError(f"{what} is {kind}: pass a PNG, JPEG, GIF or BMP file")
    fmt, read = found
    try:
        width, height = read(data)
    except ImageError as e:
        raise ImageError(f"{what}: {e}") from None
    if width < 1 or height < 1:
        raise ImageError(f"{what}: a {fmt.upper()} of {width} x {height} pixels has no pixels")
    if width > MAX_IMAGE_SIDE or height > MAX_IMAGE_SIDE or width * height > MAX_IMAGE_PIXELS:
        raise ImageError(f"{what}: a {fmt.upper()} of {width} x {height} pixels is larger than the limit of "
                         f"{MAX_IMAGE_SIDE} pixels a side and {MAX_IMAGE_PIXELS} in all: resize it")
    return ImageInfo(fmt, width, height)


def check_rgb(width: int, height: int, data: bytes | bytearray | memoryview) -> None:
    """Raw RGB pixels (``mtmd_bitmap_init``'s ``RGBRGB...``): ``width * height * 3`` bytes within the bounds above."""
    for name, v in (("width", width), ("height", height)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ImageError(f"an RGB image's {name} must be an integer >= 1, got {v!r}")
    if width > MAX_IMAGE_SIDE or height > MAX_IMAGE_SIDE or width * height > MAX_IMAGE_PIXELS:
        raise ImageError(f"an RGB image of {width} x {height} pixels is larger than the limit of {MAX_IMAGE_SIDE} "
                         f"pixels a side and {MAX_IMAGE_PIXELS} in all")
    n = memoryview(data).nbytes
    if n != width * height * 3:
        raise ImageError(f"an RGB image of {width} x {height} pixels has {width * height * 3} bytes, got {n}")
