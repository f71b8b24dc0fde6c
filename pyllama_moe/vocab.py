"""``Vocab``: the model's vocabulary (a ``const llama_vocab *`` the model owns): tokenize, pieces, specials."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pyllama_moe.errors import check_tokenize, check_true, native_mark
from pyllama_moe.ffi import ffi, lib

if TYPE_CHECKING:  # pragma: no cover
    from pyllama_moe.model import Model


class Vocab:
    """Borrowed from its ``Model``: valid while the model is open (``ptr`` raises after it closes)."""

    def __init__(self, model: Model) -> None:
        self._model = model
        self._ptr = lib.llama_model_get_vocab(model.ptr)
        self._buf = ffi.new("char[]", 64)
        self.n_tokens = int(lib.llama_vocab_n_tokens(self._ptr))

    @property
    def ptr(self) -> Any:
        self._model.ptr  # noqa: B018 - raises once the model is closed
        return self._ptr

    # special tokens (-1 where the model has none)
    def bos(self) -> int:
        return int(lib.llama_vocab_bos(self.ptr))

    def eos(self) -> int:
        return int(lib.llama_vocab_eos(self.ptr))

    def eot(self) -> int:
        return int(lib.llama_vocab_eot(self.ptr))

    def sep(self) -> int:
        return int(lib.llama_vocab_sep(self.ptr))

    def nl(self) -> int:
        return int(lib.llama_vocab_nl(self.ptr))

    def pad(self) -> int:
        return int(lib.llama_vocab_pad(self.ptr))

    def add_bos(self) -> bool:
        return bool(lib.llama_vocab_get_add_bos(self.ptr))

    def add_eos(self) -> bool:
        return bool(lib.llama_vocab_get_add_eos(self.ptr))

    def is_eog(self, token: int) -> bool:
        return bool(lib.llama_vocab_is_eog(self.ptr, token))

    def is_control(self, token: int) -> bool:
        return bool(lib.llama_vocab_is_control(self.ptr, token))

    def get_text(self, token: int) -> str:
        self._check_token(token)
        return ffi.string(lib.llama_vocab_get_text(self.ptr, token)).decode("utf-8", errors="replace")

    def _check_token(self, token: int) -> None:
        if not 0 <= token < self.n_tokens:
            raise ValueError(f"token {token} is not in the vocabulary (0..{self.n_tokens - 1})")

    def tokenize(self, text: bytes, add_special: bool = True, parse_special: bool = False) -> list[int]:
        if isinstance(text, str):
            raise TypeError("tokenize takes bytes (llama-cpp-python's API): use text.encode('utf-8')")
        cap = len(text) + 8
        failed = ffi.new("bool *")
        while True:
            out = ffi.new("llama_token[]", cap)
            mark = native_mark()
            # through the shim: llama_tokenize throws on bytes that are no code point (e.g. above U+10FFFF)
            n = lib.pyllama_moe_tokenize(self.ptr, text, len(text), out, cap, add_special, parse_special, failed)
            check_true(not failed[0], ValueError, "cannot tokenize the text", since=mark)
            n = check_tokenize(n, cap)
            if n >= 0:
                ids = list(ffi.unpack(out, n))
                # a tokenizer model that does not fit the file's vocabulary (e.g. rwkv over a BPE vocabulary) gives -1
                if ids and (min(ids) < 0 or max(ids) >= self.n_tokens):
                    raise ValueError("the tokenizer gave token ids outside the vocabulary: the file's "
                                     "tokenizer.ggml.model does not fit its tokens")
                return ids
            cap = -n

    def piece(self, token: int, special: bool = False) -> bytes:
        """One token's bytes (``llama_token_to_piece``): one call into the library."""
        n = lib.llama_token_to_piece(self._ptr, token, self._buf, len(self._buf), 0, special)
        if n < 0:
            self._buf = ffi.new("char[]", -n)
            n = lib.llama_token_to_piece(self._ptr, token, self._buf, -n, 0, special)
        return ffi.unpack(self._buf, n)

    def detokenize(self, tokens: Sequence[int], special: bool = False) -> bytes:
        """The pieces joined, as llama-cpp-python does (a leading space after BOS is dropped)."""
        self.ptr  # noqa: B018 - raises once the model is closed
        for t in tokens:
            self._check_token(int(t))
        out = b"".join(self.piece(int(t), special) for t in tokens)
        if tokens and int(tokens[0]) == self.bos() and out[:1] == b" ":
            out = out[1:]
        return out


class BaseLlamaTokenizer(abc.ABC):
    """llama-cpp-python's tokenizer interface: text bytes to token ids and back."""

    @abc.abstractmethod
    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = True) -> list[int]:
        raise NotImplementedError

    @abc.abstractmethod
    def detokenize(self, tokens: Sequence[int], prev_tokens: Sequence[int] | None = None,
                   special: bool = False) -> bytes:
        raise NotImplementedError


class LlamaTokenizer(BaseLlamaTokenizer):
    """llama-cpp-python's ``LlamaTokenizer`` over a ``Llama`` (``Llama.tokenizer()``)."""

    def __init__(self, llama: Any) -> None:
        self._llama = llama

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = True) -> list[int]:
        return self._llama.tokenize(text, add_bos=add_bos, special=special)

    def detokenize(self, tokens: Sequence[int], prev_tokens: Sequence[int] | None = None,
                   special: bool = False) -> bytes:
        return self._llama.detokenize(tokens, special=special)

    def encode(self, text: str, add_bos: bool = True, special: bool = True) -> list[int]:
        return self.tokenize(text.encode("utf-8", errors="ignore"), add_bos=add_bos, special=special)

    def decode(self, tokens: Sequence[int]) -> str:
        return self.detokenize(tokens).decode("utf-8", errors="ignore")
