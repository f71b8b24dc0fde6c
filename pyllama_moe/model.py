"""``Model``: owns one ``llama_model *``, loaded from a GGUF file."""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from pyllama_moe import backend
from pyllama_moe.errors import ModelLoadError, ModelNotFoundError, check_closed, check_ptr, check_true, native_mark
from pyllama_moe.ffi import ffi, lib
from pyllama_moe.gguf_info import GGUFInfo, split_files
from pyllama_moe.params import ModelParams, warn_once
from pyllama_moe.vocab import Vocab

GGUF_MAGIC = b"GGUF"
FINGERPRINT_SAMPLES = 16


def model_path_str(path: Any, name: str = "model_path") -> str:
    """A path given as str, bytes or os.PathLike, as a str (bytes that are not UTF-8 survive os.fsencode)."""
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise ValueError(f"{name} must be a path (str, bytes or os.PathLike), got {path!r}")
    return os.fsdecode(path)


def _check_file(path: str) -> GGUFInfo | None:
    """Clear errors before llama.cpp sees the file: missing, a folder, not a GGUF. What the header says, None where
    ggml cannot read it (llama.cpp then says why)."""
    if not os.path.exists(path):
        raise ModelNotFoundError(f"Model path does not exist: {path}")
    if not os.path.isfile(path):
        raise ModelLoadError(f"Model path is not a file: {path}")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise ModelLoadError(f"{path} is not a GGUF file (it starts with {magic!r}, not {GGUF_MAGIC!r})")
    return _check_tensor_data(path)


def _check_tensor_data(path: str) -> GGUFInfo | None:
    """The tensors' data ends where the file does (but for the alignment's padding). A tensor count one too low
    leaves the last tensor's bytes unexplained, and ggml reads every tensor a few bytes off: garbage, no error.
    Files ggml cannot read at all are left to llama.cpp, which says why."""
    try:
        info = GGUFInfo.read(path)
    except ValueError:
        return None
    extra = os.path.getsize(path) - info.data_end
    if info.n_tensors and extra >= info.alignment:
        raise ModelLoadError(f"{path}: {extra} bytes follow the data of its {info.n_tensors} tensors: the file is "
                             "corrupt (a wrong tensor count?)")
    return info


# llama.cpp's override tags by the Python type that gives them (params.ModelParams._set_kv_overrides)
_KV_TAGS = {bool: "bool", int: "int", float: "float", str: "str"}


def _warn_kv_override_types(kv: Mapping[str, Any], meta: Mapping[str, Any]) -> None:
    """llama.cpp drops an override whose type differs from the file's key (a warning in its log, silent without
    verbose): said here, with both types. Keys the file lacks are used as given, as llama.cpp does."""
    for key, value in kv.items():
        want = _KV_TAGS.get(type(meta[key])) if key in meta else None
        if want is not None and want != _KV_TAGS.get(type(value)):
            warn_once(f"kv_overrides[{key!r}]", f"kv_overrides[{key!r}]: {value!r} is of type "
                      f"{type(value).__name__}, the file's {key} of type {want}: llama.cpp ignores the override")


class _ProgressBar:
    """tqdm over the load when it is installed, verbose is on and stderr is a terminal."""

    def __init__(self) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=100, desc="loading", unit="%", file=sys.stderr, leave=False)

    def __call__(self, progress: float) -> bool:
        self.bar.update(round(progress * 100) - self.bar.n)
        return True

    def close(self) -> None:
        self.bar.close()


def _progress_bar(verbose: bool) -> _ProgressBar | None:
    if not verbose or not getattr(sys.stderr, "isatty", lambda: False)():
        return None
    try:
        return _ProgressBar()
    except ImportError:
        return None


class Model:
    """A loaded model (``llama_model_load_from_file``), freed by ``close()``."""

    def __init__(self, path: str | os.PathLike[str], params: ModelParams, *, verbose: bool = True,
                 progress: Callable[[float], bool] | None = None) -> None:
        """``progress(fraction)`` is called during the load (returning False aborts it); by default a
        progress bar when verbose on a terminal."""
        self._ptr: Any = None
        self._fingerprint: str | None = None
        self.path = model_path_str(path)
        backend.init()  # the bridge first: the checks' reads of the header log through it
        with backend.verbosity(verbose):  # a file ggml cannot read logs an error: not on stderr unless verbose
            info = _check_file(self.path)
        self.tensor_names = info.tensor_names if info is not None else ()
        if info is not None:
            _warn_kv_override_types(params.kv_given, info.meta)
        bar = _progress_bar(verbose) if progress is None else None
        fn = progress or bar
        cb = backend.callback(fn) if fn is not None else None
        if cb is not None:
            params.set_progress(cb.handle)
        mark = native_mark()
        try:
            with backend.verbosity(verbose):
                ptr = lib.llama_model_load_from_file(os.fsencode(self.path), params.ptr[0])
        finally:
            if bar is not None:
                bar.close()
        if cb is not None:
            cb.reraise()
        if cb is not None and cb.stopped:
            check_ptr(ptr, ModelLoadError, f"loading {self.path} was cancelled by the progress callback")
        self._ptr = check_ptr(ptr, ModelLoadError, f"cannot load the model {self.path}", since=mark)
        self.vocab = Vocab(self)
        bad = {k: v for k, v in params.token_overrides.items() if v >= self.vocab.n_tokens}
        if bad:
            self.close()
            k, v = next(iter(bad.items()))
            raise ValueError(f"kv_overrides[{k!r}]: token {v} is not in the model's vocabulary "
                             f"(0..{self.vocab.n_tokens - 1})")

    @property
    def ptr(self) -> Any:
        return check_closed(self._ptr, "model")

    def close(self) -> None:
        ptr, self._ptr = self._ptr, None
        if ptr is not None:
            vocab = getattr(self, "vocab", None)
            if vocab is not None:
                vocab.close()  # the model owns it: its pointer dies with the model
            lib.llama_model_free(ptr)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001  # pragma: no cover - interpreter shutdown
            pass

    @property
    def closed(self) -> bool:
        return self._ptr is None

    def fingerprint(self) -> str:
        """What tells this model from another of the same shape, for states (``LlamaState.model_id``): a hash of its
        description, sizes and metadata, and of 4 KiB read at each of 16 places spread over each of its files (a
        model whose weights differ differs there; the files are read 64 KiB each, once)."""
        self.ptr  # noqa: B018 - raises once closed
        if self._fingerprint is None:
            h = hashlib.sha256()
            h.update(repr((self.desc(), self.n_params(), self.size(), self.vocab.n_tokens, self.n_embd(),
                           self.n_layer(), sorted(self.metadata().items()))).encode("utf-8", errors="replace"))
            for name in split_files(self.path):
                size = os.path.getsize(name)
                h.update(str(size).encode())
                with open(name, "rb") as f:
                    for k in range(FINGERPRINT_SAMPLES):
                        f.seek(size * k // FINGERPRINT_SAMPLES)
                        h.update(f.read(4096))
            self._fingerprint = h.hexdigest()[:32]
        return self._fingerprint

    def n_ctx_train(self) -> int:
        return int(lib.llama_model_n_ctx_train(self.ptr))

    def n_embd(self) -> int:
        return int(lib.llama_model_n_embd(self.ptr))

    def n_layer(self) -> int:
        return int(lib.llama_model_n_layer(self.ptr))

    def arch(self) -> str:
        """``general.architecture``: the name llama.cpp writes first in a state (``llm_arch_name``)."""
        return self.metadata().get("general.architecture", "")

    def kv_bytes_per_cell(self, type_k: int, type_v: int) -> int:
        """Bytes one KV cell takes over all layers: each layer's keys and values (``n_embd_k_gqa`` /
        ``n_embd_v_gqa``: the KV heads times the head sizes, ``attention.key_length`` / ``value_length``, else
        ``n_embd / n_head``) in the cache's types. A recurrent model's state is no KV cache: 0."""
        if self.is_recurrent() or self.n_layer() == 0:  # llama_model_n_head aborts without layers (vocab_only)
            return 0
        meta, n_head = self.metadata(), int(lib.llama_model_n_head(self.ptr))
        n_head_kv = int(lib.llama_model_n_head_kv(self.ptr))
        default = self.n_embd() // n_head if n_head > 0 else 0
        attention = f"{meta.get('general.architecture', '')}.attention."  # the metadata read once

        def head(key: str) -> int:
            v = meta.get(attention + key, "")
            return int(v) if v.isdigit() else default

        def row(t: int, n: int) -> int:  # ggml_row_size, which asserts (ends the process) on a partial block
            return int(lib.ggml_type_size(t)) * n // max(1, int(lib.ggml_blck_size(t)))

        return self.n_layer() * (row(type_k, n_head_kv * head("key_length")) +
                                 row(type_v, n_head_kv * head("value_length")))

    def n_expert(self) -> int:
        """Experts per MoE layer (the metadata's ``<arch>.expert_count``), 0 for a dense model."""
        meta = self.metadata()
        try:
            return max(0, int(meta.get(f"{meta.get('general.architecture', '')}.expert_count", "0") or 0))
        except ValueError:
            return 0

    def size(self) -> int:
        return int(lib.llama_model_size(self.ptr))

    def n_params(self) -> int:
        return int(lib.llama_model_n_params(self.ptr))

    def has_encoder(self) -> bool:
        return bool(lib.llama_model_has_encoder(self.ptr))

    def is_recurrent(self) -> bool:
        return bool(lib.llama_model_is_recurrent(self.ptr))

    def is_hybrid(self) -> bool:
        return bool(lib.llama_model_is_hybrid(self.ptr))

    def desc(self) -> str:
        buf = ffi.new("char[]", 256)
        n = lib.llama_model_desc(self.ptr, buf, 256)
        return ffi.string(buf, max(n, 0)).decode("utf-8", errors="replace")

    def chat_template(self, name: str | None = None) -> str | None:
        p = lib.llama_model_chat_template(self.ptr, name.encode() if name else ffi.NULL)
        return None if p == ffi.NULL else ffi.string(p).decode("utf-8", errors="replace")

    def _meta_string(self, fn: Any, i: int) -> str:
        size = 256
        while True:
            buf = ffi.new("char[]", size)
            n = fn(self.ptr, i, buf, size)
            if n < size:  # the length, or -1 (no such entry: empty)
                return ffi.string(buf, max(n, 0)).decode("utf-8", errors="replace")
            size = n + 1

    def metadata(self) -> dict[str, str]:
        """The GGUF's scalar key/value pairs as strings (``llama_model_meta_*``), as llama-cpp-python."""
        out = {}
        for i in range(lib.llama_model_meta_count(self.ptr)):
            key = self._meta_string(lib.llama_model_meta_key_by_index, i)
            out[key] = self._meta_string(lib.llama_model_meta_val_str_by_index, i)
        return out

    # llama-cpp-python's LlamaModel accessors, for code written against ``Llama._model``
    def token_get_text(self, token: int) -> str:
        return self.vocab.get_text(token)

    def token_bos(self) -> int:
        return self.vocab.bos()

    def token_eos(self) -> int:
        return self.vocab.eos()

    def n_vocab(self) -> int:
        self.ptr  # noqa: B018 - raises once closed, as every other accessor
        return self.vocab.n_tokens


class LoraAdapter:
    """A LoRA adapter (``llama_adapter_lora_init``) on a model; freed by ``close()`` (before the model)."""

    def __init__(self, model: Model, path: str) -> None:
        self._ptr: Any = None
        if not os.path.exists(path):
            raise ValueError(f"lora_path does not exist: {path}")
        self.model = model
        mark = native_mark()
        self._ptr = check_ptr(lib.llama_adapter_lora_init(model.ptr, os.fsencode(path)), ModelLoadError,
                              f"cannot load the LoRA adapter {path}", since=mark)

    def apply(self, ctx: Any, scale: float) -> None:
        adapters = ffi.new("struct llama_adapter_lora *[1]", [check_closed(self._ptr, "LoRA adapter")])
        scales = ffi.new("float[1]", [scale])
        check_true(lib.llama_set_adapters_lora(ctx.ptr, adapters, 1, scales) == 0, ModelLoadError,
                   "cannot apply the LoRA adapter to the context")

    def close(self) -> None:
        ptr, self._ptr = self._ptr, None
        if ptr is not None and not self.model.closed:
            lib.llama_adapter_lora_free(ptr)
