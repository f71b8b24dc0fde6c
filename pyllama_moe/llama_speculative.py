"""Draft models for speculative decoding (llama-cpp-python's ``llama_cpp.llama_speculative``).

``Llama(model, draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10))``: after each sampled token the draft
proposes the tokens it expects next; one decode evaluates the sampled token and the proposal together, and every
proposed token that the sampler then picks too costs no decode of its own. The sampled tokens are the ones decoding
without a draft samples (the logits of a batch may differ from those of single-token decodes in their last bits, as
in llama-cpp-python).
"""

from __future__ import annotations

import abc
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["LlamaDraftModel", "LlamaPromptLookupDecoding"]


class LlamaDraftModel(abc.ABC):
    """Proposes the tokens that follow ``input_ids`` (the prompt and the tokens generated so far)."""

    @abc.abstractmethod
    def __call__(self, input_ids: npt.NDArray[np.intc], /, **kwargs: Any) -> npt.NDArray[np.intc]:
        raise NotImplementedError


class LlamaPromptLookupDecoding(LlamaDraftModel):
    """Prompt lookup: the tokens that followed the last earlier occurrence... of the text's last n-gram.

    Looks for the longest n-gram (at most ``max_ngram_size`` tokens) that ends the input and occurs earlier in it,
    and proposes up to ``num_pred_tokens`` of the tokens after its first occurrence. Pays off where the output
    repeats the input: code being edited, a summary quoting its source.
    """

    def __init__(self, max_ngram_size: int = 2, num_pred_tokens: int = 10) -> None:
        for name, v in (("max_ngram_size", max_ngram_size), ("num_pred_tokens", num_pred_tokens)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        self.max_ngram_size = max_ngram_size
        self.num_pred_tokens = num_pred_tokens

    @staticmethod
    def find_candidate_pred_tokens(input_ids: npt.NDArray[np.intc], max_ngram_size: int,
                                   num_pred_tokens: int) -> npt.NDArray[np.intc]:
        """The proposal for ``input_ids`` (empty where no n-gram recurs)."""
        ids = np.asarray(input_ids)
        n = len(ids)
        for size in range(min(max_ngram_size, n - 1), 0, -1):
            tail = ids[n - size:]
            # every start of an earlier occurrence; the tail itself (start n - size) is excluded by the view's length
            windows = np.lib.stride_tricks.sliding_window_view(ids[: n - 1], size)
            for start in np.flatnonzero(np.all(windows == tail, axis=1)):
                after = ids[start + size: min(start + size + num_pred_tokens, n)]
                if len(after):
                    return after
        return np.array([], dtype=np.intc)

    def __call__(self, input_ids: npt.NDArray[np.intc], /, **kwargs: Any) -> npt.NDArray[np.intc]:
        return self.find_candidate_pred_tokens(input_ids, self.max_ngram_size, self.num_pred_tokens)
