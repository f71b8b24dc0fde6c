"""A bounded mutation fuzz of GGUF files and of API inputs: any signal or hang fails (ci/test.sh runs it).

    python ci/fuzz.py MODEL.gguf [--seconds 120] [--seed 1]

GGUF: copies of MODEL with one metadata value set to an edge value (0, 1, the type's largest, negative,
NaN, inf, random), a header byte flipped, or the file cut short; each is loaded and, when it loads, tokenizes
and generates two tokens. API: random prompts (bytes, code points), grammars, sampling values and token ids; thread
counts around the machine's and ggml's limits; grammars with reversed, huge and nested repetition bounds; a handle
of a closed Llama used (issue #48). Cases run in batches in a child process; a batch that dies is run again case by
case to name the one that kills it, and a case that takes more than RUNAWAY_SECONDS or grows the child's memory by
more than RUNAWAY_MIB is a hang (a grammar that runs away in llama.cpp's parser ends at the child's address-space
limit, gigabytes later). Prints the counts (cases, clean errors,
crashes, hangs) and exits 1 on any crash or hang. ``--kinds`` runs some kinds only.
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
import json, os, resource, sys, time
import numpy as np
from pyllama_moe import Llama
cases = json.loads(sys.stdin.read())
# a runaway fails at 4 GiB rather than swap the machine; each thread the batch may start reserves its stack (8 MiB,
# OpenMP keeps its threads) in the address space, 512 of them at most before ggml's arrays end
threads = max([v for c in cases if c["kind"] == "threads" for v in c["args"].values()] + [os.cpu_count() or 1])
limit = (4 << 30) + (16 << 20) * max(1, min(threads, 512))
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
llm = None
def cost(t0, rss0):
    return round(time.monotonic() - t0, 2), (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) >> 10
for c in cases:
    t0, rss0 = time.monotonic(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        if c["kind"] == "threads":
            with Llama(c["model"], n_ctx=64, verbose=False, **c["args"]) as m:
                m("hi", max_tokens=2, temperature=0)
        elif c["kind"] == "closed":
            m = Llama(c["model"], n_ctx=64, verbose=False)
            handles = {"vocab": m._vocab, "model": m._model, "context": m._ctx, "batch": m._batch, "llama": m}
            m.close()
            h, a = handles[c["args"]["handle"]], c["args"]
            getattr(h, a["method"])(*[x[2:].encode() if str(x).startswith("b:") else x for x in a["call"]])
        elif c["kind"] == "gguf":
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
        print("OK", *cost(t0, rss0), flush=True)
    except Exception as e:
        print("ERR", *cost(t0, rss0), type(e).__name__, flush=True)
"""

# a case that takes longer or grows the child's peak memory more ran away (a model load and two tokens take under a
# second and a few MiB; llama.cpp's parser took 48 s and 9.9 GB for a reversed repetition before it gave up)
RUNAWAY_SECONDS = 20.0
RUNAWAY_MIB = 1024

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


API_KINDS = ["tokenize", "complete", "complete", "eval", "threads", "repetition", "closed"]


def repetition_grammar(rng: random.Random) -> str:
    """A grammar whose repetition bounds are reversed, huge, or nested in one another (in a group or a rule)."""
    big = [0, 1, 2, 40, 300, 1999, 2000, 2001, 65535, 100000, 2**32, 2**64, 10**30]
    m, n = rng.choice(big), rng.choice(big)
    rep = rng.choice([f"{{{m},{n}}}", f"{{{m}}}", f"{{{m},}}", f"{{{max(m, n)},{min(m, n)}}}"])
    inner = rng.choice(['"a"', "[a-c]", '"ab"', "."]) + rep
    outer = rng.choice(["", rep, f"{{0,{rng.choice(big)}}}", "*", "+"])
    if rng.random() < 0.5:
        return f"r ::= {inner}\nroot ::= \"x\" r{outer} \"y\""
    return f"root ::= \"x\" ({inner}){outer} \"y\""


# a handle of a closed Llama, a method, its arguments ("b:..." is bytes): SIGSEGV through a dangling pointer before
CLOSED_CALLS: list[tuple[str, str, list[Any]]] = [
    ("vocab", "piece", [1]), ("vocab", "bos", []), ("vocab", "tokenize", ["b:hi"]), ("vocab", "detokenize", [[1, 2]]),
    ("model", "n_embd", []), ("model", "metadata", []), ("model", "fingerprint", []),
    ("context", "logits_ith", [-1]), ("context", "seq_pos_max", [0]), ("context", "state_get", []),
    ("context", "set_n_threads", [1, 1]), ("batch", "set_one", [1, 0]), ("batch", "set_tokens", [[1, 2], 0, False]),
    ("llama", "tokenize", ["b:hi"]), ("llama", "create_completion", ["hi"])]


def api_case(model: Path, rng: random.Random, kinds: list[str] = API_KINDS) -> dict[str, Any]:
    kind = rng.choice(kinds)
    if kind == "threads":
        counts = [-1, 0, 1, 2, 7, 8, 9, 64, 511, 512, 513, 100000, 2**31]
        args = {rng.choice(["n_threads", "n_threads_batch"]): rng.choice(counts)}
        return {"kind": kind, "model": str(model), "args": args, "what": f"threads {args}"}
    if kind == "repetition":
        text = repetition_grammar(rng)
        return {"kind": "complete", "model": str(model), "what": f"repetition grammar={text!r}",
                "args": {"prompt": "hi", "grammar": text, "sampling": {"temperature": rng.choice([0, 0.8])}}}
    if kind == "closed":
        handle, method, call = rng.choice(CLOSED_CALLS)
        return {"kind": kind, "model": str(model), "args": {"handle": handle, "method": method, "call": call},
                "what": f"closed {handle}.{method}{tuple(call)}"}
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
    if any(float(ln.split()[1]) > RUNAWAY_SECONDS or int(ln.split()[2]) > RUNAWAY_MIB for ln in lines):
        return None, 124  # a case ran away: found and counted as a hang, alone
    return lines, 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--batch", type=int, default=12)
    ap.add_argument("--kinds", help="comma-separated kinds to run only (gguf, " + ", ".join(API_KINDS) + ")")
    args = ap.parse_args()
    kinds = args.kinds.split(",") if args.kinds else ["gguf", *API_KINDS]
    gguf_share = 0.6 if "gguf" in kinds else 0.0
    api_kinds = [k for k in kinds if k != "gguf"]
    rng = random.Random(args.seed)
    mut = Mutator(args.model, rng)
    counts = {"cases": 0, "ok": 0, "clean errors": 0, "crashes": 0, "hangs": 0}
    failures: list[str] = []
    deadline = time.monotonic() + args.seconds
    with tempfile.TemporaryDirectory(prefix="pyllama-moe-fuzz-") as tmp:
        while time.monotonic() < deadline:
            cases = [mut.case(Path(tmp) / f"f{i}.gguf") if not api_kinds or rng.random() < gguf_share
                     else api_case(args.model, rng, api_kinds) for i in range(args.batch)]
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
                if ln.startswith("OK"):
                    counts["ok"] += 1
                elif ln.startswith("ERR"):
                    counts["clean errors"] += 1
    print("fuzz:", ", ".join(f"{v} {k}" for k, v in counts.items()), f"(seed {args.seed}, {args.seconds:.0f} s)")
    for f in failures:
        print("  " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
