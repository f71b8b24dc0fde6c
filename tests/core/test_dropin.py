"""A script written for llama-cpp-python runs after replacing ``llama_cpp`` with ``pyllama_moe``: the high-level
``Llama`` one, and one of low-level ``llama.h`` calls through ``import pyllama_moe as llama_cpp`` (#47)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = '''
import json, sys
from llama_cpp import Llama, LlamaGrammar

llm = Llama(model_path=sys.argv[1], n_ctx=512, n_gpu_layers=-1, seed=42, verbose=False)
out = llm("Q: Name the planets in the solar system? A: ", max_tokens=8, stop=["Q:", "\\n"], echo=True)
assert out["object"] == "text_completion" and out["choices"][0]["text"].startswith("Q: Name")
chunks = [c["choices"][0]["text"] for c in llm("Once upon a time", max_tokens=6, stream=True, temperature=0)]
whole = llm("Once upon a time", max_tokens=6, temperature=0)["choices"][0]["text"]
assert "".join(chunks) == whole
chat = llm.create_chat_completion(messages=[{"role": "system", "content": "You are helpful."},
                                            {"role": "user", "content": "Hi"}], max_tokens=5)
assert chat["choices"][0]["message"]["role"] == "assistant"
g = LlamaGrammar.from_string('root ::= "yes" | "no"')
yn = llm("Answer: ", grammar=g, max_tokens=4)["choices"][0]["text"]
assert yn in ("yes", "no"), yn
toks = llm.tokenize(b"hello world")
assert llm.detokenize(toks) == b"hello world"
print(json.dumps({"n_ctx": llm.n_ctx(), "n_vocab": llm.n_vocab(), "yn": yn}))
'''


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pyllama_moe.tools import synth

    return synth.write_model(tmp_path_factory.mktemp("dropin") / "tiny.gguf", "tiny", seed=6)


def test_llama_cpp_python_script_runs_unchanged(tiny: Path, tmp_path: Path) -> None:
    script = tmp_path / "script.py"
    script.write_text(SCRIPT.replace("llama_cpp", "pyllama_moe"))
    res = subprocess.run([sys.executable, str(script), str(tiny)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert '"n_ctx": 512' in res.stdout and '"n_vocab": 151936' in res.stdout
    assert res.stderr == ""  # verbose=False: nothing from llama.cpp


# llama.h calls as llama-cpp-python's README, examples and its own _internals/_logger write them: bytes in and out,
# ctypes buffers that C fills, ctypes scalars, a ctypes log callback, numpy over a ctypes logits pointer
LOW_LEVEL_SCRIPT = '''
import ctypes
import json
import sys

import numpy as np
import llama_cpp

log_lines = []


@llama_cpp.llama_log_callback
def log_callback(level, text, user_data):
    log_lines.append(text.decode("utf-8"))


llama_cpp.llama_log_set(log_callback, ctypes.c_void_p(0))
llama_cpp.llama_backend_init()
info = llama_cpp.llama_cpp.llama_print_system_info().decode("utf-8")
assert "CPU" in info, info
assert llama_cpp.llama_supports_mmap() in (True, False)

model_params = llama_cpp.llama_model_default_params()
model_params.n_gpu_layers = 0
assert llama_cpp.llama_model_load_from_file(b"/no/such/model.gguf", model_params) is None
model = llama_cpp.llama_model_load_from_file(sys.argv[1].encode("utf-8"), model_params)
assert model is not None
assert any(line.startswith("llama_model_loader") for line in log_lines), log_lines[:5]

metadata = {}
buffer_size = 1024
buffer = ctypes.create_string_buffer(buffer_size)
for i in range(llama_cpp.llama_model_meta_count(model)):
    nbytes = llama_cpp.llama_model_meta_key_by_index(model, i, buffer, buffer_size)
    key = buffer.value.decode("utf-8")
    nbytes = llama_cpp.llama_model_meta_val_str_by_index(model, i, buffer, buffer_size)
    metadata[key] = buffer.value.decode("utf-8")
assert metadata["general.architecture"] == "qwen3moe", metadata
assert llama_cpp.llama_model_meta_val_str(model, b"general.architecture", buffer, buffer_size) == len(b"qwen3moe")
assert buffer.value == b"qwen3moe"
desc = ctypes.create_string_buffer(256)
llama_cpp.llama_model_desc(model, desc, ctypes.sizeof(desc))
assert desc.value.startswith(b"qwen3moe"), desc.value
template = llama_cpp.llama_model_chat_template(model, None)
assert template is None or template.startswith(b"{"), template
assert llama_cpp.llama_model_chat_template(model, b"no-such-template") is None

vocab = llama_cpp.llama_model_get_vocab(model)
n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
eos = llama_cpp.llama_vocab_eos(vocab)
assert llama_cpp.llama_vocab_is_eog(vocab, eos) is True
assert llama_cpp.llama_vocab_get_text(vocab, eos).startswith(b"<|")

text = b"Hello world"
tokens = (llama_cpp.llama_token * 32)()
n_tokens = llama_cpp.llama_tokenize(vocab, text, len(text), tokens, 32, False, llama_cpp.c_bool(True))
assert n_tokens == 2, n_tokens
assert llama_cpp.llama_tokenize(vocab, text, len(text), (llama_cpp.llama_token * 1)(), 1, False, True) == -2
pieces = b""
piece = (ctypes.c_char * 32)()
for token in tokens[:n_tokens]:
    n = llama_cpp.llama_token_to_piece(vocab, token, piece, 32, 0, True)
    pieces += bytes(piece[:n])
assert pieces == text, pieces
out = ctypes.create_string_buffer(64)
n = llama_cpp.llama_detokenize(vocab, tokens, n_tokens, out, 64, False, False)
assert out.raw[:n] == text

ctx_params = llama_cpp.llama_context_default_params()
ctx_params.n_ctx = 256
ctx_params.n_batch = 64
ctx = llama_cpp.llama_init_from_model(model, ctx_params)
assert ctx is not None and llama_cpp.llama_n_ctx(ctx) == 256
batch = llama_cpp.llama_batch_init(64, 0, 1)
batch.n_tokens = n_tokens
for i in range(n_tokens):
    batch.token[i] = tokens[i]
    batch.pos[i] = i
    batch.n_seq_id[i] = 1
    batch.seq_id[i][0] = 0
    batch.logits[i] = i == n_tokens - 1
assert llama_cpp.llama_decode(ctx, batch) == 0
logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, n_tokens - 1), shape=(n_vocab,))
sampler = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
llama_cpp.llama_sampler_chain_add(sampler, llama_cpp.llama_sampler_init_greedy())
assert llama_cpp.llama_sampler_name(sampler) == b"chain"
token = llama_cpp.llama_sampler_sample(sampler, ctx, -1)
assert token == int(np.argmax(logits)), (token, int(np.argmax(logits)))
state_size = llama_cpp.llama_state_get_size(ctx)
state = (ctypes.c_uint8 * state_size)()
assert llama_cpp.llama_state_get_data(ctx, state, state_size) == state_size
assert llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one((llama_cpp.llama_token * 1)(token), 1)) == 0
assert llama_cpp.llama_state_set_data(ctx, state, state_size) == state_size
llama_cpp.llama_sampler_free(sampler)
llama_cpp.llama_batch_free(batch)
llama_cpp.llama_free(ctx)
llama_cpp.llama_model_free(model)

# a plain Python callable as the callback: it stays set when a Llama loads (pyllama_moe installs no callback of its own)
lines = []
llama_cpp.llama_log_set(lambda level, text, user_data: lines.append((level, text, user_data)), None)
llm = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=64, verbose=False)
assert lines and all(isinstance(t, bytes) and u is None for _, t, u in lines), lines[:3]
llm.close()
llama_cpp.llama_backend_free()
print(json.dumps({"metadata": len(metadata), "log_lines": len(log_lines), "token": token}))
'''


def test_low_level_script_runs_unchanged(tiny: Path, tmp_path: Path) -> None:
    script = tmp_path / "low_level.py"
    script.write_text(LOW_LEVEL_SCRIPT.replace("import llama_cpp\n", "import pyllama_moe as llama_cpp\n"))
    res = subprocess.run([sys.executable, str(script), str(tiny)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert '"metadata": ' in res.stdout
    assert res.stderr == ""  # every line of llama.cpp's log went to the script's callbacks
