"""``Vocab``: the model's vocabulary (a ``const llama_vocab *`` the model owns): tokenize, pieces, specials."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from pyllama_moe.errors import check_closed, check_tokenize, check_true, native_mark
from pyllama_moe.ffi import ffi, lib


def token_array(what: str, tokens: Any, n_vocab: int) -> np.ndarray:
    """Token ids as the batch takes them (int32), each an integer in the vocabulary: ValueError naming ``what``
    otherwise. A float, a bool or a string is not a token id (a float was cut to an integer, silently); an id past
    the vocabulary (or one that wraps around in 32 bits) would make llama.cpp read outside its tables."""
    try:
        arr = np.asarray(tokens)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{what} must be a list of integer token ids: {e}") from None
    if arr.size == 0:
        return np.zeros(0, dtype=np.intc)
    items = arr.tolist() if arr.ndim == 1 and (arr.dtype.kind not in "iu" or arr.dtype == np.uint64) else None
    if arr.ndim != 1 or (items is not None and any(isinstance(t, bool) or not isinstance(t, int) for t in items)):
        bad = next((t for t in items if isinstance(t, bool) or not isinstance(t, int)), None) if items else tokens
        raise ValueError(f"{what} must be a list of integer token ids, got {bad!r}")
    if items is not None:  # Python ints past int64
        at = next((i for i, t in enumerate(items) if not 0 <= t < n_vocab), None)
    else:
        wide = arr.astype(np.int64)
        outside = np.flatnonzero((wide < 0) | (wide >= n_vocab))
        at, items = (int(outside[0]), wide.tolist()) if len(outside) else (None, None)
    if at is not None and items is not None:
        raise ValueError(f"{what}: token {items[at]} (at {at}) is not in the model's vocabulary (0..{n_vocab - 1})")
    return arr.astype(np.intc)


class _Owner(Protocol):
    """The ``Model`` that owns the vocabulary: its ``ptr`` raises once it is closed."""

    @property
    def ptr(self) -> Any: ...


class Vocab:
    """Borrowed from its ``Model``: valid while the model is open. The model's ``close()`` closes it first, so every
    method then raises ``ClosedError`` instead of reading freed memory."""

    def __init__(self, model: _Owner) -> None:
        self._ptr: Any = None
        self._model = model
        self._ptr = lib.llama_model_get_vocab(model.ptr)
        self._buf = ffi.new("char[]", 64)
        self.n_tokens = int(lib.llama_vocab_n_tokens(self._ptr))
        # each token's piece and end-of-generation flag once read (at most n_vocab entries): generation asks for
        # both at every token, a call into the library each that the parallel slots' step makes for every slot
        self._pieces: dict[int, bytes] = {}
        self._eog: dict[int, bool] = {}
        self._max_piece: int | None = None

    @property
    def ptr(self) -> Any:
        return check_closed(self._ptr, "vocabulary (its model)")

    def close(self) -> None:
        """Forget the pointer (the model frees the vocabulary): called by ``Model.close()``."""
        self._ptr = None

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

    def fim_pre(self) -> int:
        return int(lib.llama_vocab_fim_pre(self.ptr))

    def fim_suf(self) -> int:
        return int(lib.llama_vocab_fim_suf(self.ptr))

    def fim_mid(self) -> int:
        return int(lib.llama_vocab_fim_mid(self.ptr))

    def add_bos(self) -> bool:
        return bool(lib.llama_vocab_get_add_bos(self.ptr))

    def add_eos(self) -> bool:
        return bool(lib.llama_vocab_get_add_eos(self.ptr))

    def is_eog(self, token: int) -> bool:
        ptr = self.ptr  # raises once closed, cached or not
        eog = self._eog.get(token)
        if eog is None:
            eog = bool(lib.llama_vocab_is_eog(ptr, token))
            if 0 <= token < self.n_tokens:
                self._eog[int(token)] = eog
        return eog

    def is_control(self, token: int) -> bool:
        return bool(lib.llama_vocab_is_control(self.ptr, token))

    def get_text(self, token: int) -> str:
        self._check_token(token)
        return ffi.string(lib.llama_vocab_get_text(self.ptr, token)).decode("utf-8", errors="replace")

    def _check_token(self, token: int) -> None:
        if not 0 <= token < self.n_tokens:
            raise ValueError(f"token {token} is not in the vocabulary (0..{self.n_tokens - 1})")

    def check_tokens(self, ids: Sequence[int]) -> list[int]:
        """Token ids from elsewhere (a ``tokenizer``), each checked against the vocabulary."""
        self.ptr  # noqa: B018 - raises once the model is closed
        return token_array("the tokenizer's tokens", ids, self.n_tokens).tolist()

    def tokenize(self, text: bytes, add_special: bool = True, parse_special: bool = False) -> list[int]:
        if not isinstance(text, bytes):  # cffi's own message for a bytearray or None names no argument
            hint = "text.encode('utf-8')" if isinstance(text, str) else "bytes(text)"
            raise TypeError(f"tokenize: text must be bytes (llama-cpp-python's API), got {type(text).__name__}"
                            + (f": use {hint}" if isinstance(text, (str, bytearray, memoryview)) else ""))
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

    def tokens_at_least(self, n_bytes: int) -> int:
        """A lower bound on the tokens of a text of ``n_bytes`` bytes, without tokenizing it: BPE and SPM keep every
        byte of the text in the pieces of its tokens, so there are at least ``n_bytes`` over the longest piece
        (special tokens' text included). 0 for the vocabularies that drop or merge characters (WPM, UGM, ...)."""
        if n_bytes <= 0 or lib.llama_vocab_type(self.ptr) not in (lib.LLAMA_VOCAB_TYPE_BPE, lib.LLAMA_VOCAB_TYPE_SPM):
            return 0
        if self._max_piece is None:  # read once, n_vocab calls (a tenth of a second for 150k tokens)
            self._max_piece = max((len(self.piece(t, special=True)) for t in range(self.n_tokens)), default=1)
        return -(-n_bytes // max(1, self._max_piece))

    def piece(self, token: int, special: bool = False) -> bytes:
        """One token's bytes (``llama_token_to_piece``): a call into the library the first time."""
        ptr = self.ptr  # raises once closed, cached or not
        if not special:
            piece = self._pieces.get(token)
            if piece is not None:
                return piece
        n = lib.llama_token_to_piece(ptr, token, self._buf, len(self._buf), 0, special)
        if n < 0:
            self._buf = ffi.new("char[]", -n)
            n = lib.llama_token_to_piece(ptr, token, self._buf, -n, 0, special)
        piece = ffi.unpack(self._buf, n)
        if not special and 0 <= token < self.n_tokens:
            self._pieces[int(token)] = piece
        return piece

    def detokenize(self, tokens: Sequence[int], special: bool = False) -> bytes:
        """The pieces joined, as llama-cpp-python does (a leading space after BOS is dropped)."""
        self.ptr  # noqa: B018 - raises once the model is closed
        ids = token_array("tokens", tokens, self.n_tokens).tolist()
        out = b"".join(self.piece(t, special) for t in ids)
        if ids and ids[0] == self.bos() and out[:1] == b" ":
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


class LlamaHFTokenizer(BaseLlamaTokenizer):
    """llama-cpp-python's tokenizer over a Hugging Face ``transformers`` tokenizer, for ``Llama(tokenizer=...)``
    (``from_pretrained`` needs ``transformers``). ``add_bos`` is the tokenizer's own business: ``special`` adds its
    special tokens when encoding and keeps them when decoding."""

    def __init__(self, hf_tokenizer: Any) -> None:
        self.hf_tokenizer = hf_tokenizer

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = True) -> list[int]:
        return [int(t) for t in self.hf_tokenizer.encode(text.decode("utf-8", errors="ignore"),
                                                         add_special_tokens=special)]

    def _text(self, tokens: Sequence[int], special: bool) -> bytes:
        return self.hf_tokenizer.decode(list(tokens), skip_special_tokens=not special).encode("utf-8", errors="ignore")

    def detokenize(self, tokens: Sequence[int], prev_tokens: Sequence[int] | None = None,
                   special: bool = False) -> bytes:
        """The text of ``tokens``; after ``prev_tokens``, what they add to its text (a tokenizer that merges
        across tokens, such as a byte-level BPE with a leading space, then decodes as in the whole sequence)."""
        if prev_tokens is None:
            return self._text(tokens, special)
        before = list(prev_tokens)
        return self._text(before + list(tokens), special)[len(self._text(before, special)):]

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str) -> LlamaHFTokenizer:
        try:
            from transformers import AutoTokenizer
        except ImportError as e:
            raise ImportError("LlamaHFTokenizer.from_pretrained needs transformers: pip install transformers") from e
        return cls(AutoTokenizer.from_pretrained(pretrained_model_name_or_path=pretrained_model_name_or_path))
