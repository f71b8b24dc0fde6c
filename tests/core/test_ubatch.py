"""The ubatch chosen where the caller gave none (#68): the rule with its facts given (no GPU needed), then the way
``Llama`` gathers them (where the experts are, the memory a ubatch leaves) and reports the choice."""

from __future__ import annotations

import inspect
import logging
import pickle
from collections.abc import Callable
from pathlib import Path

import pytest

from pyllama_moe import backend, moe, ubatch
from pyllama_moe.gguf_info import GGUFInfo
from pyllama_moe.llama import Llama
from pyllama_moe.ubatch import UNSET, Batches, Facts, Room

MIB = 1 << 20
HOST = Facts(gpu=True, host_experts=144, n_ctx=32768, cache_bytes=0, cache_auto=False)


def rooms(fits_up_to: int, cache: Callable[[int], int] = lambda n: 0) -> tuple[list[int], Callable[[int], Room]]:
    """A device where the compute buffers of ubatches up to ``fits_up_to`` fit, and the ubatches asked about."""
    asked: list[int] = []

    def room(n: int) -> Room:
        asked.append(n)
        return Room(fits=n <= fits_up_to, cache_bytes=cache(n))
    return asked, room


def choose(facts: Facts = HOST, n_batch: int = UNSET, n_ubatch: int = UNSET, fits_up_to: int = 1 << 30,
           cache: Callable[[int], int] = lambda n: 0) -> tuple[ubatch.Choice, list[int]]:
    asked, room = rooms(fits_up_to, cache)
    return ubatch.choose(Batches.asked(n_batch, n_ubatch), facts, room), asked


def test_the_default_reads_as_llama_cpp_pythons() -> None:
    # the signature stays a drop-in: the defaults are 512, as llama-cpp-python's, and a 512 given is not the default
    params = inspect.signature(Llama).parameters
    assert params["n_batch"].default == 512 and params["n_ubatch"].default == 512
    assert repr(params["n_ubatch"].default) == "512"
    assert Batches.asked(UNSET, UNSET) == Batches(None, None)
    assert Batches.asked(512, 512) == Batches(512, 512)
    assert Batches.asked(UNSET, 512) == Batches(None, 512)
    # a pickled Llama's keywords (its __getstate__) keep the default a default
    copy = pickle.loads(pickle.dumps({"n_ubatch": UNSET}))["n_ubatch"]
    assert isinstance(copy, ubatch.Unset) and copy == 512


@pytest.mark.parametrize("value", [0, -1, 1.5, "512", True, 2**32])
def test_bad_batch_sizes_are_named(value: object) -> None:
    with pytest.raises(ValueError, match="n_ubatch must be"):
        Batches.asked(UNSET, value)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="n_batch must be"):
        Batches.asked(value, UNSET)  # type: ignore[arg-type]


def test_host_experts_get_the_target_ubatch() -> None:
    choice, asked = choose()
    assert (choice.n_batch, choice.n_ubatch, choice.chosen) == (2048, ubatch.TARGET_UBATCH, True)
    assert asked == [2048] and choice.cache_bytes is None
    assert choice.reason == "experts in host memory: ubatch 2048"


@pytest.mark.parametrize("n_ubatch", [512, 256, 4096])
def test_a_given_ubatch_is_honoured(n_ubatch: int) -> None:
    # even 512, even with the experts in host memory; nothing is measured
    choice, asked = choose(n_batch=8192, n_ubatch=n_ubatch)
    assert (choice.n_batch, choice.n_ubatch, choice.chosen, choice.reason) == (8192, n_ubatch, False, "given")
    assert asked == []


def test_a_given_ubatch_is_cut_as_llama_cpp_python_cuts_it() -> None:
    # at most n_batch (whose default stays 512) and the context
    choice, _ = choose(n_ubatch=4096)
    assert (choice.n_batch, choice.n_ubatch) == (512, 512)
    choice, _ = choose(Facts(True, 144, 1024, 0, False), n_batch=8192, n_ubatch=4096)
    assert (choice.n_batch, choice.n_ubatch) == (1024, 1024)


@pytest.mark.parametrize("facts, reason", [
    (Facts(gpu=False, host_experts=144, n_ctx=32768, cache_bytes=0, cache_auto=False), "no GPU holds layers"),
    (Facts(gpu=True, host_experts=0, n_ctx=32768, cache_bytes=0, cache_auto=False), "the experts are in device memory"),
])
def test_llama_cpp_pythons_defaults_without_host_experts_on_a_gpu(facts: Facts, reason: str) -> None:
    choice, asked = choose(facts)
    assert (choice.n_batch, choice.n_ubatch, choice.chosen) == (512, 512, False)
    assert choice.reason == f"llama-cpp-python's default: {reason}" and asked == []
    choice, _ = choose(facts, n_batch=4096)  # a given n_batch alone: llama-cpp-python's ubatch of it
    assert (choice.n_batch, choice.n_ubatch) == (4096, 512)


@pytest.mark.parametrize("n_batch, want_batch, want_ubatch", [(4096, 4096, 2048), (1024, 1024, 1024), (256, 256, 256)])
def test_a_given_n_batch_caps_the_ubatch(n_batch: int, want_batch: int, want_ubatch: int) -> None:
    choice, _ = choose(n_batch=n_batch)
    assert (choice.n_batch, choice.n_ubatch, choice.chosen) == (want_batch, want_ubatch, want_ubatch > 512)
    if n_batch == 1024:
        assert choice.reason == "experts in host memory: ubatch 1024 (n_batch=1024)"
    if n_batch == 256:
        assert choice.reason == "llama-cpp-python's default: no larger ubatch (n_batch=256)"


@pytest.mark.parametrize("n_ctx, want", [(1000, 1000), (512, 512), (64, 64), (0, 2048)])
def test_the_context_caps_the_ubatch(n_ctx: int, want: int) -> None:
    # 0: the model's context, which the load cuts the batch sizes to
    choice, _ = choose(Facts(True, 144, n_ctx, 0, False))
    assert (choice.n_batch, choice.n_ubatch, choice.chosen) == (want, want, want > 512)


def test_the_ubatch_halves_until_its_compute_buffer_fits() -> None:
    choice, asked = choose(fits_up_to=1024)
    assert (choice.n_batch, choice.n_ubatch, choice.chosen) == (1024, 1024, True) and asked == [2048, 1024]
    assert choice.reason == "experts in host memory: ubatch 1024, not 2048 (no room)"
    choice, asked = choose(fits_up_to=512)  # nothing larger fits: llama-cpp-python's, measured down to 1024 only
    assert (choice.n_batch, choice.n_ubatch, choice.chosen) == (512, 512, False) and asked == [2048, 1024]
    assert "does not fit (2048 (no room), 1024 (no room))" in choice.reason
    # a cap that is not a power of two halves from there
    choice, asked = choose(Facts(True, 144, 1500, 0, False), fits_up_to=1000)
    assert choice.n_ubatch == 750 and asked == [1500, 750]


def test_an_auto_cache_gives_way_up_to_a_quarter() -> None:
    # moe_cache_mib="auto": the cache takes what the compute buffer leaves, down to 3/4 of what it had at 512
    auto = Facts(True, 144, 32768, 8000 * MIB, cache_auto=True)
    choice, _ = choose(auto, cache=lambda n: (8000 - n // 2) * MIB)
    assert choice.n_ubatch == 2048 and choice.cache_bytes == 6976 * MIB
    assert choice.reason == ("experts in host memory: ubatch 2048; the MoE cache (auto) gave 1024 MiB to the "
                             "compute buffer")
    choice, asked = choose(auto, cache=lambda n: (8000 - 3 * n // 2) * MIB)  # 2048 would take 3072 MiB: over 25%
    assert choice.n_ubatch == 1024 and choice.cache_bytes == 6464 * MIB and asked == [2048, 1024]
    assert "not 2048 (the cache would give more than 25%)" in choice.reason
    choice, _ = choose(auto, cache=lambda n: 100 * MIB)  # no ubatch leaves it enough: the cache stays as it was
    assert (choice.n_ubatch, choice.chosen, choice.cache_bytes) == (512, False, None)
    # a cache larger than the host experts holds them all either way: it gives nothing that it uses
    roomy = Facts(True, 144, 32768, 60000 * MIB, cache_auto=True, host_expert_bytes=16000 * MIB)
    choice, _ = choose(roomy, cache=lambda n: 30000 * MIB)
    assert choice.n_ubatch == 2048 and choice.cache_bytes == 30000 * MIB
    assert choice.reason == "experts in host memory: ubatch 2048"
    # nothing left for a cache either way (0 at 512): the compute buffer only has to fit
    choice, _ = choose(Facts(True, 144, 32768, 0, cache_auto=True))
    assert choice.n_ubatch == 2048 and choice.cache_bytes == 0


def test_a_cache_of_a_given_size_does_not_give_way() -> None:
    # moe_cache_mib=N: its size is the user's; the room is measured with it and the ubatch halves instead
    choice, _ = choose(Facts(True, 144, 32768, 8000 * MIB, cache_auto=False), fits_up_to=1024,
                       cache=lambda n: 1 * MIB)
    assert choice.n_ubatch == 1024 and choice.cache_bytes is None


# how Llama gathers the facts and reports the choice


def test_host_experts_follow_the_placement(path: Path) -> None:
    from pyllama_moe.params import ModelParams

    info = GGUFInfo.read(path)
    n_layer = info.require_block_count()
    per_layer = sum(1 for t in info.tensor_names if t.startswith("blk.0.") and "_exps" in t)
    assert per_layer == 3 and n_layer == 2

    def host(**kw: object) -> int:
        ngl = kw.pop("n_gpu_layers", -1)
        return moe.host_experts(info, ModelParams(n_gpu_layers=ngl, overrides=moe.placement_overrides(**kw)))

    assert host() == 0  # every layer on the device
    assert host(cpu_moe=True) == 2 * per_layer
    assert host(n_cpu_moe=1) == per_layer
    assert host(override_tensor=r"blk\.1\.ffn_up_exps=CPU") == 1
    # n_gpu_layers counts the output layer among the last ones: n_layer leaves the first layer on the CPU
    assert host(n_gpu_layers=n_layer + 1) == 0
    assert host(n_gpu_layers=n_layer) == per_layer
    assert host(n_gpu_layers=1) == 2 * per_layer  # the output layer only
    # the first pattern that matches a tensor places it: an attention pattern first does not move the experts
    assert host(override_tensor=r"attn_q=CPU", cpu_moe=True) == 2 * per_layer


def test_the_room_is_measured_with_the_trial_ubatch_and_restored(monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
    from pyllama_moe.params import ContextParams, ModelParams

    seen: list[tuple[int, int, int]] = []

    def fake_room(_p: bytes, _mp: ModelParams, cp: ContextParams, _t: object) -> tuple[list[int], list[float]]:
        seen.append((int(cp.ptr.n_batch), int(cp.ptr.n_ubatch), int(cp.ptr.moe_cache_size)))
        return [3000 * MIB - cp.ptr.n_ubatch * MIB, 5 * MIB], [1.0, 0.0]

    monkeypatch.setattr(moe, "device_room", fake_room)
    cp = ContextParams(n_ctx=8192, n_batch=512, n_ubatch=512, moe_cache_size=700 * MIB)
    mp = ModelParams()
    r = moe.ubatch_room(str(path).encode(), mp, cp, None, cache_auto=True)(2048)
    # the trial's batch holds its ubatch; an auto cache is measured out and sized in what is left
    assert seen == [(2048, 2048, 0)] and r == Room(fits=True, cache_bytes=952 * MIB)
    assert (cp.ptr.n_batch, cp.ptr.n_ubatch, cp.ptr.moe_cache_size) == (512, 512, 700 * MIB)
    r = moe.ubatch_room(str(path).encode(), mp, cp, None, cache_auto=False)(4096)
    assert seen[-1] == (4096, 4096, 700 * MIB) and r == Room(fits=False, cache_bytes=0)


def test_device_room_measures_this_build(path: Path) -> None:
    # llama.cpp's measurement through the shim, one entry per device of the model (none on a CPU build; earlier
    # tests' RPC servers are devices too): a larger ubatch leaves no device more room
    from pyllama_moe.params import ContextParams, ModelParams

    def measure(n: int) -> tuple[list[int], list[float]]:
        return moe.device_room(str(path).encode(), ModelParams(n_gpu_layers=-1),
                               ContextParams(n_ctx=2048, n_batch=n, n_ubatch=n), None)

    left, share = measure(256)
    assert len(left) == len(share) and all(isinstance(x, int) for x in left) and all(x >= 0 for x in share)
    assert all(big <= small for small, big in zip(left, measure(2048)[0], strict=True))


def load(path: Path, monkeypatch: pytest.MonkeyPatch, fits_up_to: int, **kw: object) -> tuple[Llama, list[int]]:
    """A Llama on a GPU whose memory is faked (``device_room``): the compute buffer of ubatches up to ``fits_up_to``
    fits. The model itself loads on the CPU."""
    asked: list[int] = []

    def fake_room(_p: bytes, _mp: object, cp: object, _t: object) -> tuple[list[int], list[float]]:
        n = int(cp.ptr.n_ubatch)  # type: ignore[attr-defined]
        asked.append(n)
        return [MIB if n <= fits_up_to else -MIB], [1.0]

    monkeypatch.setattr(moe.backend, "gpu_available", lambda: True)
    monkeypatch.setattr(moe, "device_room", fake_room)
    return Llama(str(path), verbose=False, **kw), asked  # type: ignore[arg-type]


def test_llama_chooses_where_the_experts_are_in_host_memory(monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
    llm, asked = load(path, monkeypatch, 4096, n_ctx=4096, n_gpu_layers=-1, cpu_moe=True)
    with llm:
        p = llm.placement
        assert (p["n_batch"], p["n_ubatch"], p["n_ubatch_chosen"]) == (2048, 2048, True)
        assert p["n_ubatch_reason"] == "experts in host memory: ubatch 2048" and asked == [2048]
        assert llm.n_batch == 2048 and llm.context_params.n_ubatch == 2048
        assert llm("a", max_tokens=2, temperature=0)["usage"]["completion_tokens"] >= 1
    llm, asked = load(path, monkeypatch, 1024, n_ctx=4096, n_gpu_layers=-1, n_cpu_moe=1)
    with llm:
        assert (llm.placement["n_ubatch"], llm.n_batch) == (1024, 1024) and asked == [2048, 1024]


@pytest.mark.parametrize("kw, want", [
    ({"n_ubatch": 512}, (512, 512)),  # given: honoured
    ({"n_batch": 1024, "n_ubatch": 256}, (1024, 256)),
    ({"n_batch": 1024}, (1024, 1024)),  # n_batch given: the cap
    ({"cpu_moe": False}, (512, 512)),  # the experts on the device
    ({"n_gpu_layers": 0}, (512, 512)),  # no layer on the GPU (llama-cpp-python's default)
    ({"n_ctx": 256}, (256, 256)),  # the context caps it
])
def test_llama_keeps_what_is_given_or_not_for_it(monkeypatch: pytest.MonkeyPatch, path: Path, kw: dict[str, object],
                                                 want: tuple[int, int]) -> None:
    args: dict[str, object] = {"n_ctx": 4096, "n_gpu_layers": -1, "cpu_moe": True, **kw}
    llm, asked = load(path, monkeypatch, 4096, **args)
    with llm:
        p = llm.placement
        assert (p["n_batch"], p["n_ubatch"]) == want == (llm.n_batch, llm.context_params.n_ubatch)
        assert p["n_ubatch_chosen"] == (want[1] > 512)
        assert (p["n_ubatch_reason"] == "given") == ("n_ubatch" in kw)
        assert asked == ([1024] if kw == {"n_batch": 1024} else [])  # measured only where a choice is made


@pytest.mark.skipif(backend.gpu_available(), reason="the CPU-only behaviour")
def test_a_cpu_build_keeps_llama_cpp_pythons_batch_sizes(caplog: pytest.LogCaptureFixture, path: Path) -> None:
    with caplog.at_level(logging.INFO, logger="pyllama_moe"):
        llm = Llama(str(path), n_ctx=4096, n_gpu_layers=-1, cpu_moe=True, verbose=True)
    with llm:
        p = llm.placement
        assert (p["n_batch"], p["n_ubatch"], p["n_ubatch_chosen"]) == (512, 512, False)
        assert p["n_ubatch_reason"] == "llama-cpp-python's default: no GPU holds layers"
    assert any("n_ubatch_reason=llama-cpp-python's default" in r.getMessage() for r in caplog.records)


def test_pickle_chooses_again(monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
    # the default travels as the default: the unpickled Llama chooses for its own placement; a given one stays given
    llm, _ = load(path, monkeypatch, 4096, n_ctx=4096, n_gpu_layers=-1, cpu_moe=True)
    with llm, pickle.loads(pickle.dumps(llm)) as copy:
        assert copy.placement["n_ubatch"] == 2048 and copy.placement["n_ubatch_chosen"]
    llm, _ = load(path, monkeypatch, 4096, n_ctx=4096, n_gpu_layers=-1, cpu_moe=True, n_ubatch=512)
    with llm, pickle.loads(pickle.dumps(llm)) as copy:
        assert copy.placement["n_ubatch"] == 512 and copy.placement["n_ubatch_reason"] == "given"
