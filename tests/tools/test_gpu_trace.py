"""pyllama_moe.tools.bench.gpu_trace: the summary of a GPU trace (busy times, copy under compute, bytes) and bench
--trace."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from pyllama_moe.tools import bench
from pyllama_moe.tools.bench import gpu_trace


def ev(cat: str, name: str, ts: float, dur: float, stream: int, nbytes: int = 0) -> dict[str, Any]:
    args: dict[str, Any] = {"stream": stream}
    if nbytes:
        args["bytes"] = nbytes
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "args": args}


EVENTS = [
    ev("kernel", "mul_mat_q<Q4_0>", 0, 100, 7),
    ev("kernel", "mul_mat_q<Q4_0>", 150, 100, 7),
    ev("kernel", "flash_attn_ext", 90, 20, 7),  # overlaps the first matmul: counted once
    ev("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 50, 150, 20, 3 << 20),
    ev("gpu_memcpy", "Memcpy DtoD (Device -> Device)", 300, 10, 20, 1 << 20),
    ev("kernel", "k_copy_regions<16>", 320, 10, 20),
    # the MoE cache's copies: one on the compute stream after the matmul, one beside the second matmul
    ev("kernel", "moe_cache_copy_kernel", 260, 20, 7),
    ev("kernel", "moe_cache_copy_kernel", 200, 100, 30),
    {"ph": "X", "cat": "cpu_op", "name": "aten::empty", "ts": 0, "dur": 1000},  # not GPU work
    {"ph": "i", "cat": "kernel", "name": "no duration", "ts": 5},
]


def test_union_and_intersection() -> None:
    assert gpu_trace.union([(5, 6), (0, 2), (1, 3), (3, 4)]) == [(0, 4), (5, 6)]
    assert gpu_trace.length([(0, 4), (5, 6)]) == 5
    assert gpu_trace.intersection([(0, 4), (5, 6)], [(3, 5.5)]) == 1.5
    assert gpu_trace.intersection([], [(0, 1)]) == 0


def test_summary_of_a_trace() -> None:
    s = gpu_trace.summarize(EVENTS)
    assert s.wall_ms == pytest.approx(0.330)
    assert s.compute_ms == pytest.approx(0.210)  # [0,110] and [150,250]
    assert s.h2d_ms == pytest.approx(0.150)
    assert s.h2d_under_compute_ms == pytest.approx(0.110)  # [50,110] and [150,200]
    assert s.d2d_ms == pytest.approx(0.120)  # the DtoD memcpy and the copy kernels: [200,310] and [320,330]
    assert s.copy_kernel_ms == pytest.approx(0.110)  # [200,300], the other inside it, and [320,330]
    assert s.copy_under_compute_ms == pytest.approx(0.050)  # [200,250]
    assert (s.h2d_mib, s.d2d_mib) == (3.0, 1.0)
    assert (s.n_kernels, s.n_memcpy) == (6, 2)
    assert s.streams == {"20": pytest.approx(0.170), "30": pytest.approx(0.100), "7": pytest.approx(0.230)}
    assert s.top_kernels[0] == ("mul_mat_q<Q4_0>", 2, pytest.approx(0.2))
    line = s.line()
    assert "H2D 0.1 (3 MiB" in line and "73% under compute" in line and "mul_mat_q<Q4_0> x2" in line
    assert "copy kernels 0.1 (45% under compute)" in line and "streams busy 20 0.2, 30 0.1, 7 0.2" in line
    assert gpu_trace.summarize([]) == gpu_trace.TraceSummary()


def test_the_step_split_into_the_prediction_s_copies_the_lookups_and_compute() -> None:
    # a layer: compute [0,100]; the prediction's copy (16 blocks) [50,180]: under compute to 100, then alone while the
    # next lookup waits for it; the lookup's own misses (42 blocks) [200,240]; compute [240,300] with the next
    # prediction's copy [260,280] beside it; nothing [180,200]
    def kernel(name: str, ts: float, dur: float, grid: int) -> dict[str, Any]:
        return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur,
                "args": {"stream": 7, "grid": [grid, 1, 1]}}

    s = gpu_trace.summarize([
        kernel("mul_mat_vec_q", 0, 100, 128), kernel("moe_cache_copy_kernel(args)", 50, 130, 16),
        kernel("moe_cache_copy_kernel(args)", 200, 40, 42), kernel("mul_mat_vec_q", 240, 60, 128),
        kernel("moe_cache_copy_kernel(args)", 260, 20, 16)])
    assert s.wall_ms == pytest.approx(0.300)
    assert s.prefetch_copy_ms == pytest.approx(0.150)
    assert s.prefetch_alone_ms == pytest.approx(0.080)  # [100,180]
    assert s.demand_copy_ms == pytest.approx(0.040)
    assert s.compute_alone_ms == pytest.approx(0.090)  # [0,50] and [240,260], [280,300]
    assert s.idle_ms == pytest.approx(0.020)
    assert s.copy_kernel_ms == pytest.approx(0.190)  # both kinds
    assert "prediction's copies 0.1 (0.1 alone), other copy kernels 0.0, compute alone 0.1, idle 0.0" in s.line()


def test_a_disabled_tracer_records_nothing() -> None:
    # the bench's runs without --trace go through the same code: no PyTorch needed, nothing recorded
    with gpu_trace.Tracer(False) as t:
        pass
    assert t.as_dict() == {} and t.summary == gpu_trace.TraceSummary()


def test_a_traced_row_survives_the_json_file() -> None:
    row = bench.Row("cache-80", {}, "python", 2048, 2048, 0, 6000.0,
                    trace=dataclasses.asdict(gpu_trace.summarize(EVENTS)))
    again = bench.Row(**json.loads(json.dumps(dataclasses.asdict(row))))
    assert gpu_trace.TraceSummary(**again.trace).line() == gpu_trace.summarize(EVENTS).line()


def test_trace_without_pytorch_is_a_usage_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    real = bench.cli.importlib.util.find_spec
    monkeypatch.setattr(bench.cli.importlib.util, "find_spec",
                        lambda name, *a: None if name == "torch" else real(name, *a))
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    with pytest.raises(SystemExit) as e:
        bench.main([str(tmp_path / "m.gguf"), "--trace", "--no-native"])
    assert e.value.code == 2
    assert "--trace traces the Python API runs through PyTorch's profiler" in capsys.readouterr().err
