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


# ---------------------------------------------------------------- chat (OpenAI's chat completion shapes)

JsonType = Any  # JSON values: None, bool, int, float, str, and lists and dicts of them


class EmbeddingData(TypedDict):
    index: int
    object: str
    embedding: list[float] | list[list[float]]


class ChatCompletionRequestMessageContentPartText(TypedDict):
    type: Literal["text"]
    text: str


class ChatCompletionRequestMessageContentPartImageImageUrl(TypedDict):
    url: str
    detail: NotRequired[Literal["auto", "low", "high"]]


class ChatCompletionRequestMessageContentPartImage(TypedDict):
    type: Literal["image_url"]
    image_url: str | ChatCompletionRequestMessageContentPartImageImageUrl


ChatCompletionRequestMessageContentPart = (
    ChatCompletionRequestMessageContentPartText | ChatCompletionRequestMessageContentPartImage)


class ChatCompletionMessageToolCallFunction(TypedDict):
    name: str
    arguments: str


class ChatCompletionMessageToolCall(TypedDict):
    id: str
    type: Literal["function"]
    function: ChatCompletionMessageToolCallFunction


ChatCompletionMessageToolCalls = list[ChatCompletionMessageToolCall]


class ChatCompletionMessageToolCallChunkFunction(TypedDict):
    name: str | None
    arguments: str


class ChatCompletionMessageToolCallChunk(TypedDict):
    index: int
    id: NotRequired[str]
    type: Literal["function"]
    function: ChatCompletionMessageToolCallChunkFunction


class ChatCompletionRequestSystemMessage(TypedDict):
    role: Literal["system"]
    content: str | None


class ChatCompletionRequestUserMessage(TypedDict):
    role: Literal["user"]
    content: str | list[ChatCompletionRequestMessageContentPart] | None


class ChatCompletionRequestAssistantMessageFunctionCall(TypedDict):
    name: str
    arguments: str


class ChatCompletionRequestAssistantMessage(TypedDict):
    role: Literal["assistant"]
    content: NotRequired[str | None]
    tool_calls: NotRequired[ChatCompletionMessageToolCalls]
    function_call: NotRequired[ChatCompletionRequestAssistantMessageFunctionCall]  # deprecated by OpenAI


class ChatCompletionRequestToolMessage(TypedDict):
    role: Literal["tool"]
    content: str | None
    tool_call_id: str


class ChatCompletionRequestFunctionMessage(TypedDict):
    role: Literal["function"]
    content: str | None
    name: str


ChatCompletionRequestMessage = (
    ChatCompletionRequestSystemMessage | ChatCompletionRequestUserMessage | ChatCompletionRequestAssistantMessage
    | ChatCompletionRequestToolMessage | ChatCompletionRequestFunctionMessage)

ChatCompletionFunctionParameters = dict[str, JsonType]


class ChatCompletionFunction(TypedDict):
    name: str
    description: NotRequired[str]
    parameters: ChatCompletionFunctionParameters


ChatCompletionFunctions = ChatCompletionFunction


class ChatCompletionFunctionCallOption(TypedDict):
    name: str


ChatCompletionRequestFunctionCallOption = ChatCompletionFunctionCallOption
ChatCompletionRequestFunctionCall = Literal["none", "auto"] | ChatCompletionRequestFunctionCallOption


class ChatCompletionToolFunction(TypedDict):
    name: str
    description: NotRequired[str]
    parameters: ChatCompletionFunctionParameters


class ChatCompletionTool(TypedDict):
    type: Literal["function"]
    function: ChatCompletionToolFunction


class ChatCompletionNamedToolChoiceFunction(TypedDict):
    name: str


class ChatCompletionNamedToolChoice(TypedDict):
    type: Literal["function"]
    function: ChatCompletionNamedToolChoiceFunction


ChatCompletionToolChoiceOption = Literal["none", "auto", "required"] | ChatCompletionNamedToolChoice


class ChatCompletionRequestResponseFormat(TypedDict):
    type: Literal["text", "json_object"]
    schema: NotRequired[JsonType]


class ChatCompletionResponseFunctionCall(TypedDict):
    name: str
    arguments: str


class ChatCompletionResponseMessage(TypedDict):
    content: str | None
    tool_calls: NotRequired[ChatCompletionMessageToolCalls]
    role: Literal["assistant", "function"]
    function_call: NotRequired[ChatCompletionResponseFunctionCall]


class ChatCompletionTopLogprobToken(TypedDict):
    token: str
    logprob: float
    bytes: list[int] | None


class ChatCompletionLogprobToken(ChatCompletionTopLogprobToken):
    top_logprobs: list[ChatCompletionTopLogprobToken]


class ChatCompletionLogprobs(TypedDict):
    content: list[ChatCompletionLogprobToken] | None
    refusal: list[ChatCompletionLogprobToken] | None


class ChatCompletionResponseChoice(TypedDict):
    index: int
    message: ChatCompletionResponseMessage
    logprobs: ChatCompletionLogprobs | None
    finish_reason: str | None


class CreateChatCompletionResponse(TypedDict):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatCompletionResponseChoice]
    usage: CompletionUsage


class ChatCompletionStreamResponseDeltaEmpty(TypedDict):
    pass


class ChatCompletionStreamResponseDeltaFunctionCall(TypedDict):
    name: str
    arguments: str


class ChatCompletionStreamResponseDelta(TypedDict):
    content: NotRequired[str | None]
    function_call: NotRequired[ChatCompletionStreamResponseDeltaFunctionCall]
    tool_calls: NotRequired[list[ChatCompletionMessageToolCallChunk]]
    role: NotRequired[Literal["system", "user", "assistant", "tool"] | None]


class ChatCompletionStreamResponseChoice(TypedDict):
    index: int
    delta: ChatCompletionStreamResponseDelta | ChatCompletionStreamResponseDeltaEmpty
    finish_reason: Literal["stop", "length", "tool_calls", "function_call"] | None
    logprobs: NotRequired[ChatCompletionLogprobs | None]


class CreateChatCompletionStreamResponse(TypedDict):
    id: str
    model: str
    object: Literal["chat.completion.chunk"]
    created: int
    choices: list[ChatCompletionStreamResponseChoice]


# the older names that llama-cpp-python keeps for these shapes
ChatCompletionMessage = ChatCompletionResponseMessage
ChatCompletionChoice = ChatCompletionResponseChoice
ChatCompletion = CreateChatCompletionResponse
ChatCompletionChunkDeltaEmpty = ChatCompletionStreamResponseDeltaEmpty
ChatCompletionChunkChoice = ChatCompletionStreamResponseChoice
ChatCompletionChunkDelta = ChatCompletionStreamResponseDelta
ChatCompletionChunk = CreateChatCompletionStreamResponse
ChatCompletionStreamResponse = CreateChatCompletionStreamResponse
ChatCompletionResponseFunction = ChatCompletionFunction
ChatCompletionFunctionCall = ChatCompletionResponseFunctionCall


@dataclass
class LlamaState:
    """``Llama.save_state()``: the tokens evaluated, their logits if kept, and the context's state. ``model_id`` names
    the model that made it (its ``Model.fingerprint()``): ``load_state`` refuses a state of another model, whose bytes
    llama.cpp would take for its own when the shapes agree. None (a state made without one) is not checked.
    ``media_from`` is the first position decoded from an image's embeddings (None: all are tokens'), whose
    placeholder ids no prompt after ``load_state`` takes for the image."""

    input_ids: npt.NDArray[np.intc]
    scores: npt.NDArray[np.single]
    n_tokens: int
    llama_state: bytes
    llama_state_size: int
    seed: int
    model_id: str | None = None
    media_from: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__)
