"""Fixtures of the chat tests: a synthetic model with qwen2's chat template, and qwen2's vocabulary.

Made once per session: several test files share them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pyllama_moe.ffi import lib
from pyllama_moe.tools import synth

from fixtures.chat import load_vocab_only


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A synthetic GGUF: random weights, qwen2's tokenizer and chat template (copied from its vocab)."""
    return synth.write_model(tmp_path_factory.mktemp("chat") / "tiny.gguf", "tiny", seed=1)


@pytest.fixture(scope="session")
def vocab() -> Iterator[Any]:
    model = load_vocab_only(synth.default_vocab_path())
    try:
        yield lib.llama_model_get_vocab(model)
    finally:
        lib.llama_model_free(model)
