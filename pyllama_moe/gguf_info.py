"""``GGUFInfo.read(path)``: what a GGUF file says, read once (llama.cpp's ``common_get_gguf_info``).

The header only (ggml's ``gguf_init_from_file`` with ``no_alloc``): the architecture and the counts the
placement needs, the bytes of the expert tensors, where the tensors' data ends, and the parts of a split model.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from pyllama_moe.ffi import ffi, lib

# common/common.h: LLM_FFN_EXPS_REGEX, the expert tensors --cpu-moe keeps in host memory
FFN_EXPS_REGEX = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"
_SPLIT = re.compile(r"(.*)-(\d{5})-of-(\d{5})\.gguf")


@dataclass(frozen=True)
class GGUFInfo:
    path: str
    arch: str
    block_count: int | None  # {arch}.block_count
    expert_count: int | None  # {arch}.expert_count (None or 0: a dense model)
    n_tensors: int
    expert_bytes: int  # the expert matrices of this file (``*_exps.weight``: what the MoE cache holds)
    data_end: int  # where the last tensor's data ends, from the file's start
    alignment: int
    files: tuple[str, ...]  # the parts of a split model (``*-00001-of-000NN.gguf``) that exist, else the file
    meta: dict[str, Any]  # the scalar keys (numbers, booleans, strings; arrays are left out)
    tensor_names: tuple[str, ...] = ()  # in the file's order (what override_tensor's patterns are matched with)

    @classmethod
    def read(cls, path: str | bytes | os.PathLike[str]) -> GGUFInfo:
        """Raises ValueError if ggml cannot read the file's header."""
        name = os.fsdecode(path)
        params = ffi.new("struct gguf_init_params *", {"no_alloc": True, "ctx": ffi.NULL})
        ctx = lib.gguf_init_from_file(os.fsencode(path), params[0])
        if ctx == ffi.NULL:
            raise ValueError(f"{name} is not a readable GGUF file")
        try:
            meta = _scalars(ctx)
            arch = meta.get("general.architecture")
            arch = arch if isinstance(arch, str) else ""
            n = int(lib.gguf_get_n_tensors(ctx))
            sizes = [(ffi.string(lib.gguf_get_tensor_name(ctx, i)).decode(errors="replace"),
                      int(lib.gguf_get_tensor_offset(ctx, i)), int(lib.gguf_get_tensor_size(ctx, i)))
                     for i in range(n)]
            exps = re.compile(FFN_EXPS_REGEX + r"\.weight$")
            return cls(
                path=name, arch=arch, block_count=_count(meta, f"{arch}.block_count"),
                expert_count=_count(meta, f"{arch}.expert_count"), n_tensors=n,
                expert_bytes=sum(size for t, _, size in sizes if exps.search(t)),
                data_end=int(lib.gguf_get_data_offset(ctx)) + max((off + size for _, off, size in sizes), default=0),
                alignment=int(lib.gguf_get_alignment(ctx)), files=split_files(name), meta=meta,
                tensor_names=tuple(t for t, _, _ in sizes))
        finally:
            lib.gguf_free(ctx)

    @property
    def files_size(self) -> int:
        """Bytes of the model's files (all parts of a split model)."""
        return sum(os.path.getsize(f) for f in self.files)

    def require_block_count(self) -> int:
        if self.block_count is None:
            raise ValueError(f"{self.path} has no block_count")
        return self.block_count


# gguf_type -> the getter of its scalar value
_GETTERS = {
    "UINT8": "u8", "INT8": "i8", "UINT16": "u16", "INT16": "i16", "UINT32": "u32", "INT32": "i32",
    "FLOAT32": "f32", "BOOL": "bool", "UINT64": "u64", "INT64": "i64", "FLOAT64": "f64",
}


def _scalars(ctx: Any) -> dict[str, Any]:
    getters = {int(getattr(lib, f"GGUF_TYPE_{t}")): getattr(lib, f"gguf_get_val_{g}") for t, g in _GETTERS.items()}
    out: dict[str, Any] = {}
    for k in range(int(lib.gguf_get_n_kv(ctx))):
        key = ffi.string(lib.gguf_get_key(ctx, k)).decode(errors="replace")
        t = int(lib.gguf_get_kv_type(ctx, k))
        if t == lib.GGUF_TYPE_STRING:
            out[key] = ffi.string(lib.gguf_get_val_str(ctx, k)).decode(errors="replace")
        elif t in getters:
            v = getters[t](ctx, k)
            out[key] = bool(v) if t == lib.GGUF_TYPE_BOOL else v
    return out


def _count(meta: dict[str, Any], key: str) -> int | None:
    v = meta.get(key)
    return int(v) if isinstance(v, int) and not isinstance(v, bool) else None


def split_files(path: str) -> tuple[str, ...]:
    """The parts of a split model named ``*-00001-of-000NN.gguf`` that exist; any other path alone."""
    m = _SPLIT.fullmatch(path)
    if not m:
        return (path,)
    n = int(m.group(3))
    names = (f"{m.group(1)}-{i:05d}-of-{n:05d}.gguf" for i in range(1, n + 1))
    return tuple(f for f in names if os.path.exists(f))
