"""A regression guard for issue 13 that is not timed: the calls from Python into the library per
generated token, counted through a proxy in place of ``lib``, stay constant and few."""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from pyllama_moe.ffi import lib
from pyllama_moe.llama import Llama

from fixtures.models import model_path

MAX_CALLS_PER_TOKEN = 6
SAMPLERS = {
    "greedy": {"temperature": 0},
    "typical": {"temperature": 0.8, "top_p": 0.95, "top_k": 40, "repeat_penalty": 1.1, "seed": 1},
}


class CountingLib:
    """Forwards to the compiled module and counts the calls by function name."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._real, name)
        if not callable(attr):
            return attr

        def counted(*args: Any) -> Any:
            self.calls[name] += 1
            return attr(*args)

        return counted


@pytest.fixture(scope="module")
def llm() -> Iterator[Llama]:
    with Llama(str(model_path("qwen3moe")), n_ctx=256, verbose=False) as m:
        yield m


@pytest.fixture
def counting(monkeypatch: pytest.MonkeyPatch) -> CountingLib:
    proxy = CountingLib(lib)
    patched = 0
    for name, mod in list(sys.modules.items()):
        if name.startswith("pyllama_moe") and getattr(mod, "lib", None) is lib:
            monkeypatch.setattr(mod, "lib", proxy)
            patched += 1
    assert patched >= 5  # completion, context, vocab, sampler, batch, ...
    return proxy


def _calls(llm: Llama, counting: CountingLib, n: int, stream: bool, kw: dict[str, Any]) -> Counter[str]:
    counting.calls.clear()
    out = llm("The quick brown fox", max_tokens=n, stream=stream, **kw)
    chunks = list(out) if stream else [out]
    done = sum(len(c["choices"][0]["text"]) for c in chunks)
    assert done > 0
    if not stream:
        assert out["usage"]["completion_tokens"] == n  # no early stop: the difference is n tokens' worth
    return Counter(counting.calls)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("sampler", sorted(SAMPLERS))
def test_library_calls_per_token_are_constant_and_few(llm: Llama, counting: CountingLib, sampler: str,
                                                      stream: bool) -> None:
    kw = SAMPLERS[sampler]
    llm.reset()
    a = _calls(llm, counting, 8, stream, kw)
    llm.reset()
    b = _calls(llm, counting, 16, stream, kw)
    llm.reset()
    c = _calls(llm, counting, 24, stream, kw)
    per_token_1 = {k: (b[k] - a[k]) / 8 for k in b | a}
    per_token_2 = {k: (c[k] - b[k]) / 8 for k in c | b}
    assert per_token_1 == per_token_2, "the calls per token grow with the text generated"
    assert sum(per_token_1.values()) <= MAX_CALLS_PER_TOKEN, per_token_1
    # nothing done per vocabulary entry in Python, no logits copied: the sampler chain runs in C, or greedy alone
    # reads the largest logit in place (numpy's argmax over the context's buffer, see test_sampler_greedy)
    assert "llama_get_logits" not in b
    assert per_token_1.get("llama_decode") == 1
    if sampler == "greedy":
        assert per_token_1.get("llama_get_logits_ith") == 1 and "pyllama_moe_sampler_sample" not in b
    else:
        assert per_token_1.get("pyllama_moe_sampler_sample") == 1 and "llama_get_logits_ith" not in b


def test_logprobs_copy_logits_only_when_asked(llm: Llama, counting: CountingLib) -> None:
    llm.reset()
    _calls(llm, counting, 4, False, {**SAMPLERS["typical"], "logprobs": 2})
    assert counting.calls["llama_get_logits_ith"] == 4
