"""Python <-> C parameters: defaults from the library, llama-cpp-python's keywords, their effect."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pyllama_moe.ffi import ffi, lib
from pyllama_moe.llama import Llama
from pyllama_moe.params import ContextParams, ModelParams, check_threads, load_mode, max_threads, physical_cores


@pytest.mark.parametrize("args, expected", [
    ((None, True, False), None),  # the library's default: auto
    ((None, False, False), lib.LLAMA_LOAD_MODE_NONE),
    ((None, True, True), lib.LLAMA_LOAD_MODE_MMAP_MLOCK),
    ((None, False, True), lib.LLAMA_LOAD_MODE_MLOCK),
    (("auto", True, False), lib.LLAMA_LOAD_MODE_AUTO),
    (("mmap", True, False), lib.LLAMA_LOAD_MODE_MMAP),
    (("none", True, False), lib.LLAMA_LOAD_MODE_NONE),
    (("mlock", True, False), lib.LLAMA_LOAD_MODE_MLOCK),
    (("mmap_mlock", True, False), lib.LLAMA_LOAD_MODE_MMAP_MLOCK),
    (("mmap+mlock", True, False), lib.LLAMA_LOAD_MODE_MMAP_MLOCK),
    (("direct_io", True, False), lib.LLAMA_LOAD_MODE_DIRECT_IO),
    (("DIO", True, False), lib.LLAMA_LOAD_MODE_DIRECT_IO),
])
def test_load_mode_mapping(args: tuple[str | None, bool, bool], expected: int | None) -> None:
    assert load_mode(*args) == expected


def test_defaults_come_from_the_library() -> None:
    mp = ModelParams()
    default = lib.llama_model_default_params()
    assert mp.ptr.load_mode == default.load_mode and mp.ptr.tensor_buft_overrides == ffi.NULL
    assert mp.ptr.n_gpu_layers == 0  # llama-cpp-python's default
    cp = ContextParams(n_ctx=128, n_batch=32, n_ubatch=16)
    cdefault = lib.llama_context_default_params()
    for f in ("yarn_ext_factor", "yarn_attn_factor", "yarn_beta_fast", "yarn_beta_slow", "type_k", "type_v",
              "op_offload", "swa_full", "moe_cache_size"):
        assert getattr(cp.ptr, f) == getattr(cdefault, f), f
    assert cp.ptr.flash_attn_type == lib.LLAMA_FLASH_ATTN_TYPE_DISABLED  # llama-cpp-python: flash_attn=False
    cpus = len(os.sched_getaffinity(0))
    assert (cp.ptr.n_threads, cp.ptr.n_threads_batch) == (physical_cores(), cpus)
    assert 1 <= physical_cores() <= cpus


def test_thread_counts_are_bounded_by_the_machine() -> None:
    # 4 per CPU, never past ggml's GGML_MAX_N_THREADS: 100000 threads ended the process at the first decode (#48)
    limit = max_threads()
    assert limit == min(int(lib.GGML_MAX_N_THREADS), 4 * (os.cpu_count() or 1)) and limit <= 512
    assert check_threads("n_threads", limit) == limit
    for name in ("n_threads", "n_threads_batch"):
        for bad in (0, limit + 1, 100_000, 1.5, True, "8"):
            with pytest.raises(ValueError, match=name):
                ContextParams(n_ctx=64, n_batch=32, n_ubatch=32, **{name: bad})


def test_the_fields_no_keyword_sets() -> None:
    # prefetch_min_batch, and for tests moe_hybrid_share and moe_cache_cpu: the library's defaults unless given (the
    # scheduler's min batch 256, the share from the measured rates, a GPU for the cache), checked when given
    default = lib.llama_context_default_params()
    assert (default.prefetch_min_batch, default.moe_hybrid_share, default.moe_cache_cpu) == (256, -1.0, False)
    cp = ContextParams(n_ctx=64, n_batch=32, n_ubatch=32)
    assert (cp.ptr.prefetch_min_batch, cp.ptr.moe_hybrid_share, cp.ptr.moe_cache_cpu) == (256, -1.0, False)
    cp = ContextParams(n_ctx=64, n_batch=32, n_ubatch=32, prefetch_min_batch=1, moe_hybrid_share=0.5,
                       moe_cache_cpu=True)
    assert (cp.ptr.prefetch_min_batch, cp.ptr.moe_hybrid_share, cp.ptr.moe_cache_cpu) == (1, 0.5, True)
    for name, bad, match in (("prefetch_min_batch", -1, "must be in"),
                             ("prefetch_min_batch", 1.5, "must be an integer"),
                             ("moe_hybrid_share", 1.5, "must be at most 1"), ("moe_hybrid_share", -0.5, "must be >= 0"),
                             ("moe_hybrid_share", float("nan"), "must be a finite number"),
                             ("moe_cache_cpu", 1, "must be True or False")):
        with pytest.raises(ValueError, match=f"{name} {match}"):
            ContextParams(n_ctx=64, n_batch=32, n_ubatch=32, **{name: bad})


SMT = "\n\n".join(f"processor\t: {i}\nphysical id\t: 0\ncore id\t\t: {i % 4}\n" for i in range(8))


def test_generation_threads_are_the_physical_cores() -> None:
    # two threads per core (llama-cpp-python's half of the CPUs), one (all of them), and a restricted affinity
    assert physical_cores(SMT, allowed=set(range(8))) == 4
    assert physical_cores("\n\n".join(f"processor: {i}\ncore id: {i}" for i in range(6)), allowed=set(range(6))) == 6
    assert physical_cores(SMT, allowed={0, 4}) == 1  # siblings of one core
    assert physical_cores(SMT, allowed={0, 1, 2}) == 3
    # no topology: half the CPUs, as llama-cpp-python
    assert physical_cores("processor: 0\n\nprocessor: 1", allowed={0, 1, 2, 3}) == 2
    assert physical_cores("", allowed={0}) == 1


def test_context_keywords_reach_the_context(path: Path) -> None:
    with Llama(str(path), n_ctx=300, n_batch=1024, n_ubatch=2048, n_threads=1, n_threads_batch=2, type_k="bf16",
               type_v=lib.GGML_TYPE_BF16, flash_attn=True, verbose=False) as m:
        assert m.n_ctx() >= 300
        assert m.n_batch == 300  # n_batch <= n_ctx, n_ubatch <= n_batch (llama-cpp-python)
        assert lib.llama_n_ubatch(m.ctx) == 300
        assert (lib.llama_n_threads(m.ctx), lib.llama_n_threads_batch(m.ctx)) == (1, 2)
        assert m.context_params.ptr.type_k == lib.GGML_TYPE_BF16
        assert m("hi", max_tokens=2, temperature=0)["usage"]["completion_tokens"] >= 1


def test_n_ctx_zero_is_the_models(path: Path) -> None:
    with Llama(str(path), n_ctx=0, n_batch=64, verbose=False) as m:
        assert m.n_ctx() == m._model.n_ctx_train() == 4096


def test_kv_overrides_reach_the_loader(path: Path) -> None:
    with Llama(str(path), n_ctx=0, verbose=False, kv_overrides={"qwen3moe.context_length": 1024}) as m:
        assert m._model.n_ctx_train() == 1024 and m.n_ctx() == 1024


def test_split_mode_by_name_and_tensor_split() -> None:
    mp = ModelParams(split_mode="row", tensor_split=[3, 1])
    assert mp.ptr.split_mode == lib.LLAMA_SPLIT_MODE_ROW
    assert [mp.ptr.tensor_split[i] for i in range(3)] == [3.0, 1.0, 0.0]


def test_vocab_only(path: Path) -> None:
    with Llama(str(path), vocab_only=True, verbose=False) as m:
        assert m.tokenize(b"hello world", add_bos=False) == [14990, 1879]
        assert m.detokenize([14990, 1879]) == b"hello world"
