"""pyllama_moe.tools.synth: random-weight GGUF models that read back right and load in llama.cpp.

Most tests use a small made-up vocabulary so that gguf.GGUFReader (seconds on a 150k-token
vocabulary) reads the files quickly; the tests taking the ``real_vocab`` fixture use the real qwen2
vocabulary. ``test_tiny_loads_in_llama`` (docstring "NATIVE") needs the compiled extension
``pyllama_moe._cffi`` and is skipped without it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from pyllama_moe.tools import synth  # noqa: E402

TINY = synth.PRESETS["tiny"]
MIB = 1 << 20
GIB = 1 << 30


# --------------------------------------------------------------------------------------------
# fixtures and helpers


@pytest.fixture(scope="session")
def real_vocab() -> Path:
    """The qwen2 vocabulary the package uses by default (a failure in CI, a skip elsewhere)."""
    try:
        return synth.default_vocab_path()
    except FileNotFoundError as e:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"no vocabulary GGUF: {e}")


@pytest.fixture(scope="session")
def real_vocab_reader(real_vocab: Path) -> Any:
    """gguf's reader over the real vocabulary (read once: it takes seconds)."""
    return gguf.GGUFReader(str(real_vocab))


@pytest.fixture(scope="session")
def small_vocab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A vocab-only GGUF of 300 made-up tokens, for tests that only read files back."""
    path = tmp_path_factory.mktemp("vocab") / "small-vocab.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list([f"tok{i}" for i in range(300)])
    w.add_token_types([1] * 299 + [3])
    w.add_token_merges(["t o", "to k"])
    w.add_eos_token_id(299)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory: pytest.TempPathFactory, small_vocab: Path) -> dict[str, Path]:
    """The tiny preset in each architecture (seed 0, no skew), with the small vocabulary."""
    d = tmp_path_factory.mktemp("tiny")
    return {arch: synth.write_model(d / f"{arch}.gguf", "tiny", arch=arch, vocab_path=small_vocab)
            for arch in synth.ARCHITECTURES}


def read(path: Path) -> Any:
    """gguf's own reader over ``path``."""
    return gguf.GGUFReader(str(path))


def value(reader: Any, key: str) -> Any:
    """The value of metadata ``key``."""
    return reader.fields[key].contents()


def tensors(reader: Any) -> dict[str, Any]:
    """The tensors of a reader, by name."""
    return {t.name: t for t in reader.tensors}


def values(t: Any) -> np.ndarray:
    """The f32 values of reader tensor ``t`` in numpy order, dequantized by gguf itself."""
    shape = tuple(reversed([int(n) for n in t.shape]))
    return gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float64)


def block_scales(t: Any, type_size: int) -> np.ndarray:
    """The f16 scale of every block of quantized reader tensor ``t``."""
    blocks = np.asarray(t.data).reshape(-1, type_size)
    return blocks[:, :2].copy().view("<f2").reshape(-1)


# --------------------------------------------------------------------------------------------
# the plan: 30B-A3B without writing 18 GiB


def test_30b_a3b_plan_sizes_and_types() -> None:
    p = synth.plan("30b-a3b")
    s = p.shape
    assert (s.arch, s.n_layer, s.n_embd, s.n_head, s.n_head_kv, s.head_dim) == ("qwen3moe", 48, 2048, 32, 4, 128)
    assert (s.n_expert, s.n_expert_used, s.n_ff_exp) == (128, 8, 768)
    assert p.n_vocab == 151936
    assert len(p.tensors) == 3 + 48 * 12
    assert p.expert_bytes == 15552 * MIB
    assert p.tensor_bytes / GIB == pytest.approx(18.08, abs=0.01)
    t = p.by_name()
    assert t["blk.0.ffn_gate_exps.weight"].shape == (2048, 768, 128)  # ggml order: ne0 = n_embd
    assert t["blk.47.ffn_down_exps.weight"].shape == (768, 2048, 128)
    assert t["blk.3.ffn_up_exps.weight"].type.name == "q4_0"
    assert t["blk.0.attn_q.weight"].shape == (2048, 4096) and t["blk.0.attn_q.weight"].type.name == "f16"
    assert t["blk.0.attn_k.weight"].shape == (2048, 512)
    assert t["blk.0.attn_output.weight"].shape == (4096, 2048)
    assert t["blk.0.attn_q_norm.weight"].shape == (128,) and t["blk.0.attn_q_norm.weight"].type.name == "f32"
    assert t["blk.0.ffn_gate_inp.weight"].shape == (2048, 128) and t["blk.0.ffn_gate_inp.weight"].type.name == "f32"
    assert t["token_embd.weight"].shape == (2048, 151936) and t["token_embd.weight"].type.name == "f16"
    assert t["output.weight"].type.name == "f16"
    roles = {x.role for x in p.tensors if x.type.name == "f32"}
    assert roles == {"norm", "router"}
    assert sum(x.role == "expert" for x in p.tensors) == 48 * 3


def test_glm_4_5_air_plan() -> None:
    p = synth.plan("glm-4.5-air")
    s = p.shape
    assert (s.arch, s.n_layer, s.n_block, s.n_embd, s.n_head, s.n_head_kv, s.head_dim, s.rot) == (
        "glm4moe", 46, 47, 4096, 96, 8, 128, 64)
    assert (s.n_expert, s.n_expert_used, s.n_ff_exp, s.n_expert_shared, s.n_ff) == (128, 8, 1408, 1, 10944)
    assert s.moe_layers == list(range(1, 46)) and s.expert_gating == 2  # a dense layer first; the NextN layer apart
    assert len(p.tensors) == 3 + 12 + 46 * 17 + 4
    assert p.expert_bytes == 46 * 3 * 4096 * 1408 * 128 // 32 * 18 == 54648 * MIB  # the NextN layer's experts too
    assert p.tensor_bytes / GIB == pytest.approx(65.88, abs=0.01)
    t = p.by_name()
    assert t["blk.0.ffn_up.weight"].shape == (4096, 10944) and "blk.0.ffn_gate_inp.weight" not in t
    assert t["blk.1.attn_q.weight"].shape == (4096, 12288) and t["blk.1.attn_q.bias"].shape == (12288,)
    assert t["blk.45.ffn_down_shexp.weight"].shape == (1408, 4096) and t["blk.45.exp_probs_b.bias"].shape == (128,)
    assert t["blk.46.ffn_up_exps.weight"].shape == (4096, 1408, 128)
    assert t["blk.46.nextn.eh_proj.weight"].shape == (8192, 4096) and "blk.46.nextn.embed_tokens.weight" not in t


def test_deepseek_v2_lite_plan() -> None:
    p = synth.plan("deepseek-v2-lite")
    s = p.shape
    assert (s.arch, s.n_layer, s.n_block, s.n_embd, s.n_head, s.n_head_kv, s.head_dim, s.rot, s.head_dim_v) == (
        "deepseek2", 27, 27, 2048, 16, 1, 192, 64, 128)
    assert (s.n_expert, s.n_expert_used, s.n_ff_exp, s.n_expert_shared, s.n_ff) == (64, 6, 1408, 2, 10944)
    assert (s.q_lora_rank, s.kv_lora_rank, s.expert_gating, s.n_expert_groups) == (0, 512, 1, 0)  # softmax, no groups
    assert s.moe_layers == list(range(1, 27))
    assert len(p.tensors) == 3 + 11 + 26 * 15
    assert p.expert_bytes == 26 * 3 * 2048 * 1408 * 64 // 32 * 18 == 7722 * MIB
    assert p.tensor_bytes / GIB == pytest.approx(9.68, abs=0.01)
    t = p.by_name()
    assert t["blk.0.attn_q.weight"].shape == (2048, 16 * 192) and "blk.0.attn_q_a.weight" not in t  # a lite model
    assert t["blk.5.attn_kv_a_mqa.weight"].shape == (2048, 512 + 64)
    assert t["blk.5.attn_k_b.weight"].shape == (128, 512, 16) and t["blk.5.attn_v_b.weight"].shape == (512, 128, 16)
    assert t["blk.26.ffn_up_shexp.weight"].shape == (2048, 2 * 1408) and "blk.26.exp_probs_b.bias" not in t


def test_plan_follows_expert_type_and_overrides() -> None:
    p = synth.plan("30b-a3b", expert_type="q8_0", n_layer=2, n_expert=16)
    exps = [x for x in p.tensors if x.role == "expert"]
    assert len(exps) == 6 and all(x.type.name == "q8_0" for x in exps)
    assert exps[0].nbytes == 2048 * 768 * 16 // 32 * 34
    dense = synth.plan("tiny", arch="qwen3")
    assert dense.shape.n_expert == 0 and not [x for x in dense.tensors if x.role in ("expert", "router")]
    assert dense.by_name()["blk.1.ffn_down.weight"].shape == (TINY.n_ff, TINY.n_embd)


def test_types_agree_with_gguf() -> None:
    for name, t in synth.GGML_TYPES.items():
        qt = gguf.GGMLQuantizationType[name.upper()]
        assert t.type_id == int(qt)
        assert (t.block_size, t.type_size) == gguf.GGML_QUANT_SIZES[qt]


# --------------------------------------------------------------------------------------------
# files read back with gguf's reader


@pytest.mark.parametrize("arch", synth.ARCHITECTURES)
def test_tiny_reads_back(arch: str, tiny_files: dict[str, Path], small_vocab: Path) -> None:
    r = read(tiny_files[arch])
    s = synth.resolve_shape("tiny", arch)
    assert value(r, "general.architecture") == arch
    # llama4, qwen3next: a full-attention layer; glm4moe, deepseek2: a dense layer, two MoE ones and a NextN layer
    assert value(r, f"{arch}.block_count") == s.n_block == (4 if arch in ("llama4", "qwen3next", "glm4moe",
                                                                          "deepseek2") else 2)
    assert value(r, f"{arch}.embedding_length") == 64
    assert value(r, f"{arch}.attention.head_count") == 4
    # olmoe: no GQA; deepseek2: the heads share the latent
    assert value(r, f"{arch}.attention.head_count_kv") == {"olmoe": 4, "deepseek2": 1}.get(arch, 2)
    if arch != "deepseek2":  # its latent attention: below
        assert value(r, f"{arch}.attention.key_length") == value(r, f"{arch}.attention.value_length") == 16
    assert value(r, f"{arch}.context_length") == s.context_length
    assert value(r, f"{arch}.attention.layer_norm_rms_epsilon") == pytest.approx(1e-6)
    assert value(r, f"{arch}.rope.freq_base") > 0
    assert value(r, "pyllama_moe.synth.preset") == "tiny"
    assert value(r, "pyllama_moe.synth.seed") == 0
    assert value(r, "pyllama_moe.synth.skew") == 0.0
    n_vocab = len(read(small_vocab).fields["tokenizer.ggml.tokens"].data)
    assert len(r.fields["tokenizer.ggml.tokens"].data) == n_vocab == 300

    want = synth.plan("tiny", arch=arch, n_vocab=n_vocab)
    got = tensors(r)
    assert list(got) == [t.name for t in want.tensors]
    for t in want.tensors:
        assert tuple(int(n) for n in got[t.name].shape) == t.shape, t.name
        assert int(got[t.name].tensor_type) == t.type.type_id, t.name
        assert int(got[t.name].n_bytes) == t.nbytes, t.name
    assert tuple(got["token_embd.weight"].shape) == (64, n_vocab)
    for name, t in got.items():
        assert np.all(np.isfinite(values(t))), name

    if arch == "qwen3":
        assert not [n for n in got if "exps" in n or "gate_inp" in n]
        assert tuple(got["blk.0.ffn_gate.weight"].shape) == (64, TINY.n_ff)
        return
    assert value(r, f"{arch}.expert_count") == 8
    assert value(r, f"{arch}.expert_used_count") == 2
    assert value(r, f"{arch}.expert_feed_forward_length") == 32
    if arch in ("llama", "olmoe", "granitemoe"):  # their loaders size the experts by feed_forward_length
        assert value(r, f"{arch}.feed_forward_length") == 32
    # n_expert x n_ff_exp x n_embd in numpy order is (n_embd, n_ff_exp, n_expert) in ggml order
    assert tuple(got["blk.1.ffn_gate_exps.weight"].shape) == (64, 32, 8)
    assert tuple(got["blk.1.ffn_up_exps.weight"].shape) == (64, 32, 8)
    assert tuple(got["blk.1.ffn_down_exps.weight"].shape) == (32, 64, 8)
    assert got["blk.1.ffn_gate_exps.weight"].tensor_type == gguf.GGMLQuantizationType.Q4_0
    assert got["blk.1.ffn_gate_inp.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    if arch == "gpt-oss":
        assert value(r, "gpt-oss.attention.sliding_window") == 128
        assert tuple(got["blk.0.ffn_gate_exps.bias"].shape) == (32, 8)
        assert tuple(got["blk.0.ffn_up_exps.bias"].shape) == (32, 8)
        assert tuple(got["blk.0.ffn_down_exps.bias"].shape) == (64, 8)
        assert tuple(got["blk.0.ffn_gate_inp.bias"].shape) == (8,)
        assert tuple(got["blk.0.attn_sinks.weight"].shape) == (4,)
        assert tuple(got["blk.0.attn_output.bias"].shape) == (64,)
        assert "blk.0.post_attention_norm.weight" in got and "blk.0.ffn_norm.weight" not in got
    elif arch == "qwen3moe":
        assert tuple(got["blk.0.attn_q_norm.weight"].shape) == (16,)
        assert "blk.0.attn_v.bias" not in got  # only a skewed qwen3moe has value biases
    elif arch == "qwen2moe":  # query, key and value biases, a shared expert of n_ff with its gate
        assert value(r, "qwen2moe.expert_shared_feed_forward_length") == TINY.n_ff
        assert tuple(got["blk.0.attn_q.bias"].shape) == (64,) and "blk.0.attn_q_norm.weight" not in got
        assert tuple(got["blk.0.ffn_gate_inp_shexp.weight"].shape) == (64,)
        assert tuple(got["blk.0.ffn_down_shexp.weight"].shape) == (TINY.n_ff, 64)
    elif arch == "ernie4_5-moe":  # a leading dense layer, a selection bias, a shared expert
        assert value(r, "ernie4_5-moe.leading_dense_block_count") == 1
        assert tuple(got["blk.0.ffn_gate.weight"].shape) == (64, TINY.n_ff) and "blk.0.ffn_gate_inp.weight" not in got
        assert tuple(got["blk.1.exp_probs_b.bias"].shape) == (8,)
        assert tuple(got["blk.1.ffn_up_shexp.weight"].shape) == (64, TINY.n_ff)
    elif arch == "glm4moe":  # GLM-4.5: DeepSeek-V3's routing, attention biases, partial RoPE, a NextN layer
        assert value(r, "glm4moe.leading_dense_block_count") == 1
        assert "glm4moe.interleave_moe_layer_step" not in r.fields  # its loader reads none
        assert value(r, "glm4moe.nextn_predict_layers") == 1 and s.n_layer == 3
        assert value(r, "glm4moe.expert_shared_count") == 1 and value(r, "glm4moe.expert_gating_func") == 2  # sigmoid
        assert value(r, "glm4moe.expert_weights_norm") is True and value(r, "glm4moe.expert_weights_scale") == 1.0
        assert value(r, "glm4moe.rope.dimension_count") == 8 and "glm4moe.expert_group_count" not in r.fields
        assert tuple(got["blk.0.ffn_gate.weight"].shape) == (64, TINY.n_ff) and "blk.0.ffn_gate_inp.weight" not in got
        assert tuple(got["blk.0.attn_k.bias"].shape) == (32,) and "blk.0.ffn_norm.weight" not in got
        assert tuple(got["blk.2.post_attention_norm.weight"].shape) == (64,)
        for il in (1, 2, 3):  # the NextN layer routes as the trunk's MoE layers
            assert tuple(got[f"blk.{il}.exp_probs_b.bias"].shape) == (8,)
            assert tuple(got[f"blk.{il}.ffn_up_shexp.weight"].shape) == (64, 32)  # one shared expert of n_ff_exp
        assert tuple(got["blk.3.nextn.eh_proj.weight"].shape) == (128, 64)
        assert {n for n in got if ".nextn." in n} == {f"blk.3.nextn.{t}.weight" for t in
                                                      ("eh_proj", "enorm", "hnorm", "shared_head_norm")}
    elif arch == "deepseek2":  # DeepSeek-V3: latent attention, GLM's routing with groups and a scale, a NextN layer
        # what the cache holds per token: the latent (32) and the rotated part of the key (8); the heads' 16 = 8 + 8
        assert (value(r, "deepseek2.attention.key_length"), value(r, "deepseek2.attention.value_length")) == (40, 32)
        assert value(r, "deepseek2.attention.key_length_mla") == 16
        assert value(r, "deepseek2.attention.value_length_mla") == value(r, "deepseek2.rope.dimension_count") == 8
        assert value(r, "deepseek2.attention.q_lora_rank") == 48 and value(r, "deepseek2.attention.kv_lora_rank") == 32
        assert value(r, "deepseek2.expert_group_count") == 4 and value(r, "deepseek2.expert_group_used_count") == 2
        assert value(r, "deepseek2.expert_gating_func") == 2 and value(r, "deepseek2.expert_weights_scale") == 2.5
        assert value(r, "deepseek2.expert_weights_norm") is True and value(r, "deepseek2.expert_shared_count") == 1
        assert value(r, "deepseek2.leading_dense_block_count") == 1 and value(r, "deepseek2.nextn_predict_layers") == 1
        assert tuple(got["blk.0.ffn_gate.weight"].shape) == (64, TINY.n_ff) and "blk.0.ffn_gate_inp.weight" not in got
        for il in (0, 3):  # the NextN layer attends as the trunk's layers
            assert tuple(got[f"blk.{il}.attn_q_a.weight"].shape) == (64, 48)
            assert tuple(got[f"blk.{il}.attn_q_b.weight"].shape) == (48, 64)  # 4 heads of 16
            assert tuple(got[f"blk.{il}.attn_kv_a_mqa.weight"].shape) == (64, 40)
            assert tuple(got[f"blk.{il}.attn_k_b.weight"].shape) == (8, 32, 4)  # latent -> the unrotated key
            assert tuple(got[f"blk.{il}.attn_v_b.weight"].shape) == (32, 8, 4)  # latent -> the value
            assert tuple(got[f"blk.{il}.attn_output.weight"].shape) == (32, 64)
            assert tuple(got[f"blk.{il}.attn_kv_a_norm.weight"].shape) == (32,) and f"blk.{il}.attn_q.weight" not in got
        assert tuple(got["blk.3.exp_probs_b.bias"].shape) == (8,) and tuple(got["blk.3.ffn_norm.weight"].shape) == (64,)
        assert tuple(got["blk.2.ffn_down_shexp.weight"].shape) == (32, 64)
        assert tuple(got["blk.3.nextn.eh_proj.weight"].shape) == (128, 64)
    elif arch == "qwen3next":  # three layers of linear attention, one of full attention with gated queries
        assert value(r, "qwen3next.full_attention_interval") == 4 and value(r, "qwen3next.ssm.conv_kernel") == 4
        assert value(r, "qwen3next.ssm.inner_size") == 64 and value(r, "qwen3next.ssm.state_size") == 16
        assert value(r, "qwen3next.ssm.time_step_rank") == 4 and value(r, "qwen3next.ssm.group_count") == 2
        assert value(r, "qwen3next.rope.dimension_count") == 4  # a quarter of the head rotated
        assert value(r, "qwen3next.expert_shared_feed_forward_length") == TINY.n_ff
        for il in (0, 1, 2):  # the gated delta net: 2 key heads and 4 value heads of 16
            assert tuple(got[f"blk.{il}.attn_qkv.weight"].shape) == (64, 2 * 32 + 64)
            assert tuple(got[f"blk.{il}.attn_gate.weight"].shape) == (64, 64)
            assert tuple(got[f"blk.{il}.ssm_conv1d.weight"].shape) == (4, 128)
            assert tuple(got[f"blk.{il}.ssm_ba.weight"].shape) == (64, 8)
            assert tuple(got[f"blk.{il}.ssm_norm.weight"].shape) == (16,)
            assert tuple(got[f"blk.{il}.ssm_out.weight"].shape) == (64, 64)
            assert tuple(got[f"blk.{il}.ssm_dt.bias"].shape) == (4,) and f"blk.{il}.attn_q.weight" not in got
            decay = values(got[f"blk.{il}.ssm_a"])
            assert decay.shape == (4,) and np.all((-16 <= decay) & (decay <= -1))  # -exp(A_log): the state decays
        assert tuple(got["blk.3.attn_q.weight"].shape) == (64, 2 * 64)  # each head's query and its gate
        assert tuple(got["blk.3.attn_k_norm.weight"].shape) == (16,) and "blk.3.attn_qkv.weight" not in got
        for il in range(4):  # every layer a MoE with a gated shared expert
            assert tuple(got[f"blk.{il}.ffn_gate_inp_shexp.weight"].shape) == (64,)
            assert tuple(got[f"blk.{il}.ffn_up_shexp.weight"].shape) == (64, TINY.n_ff)
            assert tuple(got[f"blk.{il}.post_attention_norm.weight"].shape) == (64,)
    elif arch == "llama4":  # MoE every other layer, a shared expert as wide as the experts
        assert value(r, "llama4.interleave_moe_layer_step") == 2
        assert tuple(got["blk.0.ffn_gate.weight"].shape) == (64, TINY.n_ff) and "blk.0.ffn_gate_inp.weight" not in got
        assert tuple(got["blk.1.ffn_up_shexp.weight"].shape) == (64, 32)
    elif arch == "olmoe":  # query and key norms over the whole width
        assert tuple(got["blk.0.attn_k_norm.weight"].shape) == (64,)
    else:  # llama with experts (Mixtral), granitemoe: neither norms nor biases in attention
        assert not [n for n in got if "attn_q_norm" in n or n.endswith(".bias")]
        if arch == "granitemoe":
            assert value(r, "granitemoe.logit_scale") == 6.0 and value(r, "granitemoe.attention.scale") == 1 / 16


def test_real_vocab_tiny_is_small_and_has_the_full_tokenizer(real_vocab: Path, real_vocab_reader: Any,
                                                             tmp_path: Path) -> None:
    path = synth.write_model(tmp_path / "tiny.gguf", "tiny", vocab_path=real_vocab)
    vocab, r = real_vocab_reader, read(path)
    n_vocab = len(vocab.fields["tokenizer.ggml.tokens"].data)
    assert len(r.fields["tokenizer.ggml.tokens"].data) == n_vocab
    keys = sorted(k for k in vocab.fields if k.startswith("tokenizer."))
    assert keys == sorted(k for k in r.fields if k.startswith("tokenizer."))
    for key in keys:
        if key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
            field = vocab.fields[key]
            assert r.fields[key].contents(slice(0, 50)) == field.contents(slice(0, 50)), key
            assert r.fields[key].contents(-1) == field.contents(-1), key
            assert len(r.fields[key].data) == len(field.data), key
        else:
            assert r.fields[key].contents() == vocab.fields[key].contents(), key
    assert tuple(tensors(r)["output.weight"].shape) == (64, n_vocab)
    vocab_sized = sum(int(t.n_bytes) for t in r.tensors if t.name in ("token_embd.weight", "output.weight"))
    other = sum(int(t.n_bytes) for t in r.tensors) - vocab_sized
    assert other < 1 * MIB  # the layers of the tiny preset are a few hundred KiB
    assert path.stat().st_size < 48 * MIB  # embedding + output + tokenizer, about 43 MiB


def test_vocab_copy_matches_gguf_reader(real_vocab: Path, real_vocab_reader: Any) -> None:
    mine = {k: v for k, v, _t, _s in synth.vocab._load_vocab(real_vocab).entries}
    ref = real_vocab_reader.fields
    assert sorted(mine) == sorted(k for k in ref if k.startswith("tokenizer."))
    assert ([b.decode() for b in mine["tokenizer.ggml.tokens"][:100]]
            == ref["tokenizer.ggml.tokens"].contents(slice(0, 100)))
    assert mine["tokenizer.ggml.token_type"] == ref["tokenizer.ggml.token_type"].contents()
    assert mine["tokenizer.ggml.eos_token_id"] == ref["tokenizer.ggml.eos_token_id"].contents()
    assert mine["tokenizer.ggml.pre"].decode() == ref["tokenizer.ggml.pre"].contents()


# --------------------------------------------------------------------------------------------
# weight values


@pytest.mark.parametrize("expert_type", ["q4_0", "q8_0"])
@pytest.mark.parametrize("skew", [0.0, 1.0])
def test_quantized_expert_blocks(expert_type: str, skew: float, small_vocab: Path, tmp_path: Path) -> None:
    path = synth.write_model(tmp_path / "m.gguf", "tiny", expert_type=expert_type, vocab_path=small_vocab, n_layer=1,
                             skew=skew)
    reader = read(path)
    t = tensors(reader)["blk.0.ffn_up_exps.weight"]
    assert t.tensor_type == gguf.GGMLQuantizationType[expert_type.upper()]
    typ = synth.GGML_TYPES[expert_type]
    scales = block_scales(t, typ.type_size).astype(np.float64)
    assert np.all(np.isfinite(scales))
    want = 0.02 if expert_type == "q4_0" else synth.EXPERT_RMS / math.sqrt(5461.5)
    assert np.allclose(np.abs(scales), np.float16(want), rtol=0)  # one magnitude
    v = values(t)
    assert np.array_equal(v.reshape(-1), synth.decode(np.asarray(t.data), expert_type).astype(np.float64))
    assert np.std(v) == pytest.approx(synth.EXPERT_RMS, rel=0.05)
    signs = reader.fields["pyllama_moe.synth.scale_signs"].contents()
    if skew:  # auto: random signs, zero-mean weights
        assert signs == "random"
        assert 0.3 < np.mean(scales > 0) < 0.7
        assert abs(np.mean(v)) < 0.05 * synth.EXPERT_RMS
    else:  # auto: positive scales, the baseline's model (q4_0 nibbles average 7.5: mean -0.5 * scale)
        assert signs == "positive"
        assert np.all(scales > 0)
        if expert_type == "q4_0":
            assert np.mean(v) == pytest.approx(-0.01, rel=0.05)
    assert not np.array_equal(v[0], v[1])  # experts differ
    assert len({tuple(np.round(v[e, 0, :8], 6)) for e in range(8)}) == 8


def test_scale_signs_override_and_errors(small_vocab: Path, tmp_path: Path) -> None:
    assert synth.plan("tiny").scale_signs == "positive"
    assert synth.plan("tiny", skew=0.5).scale_signs == "random"
    assert synth.plan("tiny", scale_signs="random").scale_signs == "random"
    with pytest.raises(ValueError, match="scale_signs must be one of"):
        synth.plan("tiny", scale_signs="negative")
    path = synth.write_model(tmp_path / "r.gguf", "tiny", vocab_path=small_vocab, n_layer=1, scale_signs="random")
    scales = block_scales(tensors(read(path))["blk.0.ffn_down_exps.weight"], 18)
    assert 0.3 < np.mean(scales > 0) < 0.7
    assert synth.main([str(tmp_path / "x.gguf"), "--plan", "--scale-signs", "random"]) == 0


@pytest.mark.parametrize("expert_type", ["f16", "f32"])
def test_float_expert_types(expert_type: str, small_vocab: Path, tmp_path: Path) -> None:
    path = synth.write_model(tmp_path / "m.gguf", "tiny", expert_type=expert_type, vocab_path=small_vocab)
    got = tensors(read(path))
    t = got["blk.1.ffn_down_exps.weight"]
    assert t.tensor_type == gguf.GGMLQuantizationType[expert_type.upper()]
    v = values(t)
    assert v.shape == (8, 64, 32) and np.all(np.isfinite(v))
    assert np.std(v) == pytest.approx(synth.EXPERT_RMS, rel=0.05)
    router = values(got["blk.1.ffn_gate_inp.weight"])
    assert np.std(router) == pytest.approx(synth.ROUTER_STD, rel=0.15)
    assert np.all(values(got["blk.1.ffn_norm.weight"]) == 1.0)


def test_dense_type_and_custom_shape(small_vocab: Path, tmp_path: Path) -> None:
    path = synth.write_model(tmp_path / "m.gguf", "tiny", dense_type="q8_0", vocab_path=small_vocab,
                             n_layer=3, n_embd=96, n_head=6, n_head_kv=3, head_dim=32, n_expert=4,
                             n_expert_used=3, n_ff_exp=64, context_length=1234)
    r = read(path)
    got = tensors(r)
    assert value(r, "qwen3moe.block_count") == 3 and value(r, "qwen3moe.context_length") == 1234
    assert got["blk.2.attn_q.weight"].tensor_type == gguf.GGMLQuantizationType.Q8_0
    assert tuple(got["blk.2.attn_q.weight"].shape) == (96, 192)
    assert tuple(got["blk.2.ffn_gate_exps.weight"].shape) == (96, 64, 4)
    assert np.std(values(got["blk.0.attn_output.weight"])) == pytest.approx(synth.DENSE_STD, rel=0.1)


# --------------------------------------------------------------------------------------------
# determinism


def test_same_seed_same_bytes_other_seed_other_bytes(small_vocab: Path, tmp_path: Path) -> None:
    a = synth.write_model(tmp_path / "a.gguf", "tiny", seed=7, vocab_path=small_vocab, threads=1)
    b = synth.write_model(tmp_path / "b.gguf", "tiny", seed=7, vocab_path=small_vocab, threads=3)
    c = synth.write_model(tmp_path / "c.gguf", "tiny", seed=8, vocab_path=small_vocab)
    assert a.read_bytes() == b.read_bytes()
    assert a.stat().st_size == c.stat().st_size and a.read_bytes() != c.read_bytes()
    ta, tc = tensors(read(a)), tensors(read(c))
    assert not np.array_equal(np.asarray(ta["blk.0.ffn_gate_exps.weight"].data),
                              np.asarray(tc["blk.0.ffn_gate_exps.weight"].data))
    assert not list(tmp_path.glob("*.partial"))


# --------------------------------------------------------------------------------------------
# router skew


@pytest.mark.parametrize("arch", ["qwen3moe", "gpt-oss"])
def test_skew_is_recorded_and_touches_only_the_routing(arch: str, small_vocab: Path, tmp_path: Path) -> None:
    plain = synth.write_model(tmp_path / "plain.gguf", "tiny", arch=arch, seed=3, vocab_path=small_vocab,
                              n_expert=16, n_expert_used=4, scale_signs="random")  # the skewed model's signs
    skewed = synth.write_model(tmp_path / "skew.gguf", "tiny", arch=arch, seed=3, skew=1.5, vocab_path=small_vocab,
                               n_expert=16, n_expert_used=4)
    rp, rs = read(plain), read(skewed)
    assert value(rs, "pyllama_moe.synth.skew") == pytest.approx(1.5)
    assert value(rs, "pyllama_moe.synth.seed") == 3
    n_hot = value(rs, "pyllama_moe.synth.hot_experts_per_layer")
    assert n_hot == 2
    hot = np.array(value(rs, "pyllama_moe.synth.hot_experts")).reshape(2, n_hot)
    assert np.all((0 <= hot) & (hot < 16)) and all(len(set(row)) == n_hot for row in hot)
    boost = value(rs, "pyllama_moe.synth.hot_boost")
    assert boost[0] == pytest.approx(3 * 1.5) and boost[1] < boost[0]
    assert "pyllama_moe.synth.hot_experts" not in rp.fields

    tp, ts = tensors(rp), tensors(rs)
    changed = {n for n in tp if not np.array_equal(np.asarray(tp[n].data), np.asarray(ts[n].data))}
    router = "weight" if arch == "qwen3moe" else "bias"  # gpt-oss: its router bias takes the boost
    assert changed == {f"blk.{il}.ffn_gate_inp.{router}" for il in range(2)}
    added = set(ts) - set(tp)
    if arch == "qwen3moe":
        assert added == {"blk.0.attn_v.bias", "blk.1.attn_v.bias"}
        for il in range(2):
            w = values(ts[f"blk.{il}.ffn_gate_inp.weight"])  # (n_expert, n_embd)
            norms = np.linalg.norm(w - values(tp[f"blk.{il}.ffn_gate_inp.weight"]), axis=1)
            assert set(np.argsort(-norms)[:n_hot]) == set(hot[il])
    else:
        assert not added
        for il in range(2):
            bias = values(ts[f"blk.{il}.ffn_gate_inp.bias"]) - values(tp[f"blk.{il}.ffn_gate_inp.bias"])
            logit_std = synth.ROUTER_STD * math.sqrt(64)
            assert bias[hot[il][0]] == pytest.approx(boost[0] * logit_std, rel=1e-5)
            assert np.count_nonzero(bias) == n_hot


def _rms_norm(x: np.ndarray, w: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def route_qwen3moe(path: Path, tokens: np.ndarray) -> list[np.ndarray]:
    """The experts each layer picks for ``tokens``: a plain numpy forward of a qwen3moe GGUF.

    RoPE is left out: with random weights it changes which earlier tokens attention favours, not
    the statistics of the routing that the tests compare.
    """
    r = read(path)
    w = {t.name: values(t) for t in r.tensors}
    n_layer, n_head = value(r, "qwen3moe.block_count"), value(r, "qwen3moe.attention.head_count")
    n_kv, hd = value(r, "qwen3moe.attention.head_count_kv"), value(r, "qwen3moe.attention.key_length")
    k_used = value(r, "qwen3moe.expert_used_count")
    n = len(tokens)
    x = w["token_embd.weight"][tokens]
    causal = np.triu(np.ones((n, n), dtype=bool), 1)
    picks = []
    for il in range(n_layer):
        p = f"blk.{il}."
        h = _rms_norm(x, w[p + "attn_norm.weight"])
        q = _rms_norm((h @ w[p + "attn_q.weight"].T).reshape(n, n_head, hd), w[p + "attn_q_norm.weight"])
        k = _rms_norm((h @ w[p + "attn_k.weight"].T).reshape(n, n_kv, hd), w[p + "attn_k_norm.weight"])
        v = (h @ w[p + "attn_v.weight"].T + w.get(p + "attn_v.bias", 0.0)).reshape(n, n_kv, hd)
        out = np.empty((n, n_head, hd))
        for head in range(n_head):
            kv = head // (n_head // n_kv)
            s = q[:, head] @ k[:, kv].T / math.sqrt(hd)
            s[causal] = -np.inf
            e = np.exp(s - s.max(axis=1, keepdims=True))
            out[:, head] = (e / e.sum(axis=1, keepdims=True)) @ v[:, kv]
        x = x + out.reshape(n, -1) @ w[p + "attn_output.weight"].T
        h = _rms_norm(x, w[p + "ffn_norm.weight"])
        logits = h @ w[p + "ffn_gate_inp.weight"].T
        top = np.argsort(-logits, axis=1)[:, :k_used]
        picks.append(top)
        tl = np.take_along_axis(logits, top, axis=1)
        gate = np.exp(tl - tl[:, :1])
        gate /= gate.sum(axis=1, keepdims=True)
        moe = np.zeros_like(x)
        for t in range(n):
            for j, ex in enumerate(top[t]):
                a = w[p + "ffn_gate_exps.weight"][ex] @ h[t]
                b = w[p + "ffn_up_exps.weight"][ex] @ h[t]
                moe[t] += gate[t, j] * (w[p + "ffn_down_exps.weight"][ex] @ (a / (1 + np.exp(-a)) * b))
        x = x + moe
    return picks


def test_skew_makes_hot_experts_win_and_routing_sticky(small_vocab: Path, tmp_path: Path) -> None:
    shape: dict[str, Any] = dict(n_layer=3, n_embd=128, n_expert=32, n_expert_used=4, n_ff_exp=64)
    tokens = np.random.default_rng(5).integers(0, 300, 96)
    stats = {}
    for skew in (0.0, 1.0):
        path = synth.write_model(tmp_path / f"s{skew}.gguf", "tiny", seed=11, skew=skew, vocab_path=small_vocab,
                                 **shape)
        picks = route_qwen3moe(path, tokens)
        stats[skew] = picks
    hot = np.array(value(read(tmp_path / "s1.0.gguf"), "pyllama_moe.synth.hot_experts")).reshape(3, -1)

    def hot_share(picks: list[np.ndarray]) -> float:
        """Fraction of (token, layer) pairs that picked the layer's hottest expert."""
        return float(np.mean([np.mean(np.any(top == hot[il][0], axis=1)) for il, top in enumerate(picks)]))

    def overlap(picks: list[np.ndarray]) -> float:
        """Mean share of experts a token reuses from the previous token."""
        return float(np.mean([len(set(top[t]) & set(top[t - 1])) / top.shape[1]
                              for top in picks for t in range(1, len(top))]))

    assert hot_share(stats[1.0]) > 0.8  # against 4/32 = 0.125 for a uniform router
    assert hot_share(stats[0.0]) < 0.5
    assert overlap(stats[1.0]) > overlap(stats[0.0]) + 0.15


# --------------------------------------------------------------------------------------------
# errors


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"preset": "huge"}, "preset"),
        ({"arch": "mixtral"}, "arch"),  # Mixtral is llama with experts
        ({"expert_type": "q5_k"}, "expert_type"),
        ({"dense_type": "bf16"}, "dense_type"),
        ({"n_expert_used": 9}, "n_expert_used"),
        ({"n_expert": 0}, "n_expert"),
        ({"n_layer": 0}, "n_layer"),
        ({"n_head": 5}, "n_head"),
        ({"n_embd": 48}, "expert_type"),  # q4_0 rows must be whole 32-value blocks
        ({"n_ff_exp": 40}, "expert_type"),
        ({"head_dim": 15}, "head_dim"),
        ({"n_layer": 2.5}, "n_layer"),
        ({"rms_eps": -1.0}, "rms_eps"),
        ({"skew": -0.1}, "skew"),
        ({"skew": float("nan")}, "skew"),
        ({"arch": "qwen3", "skew": 0.5}, "skew"),
        ({"arch": "qwen3", "n_expert": 8}, "n_expert"),
        ({"n_experts": 8}, "n_experts"),
        ({"arch": "qwen2moe", "skew": 0.5}, "skew"),  # no router bias or value bias to steer
        ({"arch": "qwen2moe", "head_dim": 32}, r"n_head \* head_dim"),  # its attention output is n_embd square
        ({"arch": "olmoe", "n_head_kv": 2}, "n_head_kv"),
        ({"arch": "llama4", "n_layer": 3}, "n_layer"),  # b11549 aborts without a full-attention layer
        ({"arch": "qwen3next", "n_layer": 3}, "n_layer"),  # so it does for qwen3next
        ({"arch": "qwen3next", "n_rot": 18}, "n_rot"),
        ({"n_nextn": 1}, "n_nextn is for the deepseek2, glm4moe"),  # DeepSeek-V3's routing's fields: not qwen3moe's
        ({"expert_weights_scale": 2.5}, "expert_weights_scale"),
        ({"arch": "glm4moe", "n_nextn": 2}, "n_nextn"),  # b11549's NextN graph aborts on two
        ({"arch": "glm4moe", "expert_gating": 3}, "expert_gating"),
        ({"arch": "glm4moe", "n_rot": 18}, "n_rot"),
        ({"arch": "glm4moe", "n_expert_groups": 8}, "n_expert_groups"),  # b11549 asserts fewer groups than experts
        ({"arch": "glm4moe", "n_expert_groups": 3, "n_group_used": 1}, "multiple of n_expert_groups"),
        ({"arch": "glm4moe", "n_expert_groups": 4, "n_group_used": 4}, "n_group_used"),  # it asserts fewer used
        ({"arch": "glm4moe", "n_expert_groups": 4, "n_group_used": 1, "n_expert_used": 3}, "n_expert_used"),
        ({"arch": "glm4moe", "kv_lora_rank": 32}, "kv_lora_rank is for the deepseek2"),
        ({"arch": "deepseek2", "n_head_kv": 2}, "n_head_kv"),  # b11549 aborts: the heads share the latent
        ({"arch": "deepseek2", "n_rot": 16}, "n_rot"),  # b11549 aborts without an unrotated part of the key
        ({"arch": "deepseek2", "kv_lora_rank": 0}, "kv_lora_rank"),
        ({"arch": "deepseek2", "q_lora_rank": 0}, "q_lora_rank"),  # b11549's NextN graph aborts without it
        # b11549 takes 27 layers for V2-Lite, and reads no q_lora_rank
        ({"arch": "deepseek2", "n_layer": 27, "q_lora_rank": 48, "n_nextn": 0}, "q_lora_rank"),
        ({"arch": "deepseek2", "dense_type": "q8_0"}, "dense_type q8_0 needs q_lora_rank"),  # rows of 48 values
    ],
)
def test_bad_parameters_raise_value_error(kwargs: dict[str, Any], param: str) -> None:
    preset = kwargs.pop("preset", "tiny")
    with pytest.raises(ValueError, match=param):
        synth.plan(preset, **kwargs)


def test_arch_defaults_follow_the_given_widths() -> None:
    assert synth.resolve_shape("tiny", "glm4moe", head_dim=32, n_head=2).n_rot == 16  # half the head rotated
    assert synth.resolve_shape("tiny", "qwen3next", head_dim=32, n_head=2).n_rot == 8  # a quarter
    s = synth.resolve_shape("tiny", "deepseek2", n_expert=6, n_embd=128)
    assert (s.n_expert_groups, s.n_group_used, s.q_lora_rank, s.kv_lora_rank) == (2, 1, 96, 64)
    assert synth.resolve_shape("tiny", "deepseek2", n_expert_used=6).n_expert_groups == 0  # 6 of 8: no room for groups
    lite = synth.resolve_shape("tiny", "deepseek2", n_layer=27)  # read as V2-Lite: no q_lora_rank, so no NextN layer
    assert (lite.q_lora_rank, lite.n_nextn) == (0, 0)
    assert synth.resolve_shape("tiny", "deepseek2", n_rot=4).n_rot == 4  # what is given wins
    with pytest.raises(ValueError, match="head_dim must be an integer"):
        synth.resolve_shape("tiny", "glm4moe", head_dim="16")


def test_bad_write_arguments(small_vocab: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="seed"):
        synth.write_model(tmp_path / "x.gguf", seed=-1, vocab_path=small_vocab)
    with pytest.raises(ValueError, match="threads"):
        synth.write_model(tmp_path / "x.gguf", threads=0, vocab_path=small_vocab)
    with pytest.raises(FileNotFoundError, match="vocab_path"):
        synth.write_model(tmp_path / "x.gguf", vocab_path=tmp_path / "missing.gguf")
    not_gguf = tmp_path / "not.gguf"
    not_gguf.write_bytes(b"hello world, not a gguf file at all")
    with pytest.raises(ValueError, match="vocab_path"):
        synth.write_model(tmp_path / "x.gguf", vocab_path=not_gguf)
    assert not list(tmp_path.glob("x.gguf*"))


def test_default_vocab_path_env(monkeypatch: pytest.MonkeyPatch, small_vocab: Path, tmp_path: Path) -> None:
    monkeypatch.setenv("PYLLAMA_MOE_VOCAB", str(small_vocab))
    assert synth.default_vocab_path() == small_vocab
    monkeypatch.setenv("PYLLAMA_MOE_VOCAB", str(tmp_path / "nope.gguf"))
    with pytest.raises(FileNotFoundError, match="PYLLAMA_MOE_VOCAB"):
        synth.default_vocab_path()


def test_default_vocab_path_fallbacks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("PYLLAMA_MOE_VOCAB", raising=False)
    fake_module = tmp_path / "repo" / "pyllama_moe" / "synth.py"
    fake_module.parent.mkdir(parents=True)
    monkeypatch.setattr(synth, "__file__", str(fake_module))
    import pyllama_moe

    monkeypatch.setattr(pyllama_moe, "__path__", [str(fake_module.parent)])  # the package's folders
    with pytest.raises(FileNotFoundError, match="PYLLAMA_MOE_VOCAB"):
        synth.default_vocab_path()
    vendored = tmp_path / "repo" / "vendor" / "llama.cpp" / "models" / "ggml-vocab-qwen2.gguf"
    vendored.parent.mkdir(parents=True)
    vendored.write_bytes(b"x")
    assert synth.default_vocab_path() == vendored
    packaged = fake_module.parent / "data" / "ggml-vocab-qwen2.gguf"
    packaged.parent.mkdir()
    packaged.write_bytes(b"x")
    assert synth.default_vocab_path() == packaged


# --------------------------------------------------------------------------------------------
# command line


def test_cli_writes_a_model(small_vocab: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli.gguf"
    rc = synth.main([str(out), "--arch", "qwen3", "--n-layer", "3", "--n-ff", "96", "--expert-type", "f16",
                     "--seed", "4", "--vocab", str(small_vocab), "--quiet"])
    assert rc == 0
    assert str(out) in capsys.readouterr().out
    r = read(out)
    assert value(r, "qwen3.block_count") == 3 and value(r, "qwen3.feed_forward_length") == 96
    assert value(r, "pyllama_moe.synth.seed") == 4
    assert tensors(r)["blk.2.ffn_up.weight"].tensor_type == gguf.GGMLQuantizationType.F16


def test_cli_rejects_bad_shape(small_vocab: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = synth.main([str(tmp_path / "bad.gguf"), "--n-expert-used", "9", "--vocab", str(small_vocab), "-q"])
    assert rc == 2
    assert "n_expert_used" in capsys.readouterr().err
    assert not (tmp_path / "bad.gguf").exists()


def test_cli_plan_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert synth.main([str(tmp_path / "big.gguf"), "--preset", "30b-a3b", "--plan"]) == 0
    text = capsys.readouterr().out
    assert "blk.47.ffn_down_exps.weight" in text and "18.082 GiB" in text and "15552 MiB" in text
    assert not (tmp_path / "big.gguf").exists()


# --------------------------------------------------------------------------------------------
# llama.cpp itself (needs the compiled extension)


@pytest.fixture
def llama_lib() -> Iterator[Any]:
    """``(ffi, lib)`` of the package's cffi binding, with the backend initialised."""
    pytest.importorskip("pyllama_moe._cffi", reason="native part not built")
    from pyllama_moe.ffi import ffi, lib

    lib.llama_backend_init()
    yield ffi, lib


@pytest.mark.parametrize(("arch", "skew"), [("qwen3moe", 0.0), ("qwen3moe", 1.0), ("gpt-oss", 1.0), ("qwen3", 0.0),
                                           ("qwen2moe", 0.0), ("olmoe", 0.0), ("llama", 0.0), ("granitemoe", 0.0),
                                           ("ernie4_5-moe", 0.0), ("llama4", 0.0), ("glm4moe", 0.0),
                                           ("deepseek2", 0.0), ("qwen3next", 0.0)])
def test_tiny_loads_in_llama(llama_lib: Any, real_vocab: Path, tmp_path: Path, arch: str, skew: float) -> None:
    """NATIVE: the tiny model loads in the built llama.cpp and decodes to finite logits."""
    ffi, lib = llama_lib
    path = synth.write_model(tmp_path / "tiny.gguf", "tiny", arch=arch, vocab_path=real_vocab, skew=skew)
    mparams = lib.llama_model_default_params()
    mparams.n_gpu_layers = 0
    model = lib.llama_model_load_from_file(str(path).encode(), mparams)
    assert model != ffi.NULL
    try:
        assert lib.llama_model_n_embd(model) == TINY.n_embd
        assert lib.llama_model_n_layer(model) == synth.resolve_shape("tiny", arch).n_layer
        n_vocab = lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(model))
        assert n_vocab == synth.vocab._load_vocab(real_vocab).n_tokens
        assert lib.llama_model_n_params(model) > 2 * n_vocab * TINY.n_embd
        cparams = lib.llama_context_default_params()
        cparams.n_ctx = 64
        cparams.n_batch = 16
        cparams.n_ubatch = 16
        cparams.n_threads = cparams.n_threads_batch = 1
        ctx = lib.llama_init_from_model(model, cparams)
        assert ctx != ffi.NULL
        try:
            tokens = ffi.new("llama_token[]", [9707, 1879, 11, 1246, 525])
            assert lib.llama_decode(ctx, lib.llama_batch_get_one(tokens, len(tokens))) == 0
            logits = lib.llama_get_logits_ith(ctx, -1)
            assert logits != ffi.NULL
            row = np.frombuffer(ffi.buffer(logits, n_vocab * 4), dtype=np.float32)
            assert np.all(np.isfinite(row)) and np.std(row) > 0
        finally:
            lib.llama_free(ctx)
    finally:
        lib.llama_model_free(model)


# --------------------------------------------------------------------------------------------
# realistic routing (pyllama_moe.tools.synth.routing)


def test_routing_regimes_and_their_errors() -> None:
    assert synth.plan("tiny").regime == "collapsed"
    assert synth.plan("tiny", routing="uniform").regime == "uniform"
    assert synth.plan("tiny", routing="uniform").scale_signs == "random"
    assert synth.plan("tiny", skew=0.5).regime == "skew"
    p = synth.plan("tiny", routing="realistic")
    assert p.regime == "realistic" and p.scale_signs == "random"
    assert synth.plan("tiny", routing="dispersed").regime == "dispersed"
    assert {t.name for t in p.tensors if t.init == "routed"} == {
        "token_embd.weight", "blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight",
        "blk.0.attn_output.weight", "blk.1.attn_output.weight", "blk.0.ffn_down_exps.weight",
        "blk.1.ffn_down_exps.weight"}
    # the same tensors, sizes and types as the other regimes: the same compute
    assert synth.plan("30b-a3b", routing="realistic").rows() == synth.plan("30b-a3b").rows()
    assert synth.plan("30b-a3b", routing="dispersed").rows() == synth.plan("30b-a3b").rows()
    for kwargs, match in [({"routing": "trained"}, "routing must be one of"),
                          ({"routing": "realistic", "arch": "gpt-oss"}, "needs the qwen3moe arch"),
                          ({"routing": "realistic", "skew": 0.3}, "both set the routing"),
                          ({"routing": "collapsed", "scale_signs": "random"}, "needs scale_signs='positive'"),
                          ({"routing": "dispersed", "arch": "qwen3"}, "needs the qwen3moe arch"),
                          ({"routing": "realistic", "n_embd": 32}, "calibrated routing needs n_embd >=")]:
        with pytest.raises(ValueError, match=match):
            synth.plan("tiny", **kwargs)


@pytest.mark.parametrize("regime", ["realistic", "dispersed"])
def test_calibrated_weights_route_through_their_subspace(regime: str, small_vocab: Path, tmp_path: Path) -> None:
    from pyllama_moe.tools.synth import routing as synth_routing

    kw = {"seed": 4, "vocab_path": small_vocab, "n_layer": 3, "routing": regime}
    path = synth.write_model(tmp_path / "r.gguf", "tiny", threads=1, **kw)
    assert path.read_bytes() == synth.write_model(tmp_path / "r3.gguf", "tiny", threads=3, **kw).read_bytes()
    reader = read(path)
    assert reader.fields["pyllama_moe.synth.routing"].contents() == regime
    got = tensors(reader)
    regime_ = synth_routing.REGIMES[regime]
    lay = synth_routing.layout(TINY.n_embd, TINY.head_dim, TINY.n_expert, 3, TINY.rope_freq_base, regime_.window)
    assert lay.n_bank == 2 and lay.d_new >= 1 and lay.pairs
    drift = synth_routing.drift_layer(3) if regime_.a_drift else 0  # the drift head's layer (dispersed: the last)
    assert drift == (2 if regime == "dispersed" else 0)
    emb = values(got["token_embd.weight"])  # [n_vocab, n_embd]
    assert np.allclose(emb[:, lay.c], synth_routing.C_MAG, rtol=1e-3)
    tok_norm = np.linalg.norm(emb[:, lay.tok], axis=1)
    assert np.allclose(tok_norm, synth_routing.T_MAG, rtol=1e-2) and np.all(emb[:, lay.ctx] == 0)
    assert len({tuple(np.round(r, 3)) for r in emb[:50, lay.tok]}) == 50  # a vector per token
    for il in range(3):
        router = values(got[f"blk.{il}.ffn_gate_inp.weight"])
        assert np.all(router[:, : lay.c] == 0)  # selection reads the subspace only
        # layer il reads what the experts of the layers before it wrote (here all: a_old reaches 2 layers back)
        banks_read = [b for b in range(lay.n_bank) if np.any(router[:, lay.bank(b)] != 0)]
        assert banks_read == list(range(il)) and len(regime_.a_old) >= 1
        down = values(got[f"blk.{il}.ffn_down_exps.weight"])  # [n_expert, n_embd, n_ff_exp]
        written = np.flatnonzero(np.any(down != 0, axis=(0, 2))[lay.c:]) + lay.c
        want = list(range(lay.bank(il).start, lay.bank(il).stop)) if il < lay.n_bank else []
        assert written.tolist() == want
        out = values(got[f"blk.{il}.attn_output.weight"])  # [n_embd, n_q]
        # only the recency head (head 0 of layer 0) writes the context dimensions, only the drift head (head 0 of the
        # drift layer, dispersed's) the token dimensions
        written = lay.ctx if il == 0 else lay.tok if drift and il == drift else slice(lay.c, lay.c)
        rest = np.ones(TINY.n_embd, dtype=bool)
        rest[written] = False
        assert np.all(out[lay.c:][rest[lay.c:]] == 0)
        assert np.all(out[written, TINY.head_dim:] == 0)
        assert np.any(out[written, : TINY.head_dim] != 0) == (written.stop > written.start)
    # the recency heads' query and key: the constant dimension only, on their windows' rotary pairs; their value
    # reads the token dimensions (layer 0) or the banks of the layers before (the drift head)
    heads = {0: (lay.pairs, lay.tok)}
    if drift:
        heads[drift] = (synth_routing.rotary_pairs(TINY.head_dim, TINY.rope_freq_base, regime_.drift_window),
                        slice(lay.bank(0).start, lay.bank(drift - 1).stop))
    for il, (head_pairs, reads) in heads.items():
        for name in ("attn_q", "attn_k"):
            w = values(got[f"blk.{il}.{name}.weight"])[: TINY.head_dim]
            assert np.all(np.delete(w, lay.c, axis=1) == 0)
            pairs = [*head_pairs, *(p + TINY.head_dim // 2 for p in head_pairs)]
            assert np.flatnonzero(w[:, lay.c]).tolist() == sorted(pairs)
        v = values(got[f"blk.{il}.attn_v.weight"])[: TINY.head_dim]
        assert np.all(np.delete(v, np.arange(reads.start, reads.stop), axis=1) == 0) and np.any(v[:, reads] != 0)
        # the query norm: ones, the regime's sharpness on the head's rotary dimensions
        q_norm = values(got[f"blk.{il}.attn_q_norm.weight"])
        assert np.allclose(q_norm[pairs], regime_.sharpness) and np.all(np.delete(q_norm, pairs) == 1)
    # outside the routing tensors, the calibrated model is the uniform one of its seed
    uni = tensors(read(synth.write_model(tmp_path / "u.gguf", "tiny", seed=4, vocab_path=small_vocab, n_layer=3,
                                         routing="uniform")))
    up = "blk.1.ffn_up_exps.weight"
    assert np.array_equal(np.asarray(uni[up].data), np.asarray(got[up].data))
    assert np.array_equal(values(uni["blk.1.attn_q.weight"]), values(got["blk.1.attn_q.weight"]))


def test_recency_window_weights() -> None:
    from pyllama_moe.tools.synth import routing as synth_routing

    lay = synth_routing.layout(2048, 128, 128, 48, 1e6)
    assert lay.size <= 2048 * 3 // 4 and lay.d_new == 8
    w = synth_routing.window_weights(lay, 1e6)
    # most of the weight on the last ~40 tokens, the newest the heaviest
    assert w[0] == w.max() and 0.9 < w[:41].sum() < 1.0 and w[:11].sum() < 0.7
    realistic = synth_routing.REGIMES["realistic"]
    assert realistic.strengths(0, 48)[0] < realistic.strengths(47, 48)[0]
    # the dispersed regime's window is a few tokens long
    short = synth_routing.window_weights(synth_routing.layout(2048, 128, 128, 48, 1e6,
                                                              synth_routing.REGIMES["dispersed"].window), 1e6)
    assert short[:4].sum() > 0.8 and w[:4].sum() < 0.3
    # over thousands of tokens the few fast rotary pairs of a short window come back into phase: much of the weight
    # lies on far tokens (not so realistic's window), unless the scores are sharpened as dispersed sharpens them (its
    # context and its drift head alike)
    dispersed = synth_routing.REGIMES["dispersed"]
    lay = synth_routing.layout(2048, 128, 128, 48, 1e6, dispersed.window)
    assert synth_routing.window_weights(lay, 1e6, 4096)[:16].sum() < 0.7
    realistic_lay = synth_routing.layout(2048, 128, 128, 48, 1e6, realistic.window)
    assert synth_routing.window_weights(realistic_lay, 1e6, 4096)[:64].sum() > 0.9
    for pairs in (lay.pairs, synth_routing.rotary_pairs(128, 1e6, dispersed.drift_window)):
        sharp = synth_routing.window_weights(lay, 1e6, 4096, pairs, dispersed.sharpness)
        assert sharp[:16].sum() > 0.97 and sharp[0] == sharp.max() and sharp[:2].sum() < 0.9


@pytest.mark.parametrize("arch", sorted(synth.MOE_ARCHITECTURES))
def test_moe_architectures_route_and_run_with_host_experts(arch: str, tmp_path: Path) -> None:
    """NATIVE: every MoE architecture synth writes routes through llama.cpp's MoE graph (the selections of every
    layer recorded, K distinct experts per token) and gives the same greedy text with its experts in host memory
    (``cpu_moe``) as without."""
    pytest.importorskip("pyllama_moe._cffi", reason="native part not built")
    from pyllama_moe.llama import Llama
    from pyllama_moe.tools import routing

    path = synth.write_model(tmp_path / f"{arch}.gguf", "tiny", arch=arch, seed=3)
    texts = []
    for cpu_moe in (False, True):
        with Llama(str(path), n_ctx=128, verbose=False, cpu_moe=cpu_moe, n_gpu_layers=-1, seed=0) as llm:
            out = llm("The quick brown fox", max_tokens=12, temperature=0)
            texts.append(out["choices"][0]["text"])
            assert out["usage"]["completion_tokens"] == 12
            if cpu_moe:
                assert llm.placement["host_tensor_patterns"]
            tokens = llm.tokenize(b"def main():\n    return json.dumps({'a': 1}, indent=2)\n")
    assert texts[0] == texts[1]
    rec = routing.record(path, tokens, threads=1)
    assert rec.layers == synth.resolve_shape("tiny", arch).moe_layers and rec.n_expert == 8
    for sel in rec.topk.values():
        assert sel.shape == (len(tokens), 2) and all(len(set(row)) == 2 for row in sel.tolist())


# --------------------------------------------------------------------------------------------
# DeepSeek-V3's routing (glm4moe) and the NextN layer, in llama.cpp


def _select(probs: np.ndarray, bias: np.ndarray, k: int, groups: int, used: int) -> list[set[int]]:
    """The experts DeepSeek-V3's router selects per token: the top ``k`` of the probabilities plus the selection
    bias, among the experts of the ``used`` groups whose two best biased probabilities sum the highest."""
    biased = probs + bias
    if groups > 1:
        g = biased.reshape(len(biased), groups, -1)
        best = np.argsort(-np.sort(g, axis=2)[:, :, -2:].sum(axis=2), axis=1)[:, :used]
        keep = np.zeros(g.shape[:2], dtype=bool)
        np.put_along_axis(keep, best, True, axis=1)
        biased = np.where(np.repeat(keep, g.shape[2], axis=1), biased, -np.inf)
    return [set(row.tolist()) for row in np.argsort(-biased, axis=1)[:, :k]]


@pytest.mark.parametrize("arch", sorted(synth.shapes.DEEPSEEK_ROUTING))
def test_deepseek_routing_selects_as_build_moe_ffn(arch: str, small_vocab: Path, tmp_path: Path) -> None:
    """NATIVE: the MoE layers of a model with DeepSeek-V3's routing gate with a sigmoid, rank the experts by the
    probabilities plus the file's selection bias (which changes some selections), take them from the best groups
    where the model has groups (deepseek2's tiny: 2 of 4; which changes some too), and weigh them by their unbiased
    probabilities normalised to sum 1."""
    pytest.importorskip("pyllama_moe._cffi", reason="native part not built")
    from pyllama_moe.tools import capture

    path = synth.write_model(tmp_path / f"{arch}.gguf", "tiny", arch=arch, seed=5, vocab_path=small_vocab)
    s = synth.resolve_shape("tiny", arch)
    assert s.expert_gating == 2
    tokens = np.random.default_rng(1).integers(0, 299, 48).tolist()
    got, k = capture.capture(path, tokens, r"ffn_moe_(logits|probs|argsort|weights_norm)-\d+", threads=1)
    assert k == s.n_expert_used
    weights = tensors(read(path))
    changed = grouped = 0
    for il in s.moe_layers:
        logits, probs = got[f"ffn_moe_logits-{il}"], got[f"ffn_moe_probs-{il}"]
        assert probs.shape == (len(tokens), s.n_expert)
        assert np.allclose(probs, 1 / (1 + np.exp(-logits)), rtol=1e-5)  # sigmoid, not softmax
        bias = values(weights[f"blk.{il}.exp_probs_b.bias"])
        picked = got[f"ffn_moe_argsort-{il}"][:, :k]
        assert [set(row.tolist()) for row in picked] == _select(probs, bias, k, s.n_expert_groups, s.n_group_used)
        changed += sum(a != b for a, b in zip(_select(probs, bias, k, 0, 0), _select(probs, 0 * bias, k, 0, 0),
                                              strict=True))
        if s.n_expert_groups:
            per_group = s.n_expert // s.n_expert_groups
            assert all(len({e // per_group for e in row.tolist()}) <= s.n_group_used for row in picked)
            grouped += sum(a != b for a, b in zip(_select(probs, bias, k, 0, 0), _select(
                probs, bias, k, s.n_expert_groups, s.n_group_used), strict=True))
        w = got[f"ffn_moe_weights_norm-{il}"]  # the selected experts' unbiased probabilities, normalised
        sel = np.take_along_axis(probs, picked.astype(np.int64), axis=1)
        assert np.allclose(w, sel / sel.sum(axis=1, keepdims=True), rtol=1e-5)
    assert changed > 0  # the bias matters: without it some tokens would select other experts
    assert (grouped > 0) == (s.n_expert_groups > 1)  # so do the groups


@pytest.mark.parametrize("arch", sorted(synth.shapes.DEEPSEEK_ROUTING))
def test_nextn_layer_loads_and_predicts(arch: str, llama_lib: Any, small_vocab: Path, tmp_path: Path) -> None:
    """NATIVE: the NextN layer after the trunk loads (``load_mtp``) and runs in a multi-token-prediction context:
    its graph projects the token and a hidden state, routes through the layer's experts and gives finite logits."""
    ffi, lib = llama_lib
    s = synth.resolve_shape("tiny", arch)
    path = synth.write_model(tmp_path / f"{arch}.gguf", "tiny", arch=arch, vocab_path=small_vocab)
    # without them b11549 takes the file for a trunk-only one, and a prediction context of it aborts the process
    assert {f"blk.{s.n_layer}.nextn.{t}.weight" for t in ("eh_proj", "enorm", "hnorm")} <= set(tensors(read(path)))
    mparams = lib.llama_model_default_params()
    mparams.n_gpu_layers = 0
    mparams.load_mtp = True
    model = lib.llama_model_load_from_file(str(path).encode(), mparams)
    assert model != ffi.NULL
    seen: set[str] = set()

    def observe(t: Any, ask: bool, _: Any) -> bool:
        seen.add(ffi.string(t.name).decode())
        return False

    cb = ffi.callback("ggml_backend_sched_eval_callback", observe)
    try:
        assert lib.llama_model_n_layer(model) == s.n_layer and lib.llama_model_n_layer_nextn(model) == s.n_nextn == 1
        cparams = lib.llama_context_default_params()
        cparams.n_ctx, cparams.n_batch, cparams.n_ubatch = 64, 8, 8
        cparams.n_threads = cparams.n_threads_batch = 1
        cparams.ctx_type = lib.LLAMA_CONTEXT_TYPE_MTP
        cparams.cb_eval = cb
        ctx = lib.llama_init_from_model(model, cparams)
        assert ctx != ffi.NULL
        batch = lib.llama_batch_ext_init(ctx)
        try:
            h = np.random.default_rng(0).standard_normal((4, s.n_embd)).astype(np.float32)  # the trunk's states
            for i, token in enumerate((5, 17, 42, 99)):
                idx = lib.llama_batch_ext_add_token(batch, 0, token)
                assert idx == i
                embd = ffi.new("struct llama_embd *", {"data": ffi.cast("float *", ffi.from_buffer(h[i])),
                                                       "n_rows": 1, "n_embd": s.n_embd})
                assert lib.llama_batch_ext_set_embd_state(batch, idx, embd[0])
                assert lib.llama_batch_ext_set_pos(batch, idx, ffi.new("llama_pos[1]", [i]))
                assert lib.llama_batch_ext_set_output_logits(batch, idx, i == 3)
            assert lib.llama_process(ctx, lib.LLAMA_PROCESS_TYPE_DECODE, batch) == 0
            row = np.frombuffer(ffi.buffer(lib.llama_get_logits_ith(ctx, -1), 300 * 4), dtype=np.float32)
            assert np.all(np.isfinite(row)) and np.std(row) > 0
        finally:
            lib.llama_batch_ext_free(batch)
            lib.llama_free(ctx)
    finally:
        lib.llama_model_free(model)
    nextn = s.n_layer
    assert {f"mtp_eh_proj-{nextn}", f"ffn_moe_argsort-{nextn}"} <= seen
    assert not any(name.endswith(f"-{il}") and name.startswith("ffn_moe") for name in seen for il in s.moe_layers)


def test_deepseek_v2_lite_loads_as_lite_and_routes_with_softmax(small_vocab: Path, tmp_path: Path) -> None:
    """NATIVE: the deepseek-v2-lite preset at a reduced width loads as b11549 loads DeepSeek-V2-Lite (27 layers: one
    query projection, no q_lora_rank read) and routes as it does: softmax probabilities, no selection bias, the
    selected weights not normalised."""
    pytest.importorskip("pyllama_moe._cffi", reason="native part not built")
    from pyllama_moe.tools import capture

    small = {"n_embd": 64, "n_head": 4, "head_dim": 24, "n_rot": 8, "kv_lora_rank": 32, "n_expert": 8,
             "n_expert_used": 2, "n_ff_exp": 32, "n_ff": 128}
    path = synth.write_model(tmp_path / "lite.gguf", "deepseek-v2-lite", vocab_path=small_vocab, **small)
    tokens = np.random.default_rng(2).integers(0, 299, 32).tolist()
    got, k = capture.capture(path, tokens, r"ffn_moe_(probs|argsort|weights_norm)-\d+|ffn_norm-26", threads=1)
    assert k == 2 and "ffn_norm-26" in got  # all 27 layers ran
    for il in range(1, 27):
        probs = got[f"ffn_moe_probs-{il}"]
        assert np.allclose(probs.sum(axis=1), 1, rtol=1e-5)  # softmax
        assert [set(r.tolist()) for r in got[f"ffn_moe_argsort-{il}"][:, :k]] == _select(probs, 0 * probs[0], k, 0, 0)
    assert not [n for n in got if n.startswith("ffn_moe_weights_norm")]


def test_qwen3next_attends_linearly_and_routes_with_softmax(small_vocab: Path, tmp_path: Path) -> None:
    """NATIVE: qwen3next's tiny model runs three layers of linear attention (the gated delta net, with a recurrent
    state: a hybrid memory) to one of full attention with gated queries, and routes as Qwen3-Next: softmax
    probabilities, the top K, their weights normalised."""
    pytest.importorskip("pyllama_moe._cffi", reason="native part not built")
    from pyllama_moe.ffi import ffi, lib
    from pyllama_moe.tools import capture

    path = synth.write_model(tmp_path / "q3n.gguf", "tiny", arch="qwen3next", vocab_path=small_vocab)
    lib.llama_backend_init()
    mparams = lib.llama_model_default_params()
    mparams.n_gpu_layers = 0
    model = lib.llama_model_load_from_file(str(path).encode(), mparams)
    assert model != ffi.NULL
    try:
        assert lib.llama_model_is_hybrid(model)  # recurrent states beside a KV cache
    finally:
        lib.llama_model_free(model)
    tokens = np.random.default_rng(3).integers(0, 299, 32).tolist()
    got, k = capture.capture(path, tokens, r"ffn_moe_(probs|argsort|weights_norm)-\d+|linear_attn_out-\d+|"
                             r"attn_gated-\d+", threads=1)
    assert k == 2
    assert {n for n in got if n.startswith(("linear_attn_out", "attn_gated"))} == {
        "linear_attn_out-0", "linear_attn_out-1", "linear_attn_out-2", "attn_gated-3"}
    for il in range(4):
        probs, picked = got[f"ffn_moe_probs-{il}"], got[f"ffn_moe_argsort-{il}"][:, :k]
        assert np.allclose(probs.sum(axis=1), 1, rtol=1e-5)  # softmax
        assert [set(r.tolist()) for r in picked] == _select(probs, 0 * probs[0], k, 0, 0)
        sel = np.take_along_axis(probs, picked.astype(np.int64), axis=1)
        assert np.allclose(got[f"ffn_moe_weights_norm-{il}"], sel / sel.sum(axis=1, keepdims=True), rtol=1e-5)
