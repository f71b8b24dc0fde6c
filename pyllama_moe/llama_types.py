"""The OpenAI-shaped results of llama-cpp-python (``llama_types.py``), its processor lists and ``LlamaState``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, NotRequired, TypedDict

import numpy as np
import numpy.typing as npt

try:
    from typing import NotRequired
except ImportError:  # pragma: no cover - Python < 3.11
    from typing import NotRequired


class EmbeddingUsage(TypedDict):
    prompt_tokens: int
    total_tokens: int


class Embedding(TypedDict):
    index: int
    object: str
    embedding: list[float] | list[list[float]]


class CreateEmbeddingResponse(TypedDict):
    object: Literal["list"]
    model: str
    data: list[Embedding]
    usage: EmbeddingUsage


class CompletionLogprobs(TypedDict):
    text_offset: list[int]
    token_logprobs: list[float | None]
    tokens: list[str]
    top_logprobs: list[dict[str, float] | None]


class CompletionChoice(TypedDict):
    text: str
    index: int
    logprobs: CompletionLogprobs | None
    finish_reason: Literal["stop", "length"] | None


class CompletionUsage(TypedDict):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CreateCompletionResponse(TypedDict):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: NotRequired[CompletionUsage]


CreateCompletionStreamResponse = CreateCompletionResponse
Completion = CreateCompletionResponse
CompletionChunk = CreateCompletionResponse


# llama-cpp-python's processors: called with (input_ids, scores) of the current step
LogitsProcessor = Callable[[npt.NDArray[np.intc], npt.NDArray[np.single]], npt.NDArray[np.single]]
StoppingCriteria = Callable[[npt.NDArray[np.intc], npt.NDArray[np.single]], bool]


class LogitsProcessorList(list):  # type: ignore[type-arg]
    def __call__(self, input_ids: npt.NDArray[np.intc], scores: npt.NDArray[np.single]) -> npt.NDArray[np.single]:
        for processor in self:
            scores = processor(input_ids, scores)
        return scores


class StoppingCriteriaList(list):  # type: ignore[type-arg]
    def __call__(self, input_ids: npt.NDArray[np.intc], logits: npt.NDArray[np.single]) -> bool:
        return any(criteria(input_ids, logits) for criteria in self)


@dataclass
class LlamaState:
    """``Llama.save_state()``: the tokens evaluated, their logits if kept, and the context's state."""

    input_ids: npt.NDArray[np.intc]
    scores: npt.NDArray[np.single]
    n_tokens: int
    llama_state: bytes
    llama_state_size: int
    seed: int

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__)
