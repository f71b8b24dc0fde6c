"""Bad inputs give clear exceptions, never a crash: files, parameters, contexts, callbacks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pyllama_moe.errors import (
    ContextError,
    DecodeError,
    LlamaError,
    ModelLoadError,
    ModelNotFoundError,
    check_decode,
)
from pyllama_moe.llama import Llama
from pyllama_moe.model import Model
from pyllama_moe.params import ModelParams


def test_missing_file_is_value_error_like_llama_cpp_python(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="Model path does not exist") as e:
        Llama(str(tmp_path / "absent.gguf"), verbose=False)
    for cls in (ValueError, FileNotFoundError, ModelLoadError, LlamaError):
        assert isinstance(e.value, cls)


def test_not_a_gguf(tmp_path: Path) -> None:
    p = tmp_path / "x.gguf"
    p.write_text("hello, not a model")
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        Llama(str(p), verbose=False)
    with pytest.raises(ModelLoadError, match="not a file"):
        Llama(str(tmp_path), verbose=False)


@pytest.mark.parametrize("keep, match", [(100_000, "failed to read"), (30_000_000, "not within the file bounds")])
@pytest.mark.parametrize("load_mode", ["mmap", "none"])
def test_truncated_gguf(tmp_path: Path, path: Path, keep: int, match: str, load_mode: str) -> None:
    p = tmp_path / "cut.gguf"
    with open(path, "rb") as f:
        p.write_bytes(f.read(keep))
    with pytest.raises(ModelLoadError, match=f"cannot load the model .*{match}"):
        Llama(str(p), load_mode=load_mode, verbose=False)


def test_context_errors_quote_the_library(path: Path) -> None:
    # a quantized V cache needs flash attention (llama_init_from_model refuses it)
    with pytest.raises(ContextError, match="cannot create the context.*quantized V cache requires flash_attn"):
        Llama(str(path), n_ctx=64, type_v="q8_0", flash_attn=False, verbose=False)


@pytest.mark.parametrize("kw, name", [
    ({"n_ctx": -1}, "n_ctx"),
    ({"n_batch": 0}, "n_batch"),
    ({"n_threads": 0}, "n_threads"),
    ({"n_gpu_layers": "all"}, "n_gpu_layers"),
    ({"split_mode": 9}, "split_mode"),
    ({"tensor_split": [1.0] * 1000}, "tensor_split"),
    ({"tensor_split": [-1.0]}, "tensor_split"),
    ({"kv_overrides": {"k": object()}}, "kv_overrides"),
    ({"kv_overrides": {"k" * 200: 1}}, "kv_overrides"),
    ({"type_k": "q9_9"}, "type_k"),
    ({"pooling_type": 17}, "pooling_type"),
    ({"embedding": "yes"}, "embedding"),
    ({"seed": 1.5}, "seed"),
    ({"last_n_tokens_size": -2}, "last_n_tokens_size"),
    ({"rope_freq_base": float("nan")}, "rope_freq_base"),
    ({"draft_model": object()}, "draft_model"),
    # accepted in silence before (issue #48)
    ({"n_threads": 100_000}, "n_threads"),
    ({"n_threads_batch": 100_000}, "n_threads_batch"),
    ({"fit_target_mib": -1}, "fit_target_mib"),
    ({"lora_scale": "x"}, "lora_scale"),
    ({"lora_path": 5}, "lora_path"),
    ({"kv_overrides": {"tokenizer.ggml.bos_token_id": -5}}, r"kv_overrides\['tokenizer.ggml.bos_token_id'\]"),
    ({"kv_overrides": {"tokenizer.ggml.eos_token_id": 10**9}}, r"kv_overrides\['tokenizer.ggml.eos_token_id'\]"),
    ({"kv_overrides": {"tokenizer.ggml.eos_token_id": 1.0}}, r"kv_overrides\['tokenizer.ggml.eos_token_id'\]"),
])
def test_bad_parameter_values_name_the_parameter(path: Path, kw: dict[str, object], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        Llama(str(path), verbose=False, **kw)  # type: ignore[arg-type]


def test_bad_request_values(path: Path) -> None:
    with Llama(str(path), n_ctx=64, verbose=False) as m:
        for kw, name in (({"temperature": "hot"}, "temperature"), ({"logprobs": -1}, "logprobs"),
                         ({"stop": [1]}, "stop"), ({"logit_bias": {10**9: 1.0}}, "logit_bias"),
                         ({"grammar": 5}, "grammar"), ({"mirostat_mode": 3}, "mirostat_mode"),
                         ({"repeat_penalty": 0}, "repeat_penalty"), ({"suffix": "x"}, "suffix")):
            with pytest.raises(ValueError, match=name):
                m("hello", max_tokens=1, **kw)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="token"):
            m.detokenize([10**9])
        with pytest.raises(ValueError, match="prompt: token -5"):
            m([1, 2, -5], max_tokens=1)
        # token ids that are not integers were cut to one in silence (issue #48)
        for call, name in ((lambda: m.eval([1.5, 2]), "tokens"), (lambda: m([1, 2.0], max_tokens=1), "prompt"),
                           (lambda: m.detokenize([1.5]), "tokens"), (lambda: m.eval([True]), "tokens"),
                           (lambda: m.generate([1.5]), "tokens"), (lambda: m.eval(["1"]), "tokens"),
                           (lambda: m("hello", max_tokens=1, logit_bias={1.5: 1.0}), "logit_bias")):
            with pytest.raises(ValueError, match=f"{name}.*integer token ids"):
                call()
        assert m("hello", max_tokens=1, logit_bias={"15": 1.0, 16: -1.0})["choices"]  # JSON keys, as llama-cpp-python
        assert m("hello", max_tokens=1)["usage"]["completion_tokens"] <= 1  # still usable


def test_wrong_types_are_value_errors_naming_the_argument(path: Path) -> None:
    # AttributeError, RecursionError and a bare ConnectionError before (issue #48)
    deep: dict[str, object] = {"type": "array"}
    for _ in range(5000):
        deep = {"type": "array", "items": deep}
    with Llama(str(path), n_ctx=64, verbose=False, embedding=True, pooling_type=1) as m:
        user = [{"role": "user", "content": "x"}]
        for rf, match in ((deep, "nested more than"), ("json", "response_format must be a dict"),
                          ({"type": "json_schema", "json_schema": "x"}, "json_schema must be a dict")):
            with pytest.raises(ValueError, match=match):
                m.create_chat_completion(user, max_tokens=1, response_format=(
                    {"type": "json_object", "schema": rf} if rf is deep else rf))
        for bad in ([1, 2], 5, None, [b"x"]):
            with pytest.raises(ValueError, match="input must be a string or a list of strings"):
                m.embed(bad)  # type: ignore[arg-type]
        assert len(m.embed("x")) == m.n_embd()


def test_unknown_keywords_are_ignored_with_a_warning(path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="pyllama_moe"):
        Llama(str(path), n_ctx=64, verbose=False, not_a_parameter=1).close()
    assert any("not_a_parameter" in r.getMessage() for r in caplog.records)


def test_progress_callback_can_abort_and_its_errors_propagate(path: Path, tmp_path: Path) -> None:
    seen: list[float] = []

    def record(p: float) -> bool:
        seen.append(p)
        return True

    Model(path, ModelParams(), verbose=False, progress=record).close()
    assert seen and seen[-1] == pytest.approx(1.0) and seen == sorted(seen)
    with pytest.raises(ModelLoadError, match="cancelled"):
        Model(path, ModelParams(), verbose=False, progress=lambda p: False)

    def boom(p: float) -> bool:
        raise KeyError("from the callback")

    with pytest.raises(KeyError, match="from the callback"):
        Model(path, ModelParams(), verbose=False, progress=boom)
    # a failure that is not the callback's is reported as such
    bad = tmp_path / "not-a-model.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    with pytest.raises(ModelLoadError, match="cannot load the model"):
        Model(bad, ModelParams(), verbose=False, progress=record)


def test_decode_codes() -> None:
    check_decode(0)
    with pytest.raises(DecodeError, match="no KV slot") as e:
        check_decode(1)
    assert e.value.code == 1
    with pytest.raises(DecodeError, match="fatal"):
        check_decode(-3)


def test_half_made_objects_close_cleanly(path: Path) -> None:
    m = Model(path, ModelParams(vocab_only=True), verbose=False)
    m.close()
    m.close()
    with pytest.raises(LlamaError, match="closed"):
        m.n_embd()
    with pytest.raises(LlamaError, match="closed"):
        m.vocab.bos()
    assert os.path.exists(path)


def test_lora_errors(path: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="lora_path does not exist"):
        Llama(str(path), n_ctx=64, lora_path=str(tmp_path / "absent.gguf"), verbose=False)
    with pytest.raises(ModelLoadError, match="cannot load the LoRA adapter"):
        Llama(str(path), n_ctx=64, lora_path=str(path), verbose=False)  # a model, not an adapter


def test_keyword_types_are_named(path: Path) -> None:
    # a wrong type is a ValueError naming the keyword, not a TypeError from inside the constructor
    for kw, match in (({"n_ctx": "64"}, "n_ctx"), ({"n_batch": 1.5}, "n_batch"), ({"use_mmap": "no"}, "use_mmap"),
                      ({"use_mlock": 1}, "use_mlock"), ({"n_cpu_moe": -1}, "n_cpu_moe")):
        with pytest.raises(ValueError, match=match):
            Llama(str(path), verbose=False, **kw)
    with pytest.raises(ValueError, match="model_path"):
        Llama(12, verbose=False)  # type: ignore[arg-type]


def test_model_path_as_bytes_and_odd_names(path: Path, tmp_path: Path) -> None:
    # bytes (as os.fsencode gives) and a name that is not UTF-8 load like a str
    with Llama(bytes(path), n_ctx=64, verbose=False) as llm:  # type: ignore[arg-type]
        assert llm.n_vocab() > 0
    odd = os.fsencode(tmp_path) + b"/m\xff.gguf"
    os.symlink(path, odd)
    with Llama(odd, n_ctx=64, verbose=False) as llm:  # type: ignore[arg-type]
        assert llm.tokenize(b"hi")


def test_n_cpu_moe_past_the_layers_is_every_layer(path: Path) -> None:
    # --n-cpu-moe makes one pattern per layer: a huge N took all memory building them
    from pyllama_moe import moe

    assert len(moe.placement_overrides(n_cpu_moe=10**9)) == moe.LLAMA_MAX_LAYERS
    with Llama(str(path), n_ctx=64, n_cpu_moe=10**9, verbose=False) as llm:
        assert llm.tokenize(b"hi")
