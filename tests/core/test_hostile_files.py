"""GGUF files with a hyperparameter or a vocabulary the model cannot run with (issue #27, patch 0018): the load
raises ModelLoadError naming the reason (a tokenizer model that does not fit the vocabulary: ValueError at the first
tokenize, which gave ids of -1 before). They ended the process with a GGML_ASSERT before, at the load or at the
first decode; all of them load in one child process, which must exit normally."""

from __future__ import annotations

import json
import math
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fixtures.models import model_path

gguf = pytest.importorskip("gguf")

class Patcher:
    """Copies of a GGUF file with bytes of its metadata changed in place: the file is parsed once (its vocabulary
    takes seconds to read), each copy only writes a few bytes."""

    def __init__(self, src: Path) -> None:
        self.src = src
        self.r = gguf.GGUFReader(src)
        self.arch = self.r.fields["general.architecture"].contents()

    def _offset(self, part: Any) -> int:
        return int(part.__array_interface__["data"][0] - self.r.data.__array_interface__["data"][0])

    def patches(self, key: str, value: Any) -> list[tuple[int, bytes]]:
        """(offset, bytes) that give key the value (a number), hide it (None: the name's last letter changed, the key
        reads as missing) or, for the tokens, ("dup",): a token's text the same as the first one of its length."""
        f = self.r.fields[key]
        if value is None:
            return [(self._offset(f.parts[1]) + len(f.parts[1]) - 1, b"~")]
        if value == ("dup",):
            texts = [bytes(f.parts[i]) for i in f.data]
            a = next(i for i in range(1, len(texts)) if len(texts[i]) == len(texts[0]) and texts[i] != texts[0])
            return [(self._offset(f.parts[f.data[a]]), texts[0])]
        part = f.parts[f.data[0]]
        if isinstance(value, bytes):  # a string of the same length
            assert len(value) == len(part), (key, value)
            return [(self._offset(part), value)]
        return [(self._offset(part), part.dtype.type(value).tobytes())]

    def copy(self, out: Path, edit: dict[str, Any]) -> Path:
        shutil.copyfile(self.src, out)
        with open(out, "r+b") as fh:
            for key, value in edit.items():
                for offset, data in self.patches(key, value):
                    fh.seek(offset)
                    fh.write(data)
        return out


def cases(arch: str) -> dict[str, tuple[dict[str, Any], str]]:
    return {
        "no_layers": ({f"{arch}.block_count": 0}, "block_count is 0"),
        "too_many_layers": ({f"{arch}.block_count": 600}, "block_count is 600"),
        "one_expert": ({f"{arch}.expert_count": 1}, "more than expert_count (1)"),
        "too_many_experts": ({f"{arch}.expert_count": 100000}, "expert_count is 100000"),
        "no_expert_count": ({f"{arch}.expert_count": None}, "more than expert_count (0)"),
        "no_experts_used": ({f"{arch}.expert_used_count": 0}, "expert_used_count is 0 or missing"),
        "missing_experts_used": ({f"{arch}.expert_used_count": None}, "expert_used_count is 0 or missing"),
        "experts_used_above_count": ({f"{arch}.expert_used_count": 99}, "expert_used_count is 99"),
        "negative_eps": ({f"{arch}.attention.layer_norm_rms_epsilon": -1.0}, "epsilon is -1"),
        "nan_eps": ({f"{arch}.attention.layer_norm_rms_epsilon": math.nan}, "epsilon is nan"),
        "zero_rope_base": ({f"{arch}.rope.freq_base": 0.0}, "rope.freq_base is 0"),
        "inf_rope_base": ({f"{arch}.rope.freq_base": math.inf}, "rope.freq_base is inf"),
        "duplicate_token": ({"tokenizer.ggml.tokens": ("dup",)}, "the same text"),
        # rwkv's tokenizer over this BPE vocabulary: ids of -1 at the first tokenize
        "tokenizer_model_mismatch": ({"tokenizer.ggml.model": b"rwkv"}, "does not fit its tokens"),
    }


CHILD = """
import json, sys
from pyllama_moe import Llama
from pyllama_moe.errors import ModelLoadError
out = {}
for name, path in json.loads(sys.argv[1]).items():
    try:
        with Llama(path, n_ctx=64, verbose=False) as llm:
            llm.tokenize("hello world \u4e2d".encode())
            llm("hi", max_tokens=2)
        out[name] = "loaded"
    except (ModelLoadError, ValueError) as e:
        out[name] = str(e)
print(json.dumps(out))
"""


def test_bad_files_are_load_errors(tmp_path: Path) -> None:
    pt = Patcher(model_path("qwen3moe"))
    table = cases(pt.arch)
    paths = {name: str(pt.copy(tmp_path / f"{name}.gguf", edit)) for name, (edit, _) in table.items()}
    paths["unchanged"] = str(pt.copy(tmp_path / "unchanged.gguf", {}))  # the copy itself loads
    res = subprocess.run([sys.executable, "-c", CHILD, json.dumps(paths)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, f"exit {res.returncode}: {res.stderr[-3000:]}"
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got.pop("unchanged") == "loaded"
    for name, (_, reason) in table.items():
        assert reason in got[name], (name, got[name])


def test_kv_overrides_reach_the_same_checks() -> None:
    from pyllama_moe.errors import ModelLoadError
    from pyllama_moe.llama import Llama

    with pytest.raises(ModelLoadError, match="expert_used_count is 99"):
        Llama(str(model_path("qwen3moe")), n_ctx=64, verbose=False, kv_overrides={"qwen3moe.expert_used_count": 99})


def test_a_model_that_routes_every_expert_runs(tmp_path: Path) -> None:
    # 64 of 64 experts in 30 layers: build_moe_ffn's views and sums of the selected experts took more graph nodes
    # than llama.cpp reserved, and the first graph aborted (GGML_ASSERT(obj_new)); patch 0018 counts them
    from pyllama_moe.tools import synth

    path = synth.write_model(tmp_path / "all.gguf", "tiny", seed=2, n_layer=30, n_expert=64, n_expert_used=64)
    code = ("import sys\nfrom pyllama_moe import Llama\n"
            "with Llama(sys.argv[1], n_ctx=64, verbose=False) as llm:\n"
            "    print('TOKENS', llm('hi', max_tokens=3, temperature=0)['usage']['completion_tokens'])")
    res = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "TOKENS 3" in res.stdout, f"exit {res.returncode}: {res.stderr[-2000:]}"


def test_a_tensor_count_one_too_low_is_refused(tmp_path: Path) -> None:
    # the header's tensor count one too low: ggml read every tensor a few bytes off and the model ran, on garbage
    from pyllama_moe.errors import ModelLoadError
    from pyllama_moe.llama import Llama

    path = tmp_path / "count.gguf"
    shutil.copyfile(model_path("qwen3moe"), path)
    with open(path, "r+b") as f:
        f.seek(8)
        (n,) = struct.unpack("<Q", f.read(8))
        f.seek(8)
        f.write(struct.pack("<Q", n - 1))
    with pytest.raises(ModelLoadError, match="bytes follow the data of its"):
        Llama(str(path), n_ctx=64, verbose=False)
    Llama(str(model_path("qwen3moe")), n_ctx=64, verbose=False).close()  # the file as written loads


def without_last_layer(src: Path, out: Path) -> Path:
    """A copy of a GGUF model with one layer less: block_count - 1, the last layer's tensors left out."""
    return without(src, out, last_layer=True)


def without(src: Path, out: Path, last_layer: bool = False, tensor: str | None = None) -> Path:
    """A copy of a GGUF model without its last layer (block_count - 1, that layer's tensors left out) or without the
    tensor of that name."""
    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    n_layer = int(r.fields[f"{arch}.block_count"].contents())
    w = gguf.GGUFWriter(out, arch)
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = n_layer - 1 if last_layer and key == f"{arch}.block_count" else f.contents()
        sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, value, f.types[0], sub_type=sub)
    for t in r.tensors:
        if not (last_layer and t.name.startswith(f"blk.{n_layer - 1}.")) and t.name != tensor:
            w.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


LLAMA4 = """
import json, sys
from pyllama_moe import Llama
from pyllama_moe.errors import ModelLoadError
path, overrides = sys.argv[1], json.loads(sys.argv[2])
try:
    with Llama(path, n_ctx=64, verbose=False, kv_overrides=overrides) as llm:
        print("TEXT", json.dumps(llm("hi", max_tokens=3, temperature=0)["choices"][0]["text"]))
except ModelLoadError as e:
    print("ERROR", e)
"""


def run_llama4(path: Path, overrides: dict[str, Any]) -> str:
    res = subprocess.run([sys.executable, "-c", LLAMA4, str(path), json.dumps(overrides)], capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, f"exit {res.returncode}: {res.stderr[-2000:]}"
    return res.stdout.strip().splitlines()[-1]


def test_llama4_without_chunked_attention_runs(tmp_path: Path) -> None:
    # attention.sliding_window 0: no chunked attention, so no temperature tuning (a scale of 0, which multiplies by 1);
    # the graph built its input anyway and its first decode aborted (GGML_ASSERT(f_attn_temp_scale != 0.0f))
    from pyllama_moe.tools import synth

    path = synth.write_model(tmp_path / "llama4.gguf", "tiny", arch="llama4", seed=1)
    chunked = run_llama4(path, {})
    full = run_llama4(path, {"llama4.attention.sliding_window": 0})
    assert chunked.startswith("TEXT") and full.startswith("TEXT"), (chunked, full)
    assert run_llama4(path, {"llama4.attention.sliding_window": 0}) == full  # greedy: the same text again


def test_llama4_without_a_full_attention_layer_is_refused(tmp_path: Path) -> None:
    # three layers of chunked attention and none of full attention (one in four): its first graph aborted
    # (GGML_ASSERT(buf != NULL && "tensor buffer not set")); the load now says why
    from pyllama_moe.tools import synth

    path = without_last_layer(synth.write_model(tmp_path / "llama4.gguf", "tiny", arch="llama4", seed=1),
                              tmp_path / "three.gguf")
    got = run_llama4(path, {})
    assert got.startswith("ERROR") and "no layer attends fully" in got, got


# one file per case, each in a child process of its own: the load or the context creation must fail with the reason
# (MTP: a multi-token-prediction context, as llama.cpp's speculative decoding makes it from the model's NextN layer)
REFUSE = """
import json, sys
from pyllama_moe import backend
from pyllama_moe.ffi import ffi, lib
path, overrides, mtp = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3] == "1"
backend.init()
mp = lib.llama_model_default_params()
mp.load_mtp = mtp
kv = ffi.new("struct llama_model_kv_override[]", len(overrides) + 1)
for i, (k, v) in enumerate(overrides.items()):
    kv[i].tag = lib.LLAMA_KV_OVERRIDE_TYPE_INT
    kv[i].key = k.encode()
    kv[i].val_i64 = v
if overrides:
    mp.kv_overrides = kv
m = lib.llama_model_load_from_file(path.encode(), mp)
if m == ffi.NULL:
    print("REFUSED load")
    sys.exit(0)
cp = lib.llama_context_default_params()
cp.n_ctx = 64
if mtp:
    cp.ctx_type = lib.LLAMA_CONTEXT_TYPE_MTP
ctx = lib.llama_init_from_model(m, cp)
print("REFUSED context" if ctx == ffi.NULL else "CREATED")
"""


def refused(path: Path, overrides: dict[str, int], mtp: bool = False) -> str:
    res = subprocess.run([sys.executable, "-c", REFUSE, str(path), json.dumps(overrides), "1" if mtp else "0"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, f"exit {res.returncode}: {res.stderr[-2000:]}"
    return res.stdout.strip().splitlines()[-1] + "\n" + res.stderr


def test_qwen3next_without_a_full_attention_layer_is_refused(tmp_path: Path) -> None:
    # three layers of linear attention and none of full attention (one in four), or an interval of 0 (a division by
    # zero): the first graph aborted (GGML_ASSERT(buffer) from the KV cache's inputs); the load now says why
    from pyllama_moe.tools import synth

    path = synth.write_model(tmp_path / "qwen3next.gguf", "tiny", arch="qwen3next", seed=1)
    assert refused(path, {}).startswith("CREATED")
    got = refused(without_last_layer(path, tmp_path / "three.gguf"), {})
    assert got.startswith("REFUSED load") and "no layer attends fully" in got, got
    got = refused(path, {"qwen3next.full_attention_interval": 0})
    assert got.startswith("REFUSED load") and "full_attention_interval is 0" in got, got


@pytest.mark.parametrize("overrides, reason", [
    ({"deepseek2.expert_group_count": 8}, "expert_group_count is 8, not less than expert_count (8)"),
    ({"deepseek2.expert_group_count": 3, "deepseek2.expert_group_used_count": 1}, "does not divide expert_count"),
    ({"deepseek2.expert_group_count": 4, "deepseek2.expert_group_used_count": 4}, "expert_group_used_count is 4"),
    ({"deepseek2.expert_group_count": 4, "deepseek2.expert_group_used_count": 0}, "expert_group_used_count is 0"),
    ({"deepseek2.attention.head_count_kv": 2}, "n_head_kv(il) == 1"),
])
def test_deepseek2_hyperparameters_are_refused(tmp_path_factory: pytest.TempPathFactory,
                                               overrides: dict[str, int], reason: str) -> None:
    # expert groups that do not split the experts asserted at load (llama-model.cpp), more than one KV head under the
    # latent attention at the first graph (ggml_set_rows): the load now refuses them
    from pyllama_moe.tools import synth

    path = tmp_path_factory.getbasetemp() / "deepseek2.gguf"
    if not path.exists():
        synth.write_model(path, "tiny", arch="deepseek2", seed=1)
    got = refused(path, overrides)
    assert got.startswith("REFUSED") and reason in got, got


def test_deepseek2_key_length_mla_within_the_rope_is_refused(tmp_path: Path) -> None:
    # the latent attention's key no longer than its rotated part leaves nothing unrotated (GGML_ASSERT at load)
    from pyllama_moe.tools import synth

    path = synth.write_model(tmp_path / "deepseek2.gguf", "tiny", arch="deepseek2", seed=1)
    rot = int(gguf.GGUFReader(path).fields["deepseek2.rope.dimension_count"].contents())
    got = refused(path, {"deepseek2.attention.key_length_mla": rot})
    assert got.startswith("REFUSED load") and "n_embd_head_qk_nope >= 1" in got, got


def test_mtp_contexts_the_nextn_layer_cannot_build_are_refused(tmp_path: Path) -> None:
    # the MTP context of a glm4moe of two NextN layers, or of one whose NextN layer lacks its eh_proj, asserted in its
    # graph (glm4-moe.cpp): the context creation now fails with the reason; the trunk's context still works
    from pyllama_moe.tools import synth

    glm = synth.write_model(tmp_path / "glm4moe.gguf", "tiny", arch="glm4moe", seed=1)
    assert refused(glm, {}, mtp=True).startswith("CREATED")
    got = refused(glm, {"glm4moe.nextn_predict_layers": 2}, mtp=True)
    assert got.startswith("REFUSED context") and "n_layer_nextn == 1" in got, got
    n_layer = int(gguf.GGUFReader(glm).fields["glm4moe.block_count"].contents())
    bare = without(glm, tmp_path / "bare.gguf", tensor=f"blk.{n_layer - 1}.nextn.eh_proj.weight")
    got = refused(bare, {}, mtp=True)
    assert got.startswith("REFUSED context") and "layer.nextn.eh_proj" in got, got
    assert refused(bare, {}).startswith("CREATED")


def test_a_garbage_file_prints_nothing_without_verbose(tmp_path: Path) -> None:
    # issue #72: ggml's "gguf_init_from_reader: failed to read key-value pairs" reached stderr through logging's last
    # resort handler: the header's check read it before the load's verbosity(False) block; the exception still says it
    path = tmp_path / "garbage.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 1, 2**32) + b"\xff" * 64)
    code = ("import sys\nfrom pyllama_moe import Llama\nfrom pyllama_moe.errors import ModelLoadError\n"
            "try:\n    Llama(sys.argv[1], verbose=False)\nexcept ModelLoadError as e:\n    print('RAISED', e)\n")
    res = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "RAISED" in res.stdout, f"exit {res.returncode}: {res.stderr[-2000:]}"
    assert "failed to read key-value pairs" in res.stdout
    assert res.stderr == "", res.stderr
