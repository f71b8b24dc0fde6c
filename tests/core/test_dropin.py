"""A script written for llama-cpp-python runs after replacing ``llama_cpp`` with ``pyllama_moe``."""

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
