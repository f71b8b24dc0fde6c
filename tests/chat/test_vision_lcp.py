"""A llama-cpp-python vision program, unchanged, on both: llama-cpp-python 0.3.36 and pyllama_moe through the import
alias, on the same synthetic llama4 MoE and projector files, with the same images: the same greedy tokens (#71).

llama-cpp-python is not a dependency and CI does not build it (it compiles its own llama.cpp, of another version
than our pin): the test runs where ``PYLLAMA_MOE_LCP_PYTHON`` names a Python that imports llama-cpp-python 0.3.36
(``CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAMA_BUILD_TOOLS=OFF" pip install llama-cpp-python==0.3.36`` in a venv), and is
skipped elsewhere."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import pyllama_moe
from pyllama_moe.tools.synth.projector import write_projector

from fixtures.images import png
from fixtures.models import model_path

LCP_PYTHON = os.environ.get("PYLLAMA_MOE_LCP_PYTHON")

# written for llama-cpp-python; argv: model, projector, handler class, then the image files
PROGRAM = '''
import base64, json, sys
from llama_cpp import Llama
from llama_cpp import llama_chat_format

model, mmproj, handler_name, *images = sys.argv[1:]
handler = getattr(llama_chat_format, handler_name)(clip_model_path=mmproj, verbose=False)
llm = Llama(model_path=model, chat_handler=handler, n_ctx=1024, n_batch=256, n_threads=2, seed=1, logits_all=True,
            verbose=False)
if handler_name == "MTMDChatHandler":  # synth's template (qwen2's) takes string contents only: one of parts
    llm.metadata["tokenizer.chat_template"] = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\\n{% if m['content'] is string %}{{ m['content'] }}"
        "{% else %}{% for p in m['content'] %}{% if p['type'] == 'text' %}{{ p['text'] }}{% endif %}{% endfor %}"
        "{% endif %}<|im_end|>\\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\\n{% endif %}")
uris = ["data:image/png;base64," + base64.b64encode(open(p, "rb").read()).decode() for p in images]
chats = [
    [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": uris[0]}},
                                  {"type": "text", "text": "What is in this image?"}]}],
    [{"role": "system", "content": "Answer in one word."},
     {"role": "user", "content": [{"type": "text", "text": "Which is larger?"}]
                                 + [{"type": "image_url", "image_url": {"url": u}} for u in uris]}],
]
out = []
for messages in chats:
    res = llm.create_chat_completion(messages=messages, temperature=0.0, max_tokens=24, logprobs=True,
                                     top_logprobs=1)
    content = res["choices"][0]["logprobs"]["content"]
    out.append({"text": res["choices"][0]["message"]["content"], "usage": res["usage"],
                "tokens": [t["token"] for t in content],
                "logprobs": [float(t["logprob"]) for t in content]})
print(json.dumps(out))
'''

ALIAS = '''
import runpy, sys
import pyllama_moe, pyllama_moe.llama_chat_format
sys.modules["llama_cpp"] = pyllama_moe
sys.modules["llama_cpp.llama_chat_format"] = pyllama_moe.llama_chat_format
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
'''


def _run(python: str, args: list[str], env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    res = subprocess.run([python, *args], capture_output=True, text=True, timeout=600, env=env)
    assert res.returncode == 0, res.stderr[-4000:]
    return list(json.loads(res.stdout.strip().splitlines()[-1]))


@pytest.mark.skipif(not LCP_PYTHON, reason="PYLLAMA_MOE_LCP_PYTHON (a Python with llama-cpp-python 0.3.36) not set")
@pytest.mark.parametrize("handler", ["Llava15ChatHandler", "MTMDChatHandler", "Llava16ChatHandler"])
def test_same_greedy_tokens_as_llama_cpp_python(tmp_path: Path, handler: str) -> None:
    assert LCP_PYTHON is not None
    version = subprocess.run([LCP_PYTHON, "-c", "import llama_cpp; print(llama_cpp.__version__)"],
                             capture_output=True, text=True, timeout=120)
    assert version.stdout.strip() == "0.3.36", version.stderr[-2000:]
    mmproj = write_projector(tmp_path / "mmproj.gguf", 64)
    images = []
    for i, (w, h) in enumerate([(40, 40), (80, 48)]):
        images.append(tmp_path / f"image{i}.png")
        images[-1].write_bytes(png(w, h, seed=10 + i))
    program = tmp_path / "program.py"
    program.write_text(PROGRAM)
    alias = tmp_path / "alias.py"
    alias.write_text(ALIAS)
    args = [str(program), str(model_path("llama4")), str(mmproj), handler, *map(str, images)]
    theirs = _run(LCP_PYTHON, args)
    # the pyllama_moe under test (the source folder or the installed one) in the child too
    env = {**os.environ, "PYTHONPATH": str(Path(pyllama_moe.__file__).resolve().parent.parent)}
    ours = _run(sys.executable, [str(alias), *args], env)
    for a, b in zip(theirs, ours, strict=True):
        assert b["tokens"] == a["tokens"], (a["text"], b["text"])
        assert b["usage"] == a["usage"]
        # the greedy tokens are the same; their log-probabilities are a few thousandths apart: llama-cpp-python's
        # llama.cpp is another version than our pin, whose CPU kernels round otherwise (5e-3 seen, of -11.2)
        assert b["logprobs"] == pytest.approx(a["logprobs"], abs=2e-2)
