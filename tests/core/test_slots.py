"""Parallel slots (``Llama(n_seq_max=N)``, ``submit_completion``, ``create_completions``): several completions in one
batch per step, each the text it gets alone; prefix reuse per slot; cancellation and close."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pyllama_moe import Llama
from pyllama_moe.errors import ClosedError, LlamaError


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pyllama_moe.tools import synth

    return synth.write_model(tmp_path_factory.mktemp("slots") / "tiny.gguf", "tiny", seed=5)


@pytest.fixture(scope="module")
def llm(tiny: Path) -> Iterator[Llama]:
    with Llama(str(tiny), n_ctx=1024, n_batch=64, n_ubatch=64, n_seq_max=4, verbose=False) as llm:
        yield llm


PROMPTS = [f"Request number {i}: the" for i in range(6)]


def _wait(cond: object, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.005)
    return bool(cond())  # type: ignore[operator]


def test_each_sequence_gets_its_share_of_the_context(llm: Llama) -> None:
    assert llm.n_ctx() == 256  # 1024 / 4
    with pytest.raises(ValueError, match="context window of 256"):
        llm.submit_completion([1] * 300, max_tokens=1)


def test_batched_greedy_texts_are_the_texts_alone(llm: Llama) -> None:
    alone = [llm.create_completion(p, max_tokens=12, temperature=0) for p in PROMPTS]
    assert len({a["choices"][0]["text"] for a in alone}) > 1  # different texts: a mixed-up routing shows
    together = llm.create_completions(PROMPTS, max_tokens=12, temperature=0)
    # on the CPU build the batched decode gives each sequence the very logits it gets alone
    assert [t["choices"][0]["text"] for t in together] == [a["choices"][0]["text"] for a in alone]
    assert [t["usage"] for t in together] == [a["usage"] for a in alone]
    assert [t["choices"][0]["finish_reason"] for t in together] == [a["choices"][0]["finish_reason"] for a in alone]
    stats = llm.slots.stats  # type: ignore[union-attr]
    assert stats.steps < 6 * 12  # six requests of 12 tokens shared steps


def test_streams_side_by_side_stop_strings_logprobs_and_seeds(llm: Llama) -> None:
    whole = llm.create_completion(PROMPTS[0], max_tokens=20, temperature=0)["choices"][0]["text"]
    stop = whole[4:7]
    kinds = [dict(prompt=PROMPTS[0], max_tokens=20, temperature=0, stop=[stop]),
             dict(prompt=PROMPTS[1], max_tokens=6, temperature=0, logprobs=2),
             dict(prompt=PROMPTS[2], max_tokens=8, temperature=1.0, seed=11),
             dict(prompt=PROMPTS[3], max_tokens=8, temperature=0, grammar='root ::= "yes" | "no"')]
    alone = [llm.create_completion(**k) for k in kinds]  # type: ignore[arg-type]
    jobs = [llm.submit_completion(stream=True, **k) for k in kinds]  # type: ignore[arg-type]
    for k, a, job in zip(kinds, alone, jobs, strict=True):
        chunks = list(job.chunks())
        if k["temperature"]:  # sampled: the batch's logits may round apart from alone's, and a draw go the other way
            assert chunks[-1]["choices"][0]["finish_reason"] in ("length", "stop")
            continue
        assert "".join(c["choices"][0]["text"] for c in chunks) == a["choices"][0]["text"]
        assert chunks[-1]["choices"][0]["finish_reason"] == a["choices"][0]["finish_reason"]
        if a["choices"][0]["logprobs"] is not None:
            got = [c["choices"][0]["logprobs"]["token_logprobs"][0] for c in chunks if c["choices"][0]["logprobs"]]
            assert got == pytest.approx(a["choices"][0]["logprobs"]["token_logprobs"], abs=1e-3)
    assert alone[0]["choices"][0]["text"] == whole[:whole.index(stop)]
    assert alone[3]["choices"][0]["text"] in ("yes", "no")


def test_a_slot_keeps_the_prefix_its_next_request_shares(llm: Llama) -> None:
    base = " ".join(f"w{i}" for i in range(40))
    first = llm.submit_completion(base, max_tokens=2, temperature=0).result()
    stats = llm.slots.stats  # type: ignore[union-attr]
    before = stats.prompt_tokens
    again = llm.submit_completion(base + " more", max_tokens=2, temperature=0).result()
    # only the new tail is evaluated (and at least the last prompt token, for its logits)
    assert 1 <= stats.prompt_tokens - before < 10 < first["usage"]["prompt_tokens"]
    # the same text as the prompt read from scratch in one sequence (the base alone takes two steps' chunks of
    # n_batch 64: a chunk without an output is decoded too)
    alone = llm.create_completion(base + " more", max_tokens=2, temperature=0)
    assert again["choices"][0]["text"] == alone["choices"][0]["text"]
    for prompt in (base, base + " more", base + " more"):  # the third keeps all but the last token
        got = llm.submit_completion(prompt, max_tokens=4, temperature=0, logprobs=1).result()["choices"][0]
        want = llm.create_completion(prompt, max_tokens=4, temperature=0, logprobs=1)["choices"][0]
        assert got["text"] == want["text"] and got["logprobs"] == want["logprobs"]


def test_a_cancelled_request_leaves_its_slot_at_the_next_step(llm: Llama) -> None:
    slots = llm.slots
    assert slots is not None
    job = llm.submit_completion("a", max_tokens=250, temperature=0, logprobs=20, stream=True)
    chunks = job.chunks()
    next(chunks)
    chunks.close()  # the reader leaves: the request is cancelled
    assert _wait(lambda: slots.busy == 0)
    assert len(job.completion.tokens) < 250
    assert all(s.job is None and s.sampler is None for s in slots.slots)


def test_more_requests_than_slots_wait_and_all_finish(llm: Llama) -> None:
    slots = llm.slots
    assert slots is not None
    jobs = [llm.submit_completion(p, max_tokens=4, temperature=0) for p in PROMPTS * 3]
    assert slots.queued + slots.busy <= len(jobs)
    results = [j.result() for j in jobs]
    assert all(r["usage"]["completion_tokens"] == 4 for r in results)
    assert _wait(lambda: slots.busy == 0 and slots.queued == 0)


def test_close_ends_the_requests_in_progress(tiny: Path) -> None:
    llm = Llama(str(tiny), n_ctx=512, n_batch=32, n_ubatch=32, n_seq_max=2, verbose=False)
    jobs = [llm.submit_completion("a", max_tokens=200, temperature=0, logprobs=20, stream=True) for _ in range(3)]
    first = jobs[0].chunks()
    next(first)
    closer = threading.Thread(target=llm.close)
    closer.start()
    closer.join(30)
    assert not closer.is_alive()
    with pytest.raises(LlamaError):
        list(first)
    for j in jobs[1:]:
        with pytest.raises(LlamaError):
            j.result()
    with pytest.raises(ClosedError):
        llm.submit_completion("a", max_tokens=1)


def test_the_single_request_path_between_slot_steps(llm: Llama) -> None:
    # create_completion uses sequence 0 as before: the slots find their ranges gone and start over, nothing mixes
    text = llm.create_completion(PROMPTS[4], max_tokens=8, temperature=0)["choices"][0]["text"]
    assert llm.submit_completion(PROMPTS[4], max_tokens=8, temperature=0).result()["choices"][0]["text"] == text
    assert llm.create_completion(PROMPTS[4], max_tokens=8, temperature=0)["choices"][0]["text"] == text


def sampled_texts(tiny: Path, monkeypatch: pytest.MonkeyPatch, threads: str, fail: str | None = None) -> list[Any]:
    """Four sampled requests side by side (seeded draws, each from its own chain) and a greedy one, with
    ``PYLLAMA_MOE_SAMPLE_THREADS=threads``; the texts, or the exceptions of the requests that failed. ``fail``: the
    prompt whose chain raises when it draws."""
    from pyllama_moe import slots as slots_mod
    from pyllama_moe.sampler import Sampler

    monkeypatch.setenv("PYLLAMA_MOE_SAMPLE_THREADS", threads)
    sample = Sampler.sample
    failing: set[int] = set()

    def breaks(self: Sampler, *args: Any) -> int:
        if id(self) in failing:
            raise LlamaError("this chain breaks")
        return sample(self, *args)

    monkeypatch.setattr(Sampler, "sample", breaks)
    with Llama(str(tiny), n_ctx=1024, n_batch=64, n_ubatch=64, n_seq_max=5, verbose=False) as llm:
        llm.submit_completion("warm", max_tokens=1).result()  # the slots made
        slots = llm.slots
        assert slots is not None and (slots._draws is not None) == (slots_mod.sample_threads(5) > 1)
        jobs = [llm.submit_completion(p, max_tokens=16, temperature=1.0, seed=7 + i) for i, p in enumerate(PROMPTS[:4])]
        jobs.append(llm.submit_completion(PROMPTS[4], max_tokens=16, temperature=0))
        if fail is not None:
            def chain() -> int | None:
                for s in slots.slots:
                    job, sampler = s.job, s.sampler
                    if job is not None and sampler is not None and job.completion.req.prompt_text == fail:
                        return id(sampler)
                return None

            assert _wait(lambda: chain() is not None)
            failing.add(chain() or 0)
        out: list[Any] = []
        for j in jobs:
            try:
                out.append(j.result()["choices"][0]["text"])
            except LlamaError as e:
                out.append(e)
        return out


def test_sampled_slots_draw_in_threads_what_one_thread_draws(tiny: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the native chains' draws in a pool (PYLLAMA_MOE_SAMPLE_THREADS) give each slot the token the step's thread
    # gives it: the same batches, the same logits, each chain its own output; a mix-up of outputs and chains shows
    one = sampled_texts(tiny, monkeypatch, "1")
    assert len(set(one)) == 5  # five different texts
    assert sampled_texts(tiny, monkeypatch, "4") == one


def test_a_chain_that_raises_in_the_pool_fails_its_request_only(tiny: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    got = sampled_texts(tiny, monkeypatch, "4", fail=PROMPTS[1])
    assert isinstance(got[1], LlamaError) and "breaks" in str(got[1])
    assert all(isinstance(t, str) for i, t in enumerate(got) if i != 1)


def test_sample_threads_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    from pyllama_moe.slots import sample_threads

    monkeypatch.setenv("PYLLAMA_MOE_SAMPLE_THREADS", "8")
    assert sample_threads(4) == 4 and sample_threads(16) == 8
    monkeypatch.setenv("PYLLAMA_MOE_SAMPLE_THREADS", "0")
    assert sample_threads(4) == 1  # in the step's thread
    monkeypatch.setenv("PYLLAMA_MOE_SAMPLE_THREADS", "many")
    with pytest.raises(ValueError, match="PYLLAMA_MOE_SAMPLE_THREADS"):
        sample_threads(4)


def _drained(stream: Iterator[Any]) -> tuple[int, Any]:
    """The chunks of a stream and what it returned."""
    n = 0
    while True:
        try:
            next(stream)
        except StopIteration as end:
            return n, end.value
        n += 1


def test_a_stream_returns_the_usage_of_its_whole_twin(llm: Llama) -> None:
    # streamed chunks carry no usage; the stream returns it (what the server counts its tokens by), alone, through
    # the slots and converted to chat
    kw: dict[str, Any] = {"max_tokens": 6, "temperature": 0}
    whole = llm.create_completion(PROMPTS[0], **kw)["usage"]
    assert whole["completion_tokens"] == 6
    n, usage = _drained(llm.create_completion(PROMPTS[0], stream=True, **kw))
    assert usage == whole and n > 0
    assert _drained(llm.submit_completion(PROMPTS[0], stream=True, **kw).chunks())[1] == whole
    chat = [{"role": "user", "content": "Say hi"}]
    whole_chat = llm.create_chat_completion(chat, **kw)["usage"]
    assert _drained(iter(llm.create_chat_completion(chat, stream=True, **kw)))[1] == whole_chat
