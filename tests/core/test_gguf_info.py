"""``GGUFInfo``: one read of what a GGUF file says; ``MoeCacheStats``: the cache's counts as one type (#30)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pyllama_moe import moe
from pyllama_moe.gguf_info import GGUFInfo, split_files
from pyllama_moe.moe import MoeCacheStats
from pyllama_moe.tools import synth

from fixtures.models import model_path


@pytest.mark.parametrize("arch", ["qwen3moe", "gpt-oss"])
def test_the_header_says_what_the_writer_wrote(arch: str) -> None:
    path = model_path(arch)
    plan = synth.plan("tiny", arch=arch)
    info = GGUFInfo.read(path)
    assert info.arch == plan.shape.arch == arch and info.meta["general.architecture"] == arch
    assert info.block_count == plan.shape.n_layer and info.expert_count == plan.shape.n_expert
    assert info.n_tensors == len(plan.tensors)
    assert info.expert_bytes == plan.expert_bytes > 0  # the matrices, not gpt-oss's expert biases
    size = path.stat().st_size
    assert info.data_end <= size < info.data_end + info.alignment  # the data ends with the file, but for padding
    assert info.files == (str(path),) and info.files_size == size


def test_a_dense_model_has_no_experts(tmp_path: Path) -> None:
    path = synth.write_model(tmp_path / "dense.gguf", "tiny", arch="qwen3")
    info = GGUFInfo.read(path)
    assert info.arch == "qwen3" and info.expert_count is None and info.expert_bytes == 0
    assert info.require_block_count() == info.block_count > 0


def test_what_is_not_a_gguf_is_a_value_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\xff" * 60)
    with pytest.raises(ValueError, match="not a readable GGUF"):
        GGUFInfo.read(bad)
    with pytest.raises(ValueError, match="not a readable GGUF"):
        GGUFInfo.read(tmp_path / "missing.gguf")


def test_the_parts_of_a_split_model(tmp_path: Path) -> None:
    for i in (1, 2):
        (tmp_path / f"m-0000{i}-of-00003.gguf").write_bytes(b"x")
    first = str(tmp_path / "m-00001-of-00003.gguf")
    assert split_files(first) == (first, str(tmp_path / "m-00002-of-00003.gguf"))  # the third is missing
    assert split_files(str(tmp_path / "one.gguf")) == (str(tmp_path / "one.gguf"),)


def test_cache_stats_round_trip_and_difference() -> None:
    fields = [f.name for f in dataclasses.fields(MoeCacheStats)]
    a = MoeCacheStats(**{name: 3 * i + 1 for i, name in enumerate(fields)})
    b = MoeCacheStats(**{name: 5 * i + 2 for i, name in enumerate(fields)})
    d = a.as_dict()
    assert MoeCacheStats.from_dict(d) == a  # every field has its place in the dict
    assert d["device"]["hit_rate"] == a.hits_device / (a.hits_device + a.misses_device)
    # the counts subtract; the hybrid's split (host_max and its rates) is what the context chose when it was made: b's
    split = ("host_max", "host_expert_us", "upload_expert_us", "handoff_us")
    assert (b - a) == MoeCacheStats(**{name: getattr(b, name) if name in split else 2 * i + 1
                                       for i, name in enumerate(fields)})
    assert (b - a).hits("device", "small") == (b.hits_device - a.hits_device + b.hits_small - a.hits_small,
                                               b.misses_device - a.misses_device + b.misses_small - a.misses_small)
    assert MoeCacheStats.from_dict({"seed": {"ubatches": 4}}) == MoeCacheStats(n_seed_ubatch=4)  # a group alone
    assert moe.MoeCacheStats is MoeCacheStats


def test_cache_stats_has_every_field_of_the_c_struct() -> None:
    # from_c reads each field by name, and a field the struct gains must reach moe_cache_stats()
    from pyllama_moe.ffi import ffi

    c_fields = [name for name, _ in ffi.typeof("struct llama_moe_cache_stats").fields]
    assert [f.name for f in dataclasses.fields(MoeCacheStats)] == c_fields
    st = ffi.new("struct llama_moe_cache_stats *")
    for i, name in enumerate(c_fields):
        setattr(st, name, i + 1)
    assert MoeCacheStats.from_c(st) == MoeCacheStats(**{name: i + 1 for i, name in enumerate(c_fields)})
