"""A bounded mutation fuzz of GGUF files and of API inputs: any signal or hang fails (ci/test.sh runs it).

    python ci/fuzz.py MODEL.gguf [--seconds 120] [--seed 1]

GGUF: copies of MODEL with one metadata value set to an edge value (0, 1, the type's largest, negative,
NaN, inf, random), a header byte flipped, or the file cut short; each is loaded and, when it loads, tokenizes
and generates two tokens. API: random prompts (bytes, code points), grammars, sampling values and token ids.
Cases run in batches in a child process; a batch that dies is run again case by case to name the one that
kills it. Prints the counts (cases, clean errors, crashes, hangs) and exits 1 on any crash or hang.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CHILD = """
import json, sys
import numpy as np
from pyllama_moe import Llama
cases = json.loads(sys.stdin.read())
llm = None
for c in cases:
    try:
        if c["kind"] == "gguf":
            with Llama(c["path"], n_ctx=64, verbose=False) as m:
                m.tokenize(b"hello world")
                m("hi", max_tokens=2, temperature=0)
        else:
            if llm is None:
                llm = Llama(c["model"], n_ctx=128, verbose=False)
            a = c["args"]
            if c["kind"] == "tokenize":
                llm.tokenize(bytes.fromhex(a["text"]), special=a["special"])
            elif c["kind"] == "complete":
                llm.reset()
                llm(a["prompt"], max_tokens=3, grammar=a.get("grammar"), **a["sampling"])
            elif c["kind"] == "eval":
                llm.reset()
                llm.eval(a["tokens"])
        print("OK", flush=True)
    except Exception as e:
        print("ERR", type(e).__name__, flush=True)
"""

EDGE_INTS = [0, 1, 2, 3, 7, 255, 256, 65535, 2**31 - 1, 2**31, 2**32 - 1]
EDGE_FLOATS = [0.0, -0.0, 1.0, -1.0, 1e-30, 1e30, float("nan"), float("inf"), float("-inf")]


class Mutator:
    def __init__(self, model: Path, rng: random.Random) -> None:
        import gguf

        self.model, self.rng = model, rng
        r = gguf.GGUFReader(model)
        base = r.data.__array_interface__["data"][0]
        self.scalars: list[tuple[str, int, Any]] = []  # (key, offset, dtype) of every scalar number
        for f in r.fields.values():
            if f.types and f.types[0] not in (gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.STRING) and f.data:
                part = f.parts[f.data[0]]
                self.scalars.append((f.name, int(part.__array_interface__["data"][0] - base), part.dtype))
        self.header_end = min(int(t.data_offset) for t in r.tensors)
        self.size = model.stat().st_size

    def case(self, out: Path) -> dict[str, Any]:
        import numpy as np

        shutil.copyfile(self.model, out)
        what = self.rng.choice(["value", "value", "value", "flip", "cut"])
        with open(out, "r+b") as fh:
            if what == "value":
                key, off, dtype = self.rng.choice(self.scalars)
                if np.issubdtype(dtype, np.floating):
                    v = self.rng.choice(EDGE_FLOATS + [self.rng.uniform(-1e6, 1e6)])
                else:
                    info = np.iinfo(dtype)
                    v = self.rng.choice([x for x in EDGE_INTS if info.min <= x <= info.max] +
                                        [info.max, info.min, self.rng.randint(info.min, info.max)])
                fh.seek(off)
                fh.write(np.array([v]).astype(dtype).tobytes())
                what = f"{key}={v}"
            elif what == "flip":
                off = self.rng.randrange(self.header_end)
                fh.seek(off)
                b = fh.read(1)
                fh.seek(off)
                fh.write(bytes([b[0] ^ (1 << self.rng.randrange(8))]))
                what = f"flip@{off}"
            else:
                n = self.rng.randrange(self.size)
                fh.truncate(n)
                what = f"cut@{n}"
        return {"kind": "gguf", "path": str(out), "what": what}


def api_case(model: Path, rng: random.Random) -> dict[str, Any]:
    kind = rng.choice(["tokenize", "complete", "complete", "eval"])
    if kind == "tokenize":
        raw = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40)))
        return {"kind": kind, "model": str(model), "args": {"text": raw.hex(), "special": rng.random() < 0.5},
                "what": f"tokenize {raw.hex()}"}
    if kind == "eval":
        tokens = [rng.choice([0, 1, -1, 2**31 - 1, 2**32 + 1, rng.randrange(-10, 200000)]) for _ in range(3)]
        return {"kind": kind, "model": str(model), "args": {"tokens": tokens}, "what": f"eval {tokens}"}
    chars = "ab()[]^-\\\"*+?|{}:=, \n\x00é\U0010ffff"
    grammar = rng.choice([None, None, "root ::= " + "".join(rng.choice(chars) for _ in range(rng.randrange(1, 30)))])
    values: dict[str, list[float]] = {
        "temperature": [0, 0.8, -1, 100.0], "top_k": [0, 1, 40, -5, 2**31 - 1], "top_p": [0.0, 0.5, 1.0, 2.0],
        "min_p": [0.0, 0.9, 1.0], "repeat_penalty": [1.0, 1.5, 1e-6], "mirostat_mode": [0, 1, 2],
        "frequency_penalty": [0.0, 5.0, -5.0], "presence_penalty": [0.0, 1e9]}
    sampling = {k: rng.choice(v) for k, v in values.items()}
    prompt = "".join(chr(rng.choice([rng.randrange(32, 127), rng.randrange(0x80, 0x10FFFF)]))
                     for _ in range(rng.randrange(1, 20)))
    prompt = prompt.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    return {"kind": kind, "model": str(model), "args": {"prompt": prompt, "grammar": grammar, "sampling": sampling},
            "what": f"complete grammar={grammar!r} {sampling}"}


def run(cases: list[dict[str, Any]], timeout: float) -> tuple[list[str] | None, int]:
    """The result line of each case, or None if the child died (with its exit code; 124 for a hang)."""
    try:
        # from outside the checkout: the installed package, not the source folder
        res = subprocess.run([sys.executable, "-c", CHILD], input=json.dumps(cases), capture_output=True, text=True,
                             timeout=timeout, cwd=tempfile.gettempdir())
    except subprocess.TimeoutExpired:
        return None, 124
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith(("OK", "ERR"))]
    if res.returncode != 0 or len(lines) != len(cases):
        return None, res.returncode
    return lines, 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--batch", type=int, default=12)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    mut = Mutator(args.model, rng)
    counts = {"cases": 0, "ok": 0, "clean errors": 0, "crashes": 0, "hangs": 0}
    failures: list[str] = []
    deadline = time.monotonic() + args.seconds
    with tempfile.TemporaryDirectory(prefix="pyllama-moe-fuzz-") as tmp:
        while time.monotonic() < deadline:
            cases = [mut.case(Path(tmp) / f"f{i}.gguf") if rng.random() < 0.6 else api_case(args.model, rng)
                     for i in range(args.batch)]
            lines, _ = run(cases, timeout=30 + 10 * len(cases))
            if lines is None:  # a case killed the child: find it
                lines = []
                for c in cases:
                    one, code = run([c], timeout=60)
                    if one is None:
                        kind = "hangs" if code == 124 else "crashes"
                        counts[kind] += 1
                        failures.append(f"{'hang' if code == 124 else 'crash'} (exit {code}): {c['kind']} {c['what']}")
                        lines.append("DIED")
                    else:
                        lines += one
            for ln in lines:
                counts["cases"] += 1
                if ln == "OK":
                    counts["ok"] += 1
                elif ln.startswith("ERR"):
                    counts["clean errors"] += 1
    print("fuzz:", ", ".join(f"{v} {k}" for k, v in counts.items()), f"(seed {args.seed}, {args.seconds:.0f} s)")
    for f in failures:
        print("  " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
