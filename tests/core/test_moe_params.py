"""The MoE and placement keywords reach the C parameters, and the library acts on them (its log)."""

from __future__ import annotations

import dataclasses
import logging
import re
from pathlib import Path

import pytest

from pyllama_moe import backend, moe
from pyllama_moe.ffi import lib
from pyllama_moe.gguf_info import GGUFInfo
from pyllama_moe.llama import Llama

from fixtures.native import context_fields

OVERRIDDEN = re.compile(r"tensor (\S+) \(.*\) buffer type overridden to (\S+)")


def load_log(caplog: pytest.LogCaptureFixture, path: Path, **kw: object) -> tuple[list[str], Llama]:
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="pyllama_moe"):
        llm = Llama(str(path), n_ctx=64, verbose=True, **kw)
    return [r.getMessage() for r in caplog.records], llm


def overridden(lines: list[str]) -> dict[str, str]:
    return {m.group(1): m.group(2) for m in map(OVERRIDDEN.search, lines) if m}


def patterns(llm: Llama) -> list[str]:
    return llm.model_params.override_patterns()


EXPERTS = {f"blk.{il}.ffn_{w}_exps.weight" for il in (0, 1) for w in ("up", "down", "gate")}


def test_cpu_moe(caplog: pytest.LogCaptureFixture, path: Path) -> None:
    lines, llm = load_log(caplog, path, cpu_moe=True)
    with llm:
        assert patterns(llm) == [r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"]  # common's LLM_FFN_EXPS_REGEX
        assert llm.model_params.ptr.tensor_buft_overrides[0].buft == lib.ggml_backend_cpu_buffer_type()
    assert set(overridden(lines)) == EXPERTS


def test_n_cpu_moe(caplog: pytest.LogCaptureFixture, path: Path) -> None:
    lines, llm = load_log(caplog, path, n_cpu_moe=1)
    with llm:
        assert patterns(llm) == [r"blk\.0\.ffn_(up|down|gate|gate_up)_(ch|)exps"]
    assert set(overridden(lines)) == {t for t in EXPERTS if t.startswith("blk.0.")}


@pytest.mark.parametrize("value", [r"blk\.1\.ffn_up_exps=CPU", {r"blk\.1\.ffn_up_exps": "CPU"}])
def test_override_tensor(caplog: pytest.LogCaptureFixture, path: Path, value: object) -> None:
    lines, llm = load_log(caplog, path, override_tensor=value)
    llm.close()
    # to CPU, the loader may pick the CPU's repacking buffer type (q4_0 on x86)
    assert list(overridden(lines)) == ["blk.1.ffn_up_exps.weight"]
    assert overridden(lines)["blk.1.ffn_up_exps.weight"] in ("CPU", "CPU_REPACK")


def test_override_order_explicit_first(path: Path) -> None:
    with Llama(str(path), n_ctx=64, verbose=False, override_tensor=r"attn_q=CPU,attn_k=CPU", cpu_moe=True,
               n_cpu_moe=2) as llm:
        assert patterns(llm) == ["attn_q", "attn_k", moe.FFN_EXPS_REGEX, moe.block_regex(0), moe.block_regex(1)]


def test_pickle_keeps_the_moe_keywords(path: Path) -> None:
    import pickle

    with Llama(str(path), n_ctx=64, verbose=False, n_cpu_moe=1, override_tensor={"attn_q": "CPU"},
               load_mode="none") as llm:
        with pickle.loads(pickle.dumps(llm)) as copy:
            assert patterns(copy) == patterns(llm) == ["attn_q", moe.block_regex(0)]
            assert copy.model_params.load_mode == lib.LLAMA_LOAD_MODE_NONE


@pytest.mark.parametrize("value, match", [
    ("blk=NOPE", r"unknown buffer type 'NOPE'; known: .*CPU"),
    ("blk", "expected pattern=BUFFER_TYPE"),
    ("(unclosed=CPU", "not a valid regular expression"),
    ({"": "CPU"}, "non-empty string"),
    (42, "override_tensor must be"),
])
def test_override_tensor_errors(path: Path, value: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Llama(str(path), override_tensor=value, verbose=False)


@pytest.mark.parametrize("mode, buffer", [("none", "CPU"), ("mmap", "CPU_Mapped")])
def test_load_mode(caplog: pytest.LogCaptureFixture, path: Path, mode: str, buffer: str) -> None:
    lines, llm = load_log(caplog, path, load_mode=mode)
    llm.close()
    assert any(f"(load_mode = {mode})" in line for line in lines)
    sizes = [line.split("model buffer size")[0].split()[-1] for line in lines if "model buffer size" in line]
    assert buffer in sizes and (buffer == "CPU_Mapped") == ("CPU_Mapped" in sizes)


def test_use_mmap_false_is_load_mode_none(caplog: pytest.LogCaptureFixture, path: Path) -> None:
    lines, llm = load_log(caplog, path, use_mmap=False)
    llm.close()
    assert any("(load_mode = none)" in line for line in lines)


@pytest.mark.parametrize("kw, match", [
    ({"load_mode": "fast"}, "load_mode must be one of"),
    ({"load_mode": "mmap", "use_mmap": False}, "load_mode replaces use_mmap"),
    ({"cpu_moe": "yes"}, "cpu_moe must be True or False"),
    ({"n_cpu_moe": -1}, "n_cpu_moe must be in"),
    ({"moe_cache_mib": -5}, "moe_cache_mib must be in"),
    ({"moe_cache_mib": 1.5}, "moe_cache_mib must be an integer"),
    ({"fit": "yes"}, "fit must be True or False"),
    ({"moe_cache_predict": -1}, "moe_cache_predict must be in"),
    ({"moe_cache_predict": "2"}, "moe_cache_predict must be an integer"),
    ({"moe_cache_predict_depth": 0}, "moe_cache_predict_depth must be in"),
    ({"moe_cache_predict_depth": 9}, "moe_cache_predict_depth must be in"),
    # only False, True and "auto": no word or number that reads as true
    ({"moe_hybrid": "on"}, "moe_hybrid must be False, True or 'auto', got 'on'"),
    ({"moe_hybrid": "AUTO"}, "moe_hybrid must be False, True or 'auto'"),
    ({"moe_hybrid": "true"}, "moe_hybrid must be False, True or 'auto'"),
    ({"moe_hybrid": 1}, "moe_hybrid must be False, True or 'auto', got 1"),
    ({"moe_hybrid": 2}, "moe_hybrid must be False, True or 'auto'"),
    ({"moe_hybrid": 0}, "moe_hybrid must be False, True or 'auto'"),
    ({"moe_hybrid": 0.5}, "moe_hybrid must be False, True or 'auto'"),
])
def test_bad_moe_values(path: Path, kw: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Llama(str(path), verbose=False, **kw)  # type: ignore[arg-type]


@pytest.mark.skipif(backend.gpu_available(), reason="the CPU-only behaviour")
def test_moe_cache_without_gpu_warns_and_runs(caplog: pytest.LogCaptureFixture, path: Path) -> None:
    with caplog.at_level(logging.WARNING, logger="pyllama_moe"):
        llm = Llama(str(path), n_ctx=64, moe_cache_mib=64, cpu_moe=True, verbose=False)
    with llm:
        assert llm.context_params.ptr.moe_cache_size == 0
        assert llm("a", max_tokens=2, temperature=0)["usage"]["completion_tokens"] >= 1
    assert any("moe_cache_mib=64 ignored" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("how", ["field", "dry run"])
def test_moe_cache_on_the_cpu_standing_for_the_device(monkeypatch: pytest.MonkeyPatch, path: Path, how: str) -> None:
    # the context field moe_cache_cpu (tests), or PYLLAMA_MOE_CACHE_CPU=1 (a dry run, which sets it): Llama keeps the
    # cache, with the experts in plain host buffers
    if how == "field":
        context_fields(monkeypatch, moe_cache_cpu=True)
    else:
        monkeypatch.setenv("PYLLAMA_MOE_CACHE_CPU", "1")
    with Llama(str(path), n_ctx=64, moe_cache_mib=1, cpu_moe=True, verbose=False) as llm:
        assert llm.context_params.ptr.moe_cache_cpu
        assert llm.context_params.ptr.moe_cache_size == 1 << 20
        assert not llm.model_params.ptr.use_extra_bufts
        assert llm("a", max_tokens=4, temperature=0)["usage"]["completion_tokens"] >= 1
        stats = llm.moe_cache_stats()
        assert stats is not None and sum(stats.hits("device")) > 0


def test_fit_runs(path: Path) -> None:
    with Llama(str(path), n_ctx=64, fit=True, fit_target_mib=256, moe_cache_mib="auto", verbose=False) as llm:
        assert llm("a", max_tokens=2, temperature=0)["usage"]["completion_tokens"] >= 1
        if not backend.gpu_available():
            assert llm.context_params.ptr.moe_cache_size == 0


def test_fit_leaves_user_placement_alone(path: Path) -> None:
    # upstream's fit changes only what the user left at the defaults (here the overrides stay)
    with Llama(str(path), n_ctx=64, fit=True, cpu_moe=True, verbose=False) as llm:
        assert patterns(llm) == [moe.FFN_EXPS_REGEX]
        assert llm("a", max_tokens=1)["usage"]["completion_tokens"] <= 1
    with Llama(str(path), n_ctx=0, fit=True, verbose=False) as llm:  # n_ctx=0: the fit chooses it
        assert llm.n_ctx() >= 256


@pytest.mark.parametrize("case", ["fits", "spills", "fails", "neither", "user-fixed", "dense"])
def test_fit_with_cache_chooses_layers_or_cache(monkeypatch: pytest.MonkeyPatch, path: Path, case: str) -> None:
    # fit=True, moe_cache_mib="auto" (#9): the layered fit first; if it sends weights of a MoE model to host memory
    # (or finds nothing), every expert goes to host memory and the cache takes what is left, unless that does not
    # fit either; a placement the user fixed keeps its layers. The fit is faked like upstream's: it fits what it
    # was left (layers, overrides, a shorter context) and only checks a placement given with overrides
    from pyllama_moe.params import ContextParams, ModelParams

    n_layer = GGUFInfo.read(path).require_block_count()
    cpu = lib.ggml_backend_cpu_buffer_type()
    default_ngl = lib.llama_model_default_params().n_gpu_layers
    calls: list[tuple[list[str], int]] = []

    def fake_fit(_path: bytes, mp: ModelParams, cp: ContextParams, _target: object, _verbose: bool) -> bool:
        calls.append((mp.override_patterns(), int(cp.ptr.n_ctx)))
        if mp.override_patterns() or mp.ptr.n_gpu_layers != default_ngl:  # given: only checked
            return case != "neither"
        if case == "fits":
            return True  # fits as it is: nothing changes
        if case == "fails":
            return False
        mp.ptr.n_gpu_layers = n_layer + 1  # all layers, the experts of the last one in host memory
        mp.set_overrides([(moe.block_regex(n_layer - 1).encode(), cpu)])
        cp.ptr.n_ctx = 32
        return True

    sized: list[list[str]] = []
    monkeypatch.setattr(moe, "fit", fake_fit)
    monkeypatch.setattr(moe, "auto_cache_size",
                        lambda _p, mp, _cp, _t: sized.append(mp.override_patterns()) or 123 << 20)
    monkeypatch.setattr(moe.backend, "gpu_available", lambda: True)
    if case == "dense":  # the file as it is, but for its expert count
        real = moe.GGUFInfo.read
        monkeypatch.setattr(moe.GGUFInfo, "read", lambda p: dataclasses.replace(real(p), expert_count=None))
    user = moe.placement_overrides(cpu_moe=True) if case == "user-fixed" else ()
    mp = ModelParams(n_gpu_layers=default_ngl, overrides=user)
    cp = ContextParams(n_ctx=64, n_batch=64, n_ubatch=64)
    size = moe.fit_with_cache(str(path).encode(), mp, cp, None, False)
    spilled = [moe.block_regex(n_layer - 1)]
    if case == "fits":
        assert size == 0 and calls == [([], 64)] and sized == [] and mp.override_patterns() == []
    elif case == "user-fixed":  # fitted as given, its experts stay in host memory: the cache gets what is left
        assert size == 123 << 20 and calls == [([moe.FFN_EXPS_REGEX], 64)] and sized == [[moe.FFN_EXPS_REGEX]]
    elif case in ("dense", "neither"):  # the layered placement stays, with its context (a dense model: no cache)
        assert calls == [([], 64)] + ([([moe.FFN_EXPS_REGEX], 64)] if case == "neither" else [])
        assert (size, sized) == ((0, []) if case == "dense" else (123 << 20, [spilled]))
        assert mp.override_patterns() == spilled and cp.ptr.n_ctx == 32 and mp.ptr.n_gpu_layers == n_layer + 1
    else:  # every expert in host memory, checked from the parameters as they were, then the cache
        assert size == 123 << 20 and calls == [([], 64), ([moe.FFN_EXPS_REGEX], 64)]
        assert sized == [[moe.FFN_EXPS_REGEX]] and mp.override_patterns() == [moe.FFN_EXPS_REGEX]
        assert mp.ptr.n_gpu_layers == default_ngl and cp.ptr.n_ctx == 64


def test_cache_total_gives_no_device_more_than_it_has_left() -> None:
    # llama.cpp splits the cache among the devices by their share: the total is what the tightest device allows
    assert moe.cache_total([6 << 20], [5.0]) == 6 << 20  # one GPU: what it has left
    assert moe.cache_total([10, 10], [1.0, 1.0]) == 20
    assert moe.cache_total([10, 4], [1.0, 1.0]) == 8  # the second device limits both halves
    assert moe.cache_total([30, 10], [3.0, 1.0]) == 40
    assert moe.cache_total([10, 0], [1.0, 1.0]) == 0  # a device with a share and nothing left: no cache
    assert moe.cache_total([10, 0], [1.0, 0.0]) == 10  # a device without layers takes no share
    assert moe.cache_total([], []) == 0 and moe.cache_total([5], [0.0]) == 0


@pytest.mark.gpu
def test_moe_cache_on_gpu(caplog: pytest.LogCaptureFixture, path: Path) -> None:
    with caplog.at_level(logging.INFO, logger="pyllama_moe"):
        llm = Llama(str(path), n_ctx=256, n_gpu_layers=-1, cpu_moe=True, load_mode="none", moe_cache_mib=16,
                    verbose=True)
    with llm:
        assert llm.context_params.ptr.moe_cache_size == 16 << 20
        assert llm("The quick brown fox", max_tokens=8, temperature=0)["usage"]["completion_tokens"] >= 1
    # upstream logs the cache's size when it is created ("CUDA0 MoE cache size = ...")
    assert any("MoE cache size" in r.getMessage() for r in caplog.records)


def test_cache_loads_without_mmap_when_the_model_fits(monkeypatch: pytest.MonkeyPatch, path: Path,
                                                      tmp_path: Path) -> None:
    from pyllama_moe.params import ModelParams

    size = moe.model_files_size(str(path))
    assert size == path.stat().st_size
    mp = ModelParams()
    assert mp.ptr.load_mode == lib.LLAMA_LOAD_MODE_AUTO
    assert not moe.cache_load_mode(str(path), mp, 0)  # no cache: nothing changes
    monkeypatch.setattr(moe, "available_memory", lambda: size)  # the model would take 100%: keeps mmap
    assert not moe.cache_load_mode(str(path), mp, 1 << 20) and mp.ptr.load_mode == lib.LLAMA_LOAD_MODE_AUTO
    monkeypatch.setattr(moe, "available_memory", lambda: 2 * size)
    monkeypatch.setenv("LLAMA_MOE_CACHE_DEVICE", "0")  # the device lookup's switch restores llama.cpp's choice
    assert not moe.cache_load_mode(str(path), mp, 1 << 20) and mp.ptr.load_mode == lib.LLAMA_LOAD_MODE_AUTO
    monkeypatch.delenv("LLAMA_MOE_CACHE_DEVICE")
    assert moe.cache_load_mode(str(path), mp, 1 << 20) and mp.ptr.load_mode == lib.LLAMA_LOAD_MODE_NONE
    chosen = ModelParams(load_mode=lib.LLAMA_LOAD_MODE_MMAP)  # a mode the user chose is kept
    assert not moe.cache_load_mode(str(path), chosen, 1 << 20) and chosen.ptr.load_mode == lib.LLAMA_LOAD_MODE_MMAP
    # a split model counts all of its parts
    for i in (1, 2):
        (tmp_path / f"m-{i:05d}-of-00002.gguf").write_bytes(b"x" * (100 * i))
    assert moe.model_files_size(str(tmp_path / "m-00001-of-00002.gguf")) == 300
    assert moe.available_memory() is None or moe.available_memory() > 0


def test_no_cache_no_stats(path: Path) -> None:
    with Llama(str(path), n_ctx=64, verbose=False) as llm:
        assert llm.moe_cache_stats() is None


def test_placement_is_reported(caplog: pytest.LogCaptureFixture, path: Path) -> None:
    with Llama(str(path), n_ctx=64, cpu_moe=True, load_mode="none", verbose=False) as llm:
        p = llm.placement
    assert p["host_tensor_patterns"] == [moe.FFN_EXPS_REGEX] and p["load_mode"] == "none"
    assert p["n_gpu_layers"] == 0 and p["n_layer"] >= 1 and p["n_ctx"] == 64 and p["moe_cache_mib"] == 0
    with caplog.at_level(logging.INFO, logger="pyllama_moe"):
        with Llama(str(path), n_ctx=0, fit=True, moe_cache_mib="auto", verbose=True) as llm:
            p = llm.placement
    # the fit's choices: all layers where it put them, the context it chose
    assert p["n_ctx"] >= 256 and 0 <= p["n_gpu_layers"] <= p["n_layer"] + 1
    assert any(r.getMessage().startswith("placement: n_gpu_layers=") for r in caplog.records)


@pytest.mark.parametrize("predict, want", [(None, 2), (0, 0), (5, 5)])
def test_moe_cache_predict_reaches_the_context_params(path: Path, predict: int | None, want: int) -> None:
    # None leaves the library's default (2 copies per layer and ubatch), a number is passed as given
    with Llama(str(path), n_ctx=64, moe_cache_predict=predict, verbose=False) as llm:
        assert llm.context_params.ptr.moe_cache_predict == want


@pytest.mark.parametrize("depth, want", [(None, 1), (1, 1), (3, 3), (8, 8)])
def test_moe_cache_predict_depth_reaches_the_context_params(path: Path, depth: int | None, want: int) -> None:
    # None leaves the library's default (the next MoE layer only), a number is passed as given
    with Llama(str(path), n_ctx=64, moe_cache_predict_depth=depth, verbose=False) as llm:
        assert llm.context_params.ptr.moe_cache_predict_depth == want


def test_moe_cache_state_without_a_cache_is_ignored(path: Path, tmp_path: Path,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    # a warm-start file needs a MoE cache (a GPU): without one it is neither read nor written, with a warning
    state = tmp_path / "state.json"
    with caplog.at_level(logging.WARNING, logger="pyllama_moe"):
        with Llama(str(path), n_ctx=64, moe_cache_state=state, verbose=False) as llm:
            assert llm.moe_cache_restored == 0
            llm("hi", max_tokens=2)
    assert not state.exists()
    assert any("moe_cache_state" in r.getMessage() and "ignored" in r.getMessage() for r in caplog.records)
    with pytest.raises(TypeError, match="moe_cache_state must be a path"):
        Llama(str(path), n_ctx=64, moe_cache_state=5, verbose=False)  # type: ignore[arg-type]


@pytest.mark.parametrize("hybrid, want", [(None, "OFF"), (False, "OFF"), (True, "ON"), ("auto", "AUTO")])
def test_moe_hybrid_reaches_the_context_params(path: Path, hybrid: bool | str | None, want: str) -> None:
    # None leaves the library's default (off); each value is passed as enum llama_moe_hybrid. On a CPU-only build the
    # library takes it and does nothing, as with the prediction
    value = getattr(lib, f"LLAMA_MOE_HYBRID_{want}")
    assert lib.llama_context_default_params().moe_hybrid == lib.LLAMA_MOE_HYBRID_OFF
    with Llama(str(path), n_ctx=64, moe_hybrid=hybrid, verbose=False) as llm:
        assert llm.context_params.ptr.moe_hybrid == value
        assert llm("a", max_tokens=2, temperature=0)["usage"]["completion_tokens"] >= 1
    assert (lib.LLAMA_MOE_HYBRID_OFF, lib.LLAMA_MOE_HYBRID_ON, lib.LLAMA_MOE_HYBRID_AUTO) == (0, 1, 2)  # llama.h


def test_moe_hybrid_without_a_cache_warns(path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # the CPU's share is a share of the MoE cache's misses: asked for without a cache (none given, or no GPU for it),
    # it is ignored with a warning; off, or left unset, says nothing
    for hybrid, warned in ((True, True), ("auto", True), (False, False), (None, False)):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="pyllama_moe"):
            with Llama(str(path), n_ctx=64, cpu_moe=True, moe_hybrid=hybrid, verbose=False) as llm:
                assert llm.placement["moe_cache_mib"] == 0
        assert any("moe_hybrid ignored" in r.getMessage() for r in caplog.records) == warned, hybrid


@pytest.mark.skipif(backend.gpu_available(), reason="the CPU-only behaviour")
def test_moe_hybrid_with_a_cache_but_no_gpu_warns_for_both(path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="pyllama_moe"):
        with Llama(str(path), n_ctx=64, cpu_moe=True, moe_cache_mib=64, moe_hybrid=True, verbose=False) as llm:
            assert llm.moe_cache_stats() is None
    messages = [r.getMessage() for r in caplog.records]
    assert any("moe_cache_mib=64 ignored" in m for m in messages) and any("moe_hybrid ignored" in m for m in messages)


def test_moe_cache_stats_reads_every_field_of_the_struct() -> None:
    # MoeCacheStats is struct llama_moe_cache_stats field by field, in its order: a field the struct gains is read
    from pyllama_moe.ffi import ffi

    fields = [name for name, _ in ffi.typeof("struct llama_moe_cache_stats").fields]
    assert fields == [f.name for f in dataclasses.fields(moe.MoeCacheStats)]
    st = ffi.new("struct llama_moe_cache_stats *")
    for i, name in enumerate(fields):
        setattr(st, name, i + 1)
    st.host_expert_us, st.upload_expert_us, st.handoff_us = 12.5, 3.25, 0.75  # floats in C: read as floats
    got = moe.MoeCacheStats.from_c(st)
    assert got.n_host == fields.index("n_host") + 1 and got.host_max == len(fields)
    assert (got.host_expert_us, got.upload_expert_us, got.handoff_us) == (12.5, 3.25, 0.75)
    assert isinstance(got.host_busy_us, int) and isinstance(got.handoff_us, float)
    assert got == moe.MoeCacheStats.from_dict(got.as_dict())


def hybrid_stats(n_host: int, calls: int, busy_us: int, misses: int, predicted: int = 0) -> moe.MoeCacheStats:
    return moe.MoeCacheStats(hits_device=100, misses_device=misses, n_predicted=predicted, n_host=n_host,
                             n_host_calls=calls, host_busy_us=busy_us, host_expert_us=40.0, upload_expert_us=25.0,
                             handoff_us=5.0, host_max=3)


def test_moe_cache_stats_hybrid_group() -> None:
    st = hybrid_stats(n_host=30, calls=10, busy_us=1200, misses=120)
    g = st["hybrid"]
    assert (g["experts"], g["calls"], g["busy_us"], g["host_max"]) == (30, 10, 1200, 3)
    assert (g["host_expert_us"], g["upload_expert_us"], g["handoff_us"]) == (40.0, 25.0, 5.0)
    # the CPU computed 30 of the device lookups' 120 misses (the other 90 uploaded), 3 a hand-off
    assert g["share"] == 0.25 and g["experts_per_call"] == 3.0 and g["busy_us_per_call"] == 120.0
    assert moe.MoeCacheStats()["hybrid"]["share"] == 0.0  # nothing looked up: no division by zero
    assert moe.MoeCacheStats.from_dict(st.as_dict()) == st  # the rates come back as floats, the counts as ints


def test_moe_cache_stats_difference_keeps_the_split() -> None:
    # the counts are differences; host_max and the rates are what the context chose when it was made: the later's
    a = hybrid_stats(n_host=30, calls=10, busy_us=1200, misses=120)
    b = hybrid_stats(n_host=50, calls=14, busy_us=2000, misses=180, predicted=4)
    d = b - a
    assert (d.n_host, d.n_host_calls, d.host_busy_us, d.misses_device, d.n_predicted) == (20, 4, 800, 60, 4)
    assert (d.host_max, d.host_expert_us, d.upload_expert_us, d.handoff_us) == (3, 40.0, 25.0, 5.0)


def test_moe_cache_stats_per_token() -> None:
    d = hybrid_stats(n_host=20, calls=4, busy_us=800, misses=60, predicted=4)
    # over 10 tokens: 2 experts a token on the CPU, 0.08 ms of its time; 44 uploads (the 40 misses it left and the
    # predicted copies)
    # of 25 us each: 0.11 ms of PCIe a token
    assert d.uploaded() == 44
    assert d.per_token(10) == pytest.approx({"host": 2.0, "host_ms": 0.08, "uploaded": 4.4, "pcie_ms": 0.11})
    assert moe.MoeCacheStats().per_token(0) == {"host": 0.0, "host_ms": 0.0, "uploaded": 0.0, "pcie_ms": 0.0}
