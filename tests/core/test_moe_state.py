"""The MoE cache's warm-start file (pyllama_moe.moe_state, #46): what is saved loads back; every file that cannot be
used (missing, corrupt, too large, of another model or shape) gives None, with a warning naming the reason except
for a missing one; bad arguments raise."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pyllama_moe import moe_state
from pyllama_moe.moe_state import MoeCacheState

MODEL_ID = "0123456789abcdef0123456789abcdef"
N_LAYER, N_EXPERT = 3, 8


def make_state(dtype: Any = np.uint64, source: str = "calibrate") -> MoeCacheState:
    counts = np.arange(N_LAYER * N_EXPERT, dtype=dtype).reshape(N_LAYER, N_EXPERT)
    counts[1] = 0  # a dense layer
    counts[2, 5] = 2**32 - 1 if dtype == np.uint32 else 2**64 - 1
    return MoeCacheState(MODEL_ID, N_LAYER, N_EXPERT, counts, 40, source)


def same(a: MoeCacheState, b: MoeCacheState) -> bool:
    return ((a.model_id, a.n_layer, a.n_expert, a.n_tokens, a.source) ==
            (b.model_id, b.n_layer, b.n_expert, b.n_tokens, b.source)
            and a.counts.dtype == b.counts.dtype == np.uint64 and np.array_equal(a.counts, b.counts))


@pytest.mark.parametrize("dtype", [np.uint64, np.uint32])
@pytest.mark.parametrize("source", ["calibrate", "run"])
def test_round_trip(tmp_path: Path, dtype: Any, source: str, caplog: pytest.LogCaptureFixture) -> None:
    state = make_state(dtype, source)
    path = tmp_path / "state.json"
    moe_state.save(state, path)
    with caplog.at_level(logging.WARNING, logger="pyllama_moe"):
        got = moe_state.load(path, MODEL_ID, N_LAYER, N_EXPERT)
        got_str = moe_state.load(str(path), MODEL_ID, N_LAYER, N_EXPERT)
    assert got is not None and got_str is not None
    assert same(got, state) and same(got_str, state)
    assert int(got.counts[2, 5]) == int(state.counts[2, 5])  # the largest count survives JSON
    assert caplog.records == []
    # the documented format: JSON with its name and version, the counts as rows of integers
    doc = json.loads(path.read_text(encoding="utf-8"))
    assert doc["format"] == "pyllama-moe-cache-state" and doc["version"] == 1
    assert doc["counts"] == state.counts.tolist() and doc["model_id"] == MODEL_ID


def test_the_state_is_frozen_and_owns_its_counts() -> None:
    counts = np.ones((N_LAYER, N_EXPERT), dtype=np.uint32)
    state = MoeCacheState(MODEL_ID, N_LAYER, N_EXPERT, counts, 1, "run")
    counts[0, 0] = 7
    assert state.counts[0, 0] == 1 and state.counts.dtype == np.uint64
    with pytest.raises(ValueError):
        state.counts[0, 0] = 3
    with pytest.raises(AttributeError):
        state.n_tokens = 2  # type: ignore[misc]


def test_save_replaces_at_once_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text("old")
    moe_state.save(make_state(), path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]
    assert moe_state.load(path, MODEL_ID, N_LAYER, N_EXPERT) is not None
    assert path.stat().st_mode & 0o777 == 0o666 & ~_umask()  # not a private temporary file's mode
    # a failed write leaves the old file and no temporary one
    (tmp_path / "sub").mkdir()
    with pytest.raises(OSError):
        moe_state.save(make_state(), tmp_path / "sub")  # a directory cannot be replaced by a file
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json", "sub"]
    with pytest.raises(OSError):
        moe_state.save(make_state(), tmp_path / "missing" / "state.json")


def _umask() -> int:
    old = os.umask(0)
    os.umask(old)
    return old


def test_a_missing_file_is_none_without_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="pyllama_moe"):
        assert moe_state.load(tmp_path / "none.json", MODEL_ID, N_LAYER, N_EXPERT) is None
    assert caplog.records == []


def good_doc() -> dict[str, Any]:
    return {"format": "pyllama-moe-cache-state", "version": 1, "model_id": MODEL_ID, "n_layer": N_LAYER,
            "n_expert": N_EXPERT, "n_tokens": 40, "source": "calibrate",
            "counts": [[1] * N_EXPERT for _ in range(N_LAYER)]}


def edited(**changes: Any) -> bytes:
    doc = good_doc()
    for k, v in changes.items():
        if v is KeyError:
            del doc[k]
        else:
            doc[k] = v
    return json.dumps(doc).encode()


def bad_count(il: int, e: int, value: Any) -> bytes:
    doc = good_doc()
    doc["counts"][il][e] = value
    return json.dumps(doc).encode()


CORRUPT = {
    "empty": (b"", "not JSON"),
    "cut": (edited()[:-20], "not JSON"),
    "not utf-8": (b"\xff\xfe{}", "not UTF-8"),
    "deeply nested": (b"[" * 100_000 + b"]" * 100_000, "not JSON"),
    "a list": (b"[1, 2]", "JSON list, not an object"),
    "another format": (edited(format="llama-state"), "format is 'llama-state'"),
    "no format": (edited(format=KeyError), "format is 'None'"),
    "a later version": (edited(version=2), "version is 2"),
    "version as true": (edited(version=True), "version is True"),
    "no model id": (edited(model_id=KeyError), "no 'model_id'"),
    "model id a number": (edited(model_id=5), "'model_id' is a int, not a str"),
    "n_layer a string": (edited(n_layer="3"), "'n_layer' is a str, not a int"),
    "n_expert a float": (edited(n_expert=8.0), "'n_expert' is a float, not a int"),
    "n_tokens a bool": (edited(n_tokens=True), "'n_tokens' is a bool"),
    "negative n_tokens": (edited(n_tokens=-1), "n_tokens is negative"),
    "unknown source": (edited(source="guess"), "source is 'guess'"),
    "no counts": (edited(counts=KeyError), "counts are a NoneType"),
    "counts a dict": (edited(counts={"0": [1]}), "counts are a dict"),
    "a row missing": (edited(counts=[[1] * N_EXPERT] * (N_LAYER - 1)), "2 rows, not 3"),
    "a row short": (edited(counts=[[1] * N_EXPERT, [1] * (N_EXPERT - 1), [1] * N_EXPERT]),
                    "layer 1 are 7 counts, not 8"),
    "a row a number": (edited(counts=[[1] * N_EXPERT, 4, [1] * N_EXPERT]), "layer 1 are a int"),
    "a negative count": (bad_count(2, 3, -1), "layer 2 expert 3 is out of range"),
    "a count of 2**64": (bad_count(0, 0, 2**64), "layer 0 expert 0 is out of range"),
    "a float count": (bad_count(1, 7, 1.5), "layer 1 expert 7 is not an integer (1.5)"),
    "an integral float count": (bad_count(1, 7, 2.0), "layer 1 expert 7 is not an integer (2.0)"),
    "a NaN count": (bad_count(0, 1, float("nan")), "not an integer (nan)"),
    "a bool count": (bad_count(0, 1, False), "not an integer (False)"),
    "a string count": (bad_count(0, 1, "3"), "not an integer ('3')"),
    "a count of 5000 digits": (edited().replace(b'"counts": [[1', b'"counts": [[' + b"9" * 5000), "not JSON"),
}


@pytest.mark.parametrize("name", list(CORRUPT))
def test_a_corrupt_file_is_none_with_a_warning_naming_why(tmp_path: Path, name: str,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    data, reason = CORRUPT[name]
    path = tmp_path / "state.json"
    path.write_bytes(data)
    with caplog.at_level(logging.WARNING, logger="pyllama_moe"):
        assert moe_state.load(path, MODEL_ID, N_LAYER, N_EXPERT) is None
    assert len(caplog.records) == 1 and caplog.records[0].levelno == logging.WARNING
    assert str(path) in caplog.text and reason in caplog.text


def test_the_good_document_of_the_corrupt_ones_loads(tmp_path: Path) -> None:
    # the edits above break one thing each: unedited, the same document (with a key of a later writer) is used
    path = tmp_path / "state.json"
    path.write_bytes(edited(held=[[0, 1]]))
    got = moe_state.load(path, MODEL_ID, N_LAYER, N_EXPERT)
    assert got is not None and got.counts.sum() == N_LAYER * N_EXPERT and got.n_tokens == 40


@pytest.mark.parametrize(("key", "reason"), [
    ((MODEL_ID.replace("0", "f"), N_LAYER, N_EXPERT), f"another model (model_id '{MODEL_ID}', this one is 'f123"),
    ((MODEL_ID, N_LAYER + 1, N_EXPERT), "its shape is 3 layers x 8 experts, this model's 4 x 8"),
    ((MODEL_ID, N_LAYER, N_EXPERT * 2), "its shape is 3 layers x 8 experts, this model's 3 x 16"),
])
def test_a_file_of_another_model_or_shape_is_none_with_a_warning(tmp_path: Path, key: tuple[str, int, int],
                                                                 reason: str, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "state.json"
    moe_state.save(make_state(), path)
    with caplog.at_level(logging.WARNING, logger="pyllama_moe"):
        assert moe_state.load(path, *key) is None
    assert len(caplog.records) == 1 and reason in caplog.text


def test_a_directory_or_a_too_large_file_is_refused_unread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    big = tmp_path / "big.json"
    with open(big, "wb") as f:  # sparse: nothing of it is written, nor read
        f.truncate(moe_state.MAX_FILE_BYTES + 1)
    read: list[int] = []
    real_read = moe_state.json.loads

    def loads(s: Any, **kw: Any) -> Any:
        read.append(len(s))
        return real_read(s, **kw)

    monkeypatch.setattr(moe_state.json, "loads", loads)
    with caplog.at_level(logging.WARNING, logger="pyllama_moe"):
        assert moe_state.load(big, MODEL_ID, N_LAYER, N_EXPERT) is None
        assert moe_state.load(tmp_path, MODEL_ID, N_LAYER, N_EXPERT) is None
    assert read == []
    assert [r.getMessage().split(": ", 1)[1] for r in caplog.records] == [
        f"the file has {moe_state.MAX_FILE_BYTES + 1} bytes, more than a state can ({moe_state.MAX_FILE_BYTES})",
        "it is a directory"]


def test_an_unreadable_file_is_none_with_a_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "state.json"
    moe_state.save(make_state(), path)

    def denied(*_: Any, **__: Any) -> Any:  # as a file of another user (chmod does not stop root)
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(moe_state, "open", denied, raising=False)
    with caplog.at_level(logging.WARNING, logger="pyllama_moe"):
        assert moe_state.load(path, MODEL_ID, N_LAYER, N_EXPERT) is None
    assert "cannot read it: Permission denied" in caplog.text


@pytest.mark.parametrize(("args", "error", "match"), [
    ((5, MODEL_ID, N_LAYER, N_EXPERT), TypeError, "path must be"),
    (("s.json", None, N_LAYER, N_EXPERT), TypeError, "model_id must be a str"),
    (("s.json", "", N_LAYER, N_EXPERT), ValueError, "model_id must not be empty"),
    (("s.json", MODEL_ID, 0, N_EXPERT), ValueError, "n_layer must be at least 1"),
    (("s.json", MODEL_ID, N_LAYER, -2), ValueError, "n_expert must be at least 1"),
    (("s.json", MODEL_ID, 3.0, N_EXPERT), TypeError, "n_layer must be an int"),
    (("s.json", MODEL_ID, N_LAYER, True), TypeError, "n_expert must be an int"),
    (("s.json", MODEL_ID, 1 << 20, 2), ValueError, "at most"),
])
def test_bad_arguments_of_load_raise(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: tuple[Any, ...],
                                     error: type[Exception], match: str) -> None:
    monkeypatch.chdir(tmp_path)
    moe_state.save(make_state(), "s.json")
    with pytest.raises(error, match=match):
        moe_state.load(*args)


@pytest.mark.parametrize(("change", "error", "match"), [
    ({"model_id": 1}, TypeError, "model_id must be a str"),
    ({"n_layer": 4}, ValueError, r"shape \(n_layer, n_expert\) = \(4, 8\), got \(3, 8\)"),
    ({"counts": [[0] * N_EXPERT] * N_LAYER}, TypeError, "counts must be a numpy array"),
    ({"counts": np.zeros((N_LAYER, N_EXPERT), np.int64)}, TypeError, "uint32 or uint64, got int64"),
    ({"counts": np.zeros(N_LAYER * N_EXPERT, np.uint64)}, ValueError, r"got \(24,\)"),
    ({"n_tokens": -1}, ValueError, "n_tokens must be at least 0"),
    ({"source": "guess"}, ValueError, "source must be one of calibrate, run"),
])
def test_a_bad_state_raises(change: dict[str, Any], error: type[Exception], match: str) -> None:
    fields = {"model_id": MODEL_ID, "n_layer": N_LAYER, "n_expert": N_EXPERT,
              "counts": np.zeros((N_LAYER, N_EXPERT), np.uint64), "n_tokens": 0, "source": "run", **change}
    with pytest.raises(error, match=match):
        MoeCacheState(**fields)


def test_bad_arguments_of_save_raise(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="state must be a MoeCacheState"):
        moe_state.save({"counts": []}, tmp_path / "s.json")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="path must be"):
        moe_state.save(make_state(), None)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []
