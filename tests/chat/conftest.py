"""Fixtures of the chat tests: a synthetic model with qwen2's chat template, and qwen2's vocabulary.

Made once per session: several test files share them."""

from __future__ import annotations

from pathlib import Path

import pytest

from pyllama_moe.tools import synth


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A synthetic GGUF: random weights, qwen2's tokenizer and chat template (copied from its vocab)."""
    return synth.write_model(tmp_path_factory.mktemp("chat") / "tiny.gguf", "tiny", seed=1)
