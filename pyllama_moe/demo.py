"""``python -m pyllama_moe demo``: the README's main job on an embedded default.

Makes (once, cached under the user's cache folder) a small synthetic MoE model, loads it with the
experts in host memory (and, on a GPU machine, everything else on the GPU plus the MoE cache), runs
a short greedy generation and prints tokens/s, where the weights sit and the cache statistics.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from pathlib import Path

import numpy as np

from pyllama_moe import backend
from pyllama_moe.errors import ContextError, ModelLoadError, check_decode, check_ptr
from pyllama_moe.ffi import ffi, lib

EXPERTS = rb"\.ffn_(up|down|gate)_exps"
SHOWN = ("model buffer size", "llama_moe_cache", "KV buffer size", "compute buffer size")


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    d = Path(base) / "pyllama-moe"
    d.mkdir(parents=True, exist_ok=True)
    return d


def demo_model() -> Path:
    """The demo's model: the synthetic writer's tiny qwen3moe preset with skewed routing, made once."""
    from pyllama_moe import synth

    path = cache_dir() / "demo-tiny-qwen3moe.gguf"
    if not path.exists():
        tmp = path.with_suffix(".tmp")
        synth.write_model(tmp, "tiny", skew=1.0, seed=0)
        os.replace(tmp, path)
    return path


class _Collect(logging.Handler):
    """Keeps the log lines that say where buffers sit and what the cache did."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if any(s in msg for s in SHOWN):
            self.lines.append(msg.strip())


def _piece(vocab: object, token: int) -> str:
    buf = ffi.new("char[]", 256)
    n = lib.llama_token_to_piece(vocab, token, buf, 256, 0, False)
    return ffi.unpack(buf, max(n, 0)).decode("utf-8", errors="replace")


def main(args: argparse.Namespace) -> int:
    log = logging.getLogger("pyllama_moe")
    collect = _Collect()
    log.addHandler(collect)
    if args.verbose:
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    log.setLevel(logging.DEBUG if args.verbose else logging.INFO)
    log.propagate = args.verbose
    try:
        return _run(args, collect)
    finally:
        log.removeHandler(collect)


def _run(args: argparse.Namespace, collect: _Collect) -> int:
    backend.init()
    path = demo_model()
    gpu = backend.gpu_available() and not args.cpu
    print(f"model: {path} ({path.stat().st_size / 2**20:.1f} MiB)")
    print(f"device: {'GPU' if gpu else 'CPU only'}")

    mparams = lib.llama_model_default_params()
    mparams.n_gpu_layers = -1 if gpu else 0
    keep = []  # C memory the params point to, alive until the load returns
    if gpu:
        # --cpu-moe: experts stay in host memory (pinned: load mode none), the rest goes to the GPU
        pattern = ffi.new("char[]", EXPERTS)
        overrides = ffi.new("struct llama_model_tensor_buft_override[2]")
        overrides[0].pattern = pattern
        overrides[0].buft = lib.ggml_backend_cpu_buffer_type()
        keep += [pattern, overrides]
        mparams.tensor_buft_overrides = overrides
        mparams.load_mode = lib.LLAMA_LOAD_MODE_NONE
    model = check_ptr(lib.llama_model_load_from_file(str(path).encode(), mparams), ModelLoadError,
                      f"cannot load {path}")
    ctx = ffi.NULL
    try:
        cparams = lib.llama_context_default_params()
        cparams.n_ctx = 512
        cparams.n_batch = 512
        if gpu:
            cparams.moe_cache_size = lib.llama_model_size(model) // 2
        ctx = check_ptr(lib.llama_init_from_model(model, cparams), ContextError, "cannot create the context")
        vocab = lib.llama_model_get_vocab(model)
        n_vocab = lib.llama_vocab_n_tokens(vocab)

        prompt = args.prompt.encode()
        tokens = ffi.new("llama_token[]", 512)
        n = lib.llama_tokenize(vocab, prompt, len(prompt), tokens, 512, True, False)
        if n < 0:
            raise ValueError("prompt too long for the demo's 512-token context")
        t0 = time.perf_counter()
        check_decode(lib.llama_decode(ctx, lib.llama_batch_get_one(tokens, n)))
        t1 = time.perf_counter()
        out, one = [], ffi.new("llama_token[1]")
        for _ in range(args.tokens):
            logits = lib.llama_get_logits_ith(ctx, -1)
            tok = int(np.frombuffer(ffi.buffer(logits, n_vocab * 4), dtype=np.float32).argmax())
            if lib.llama_vocab_is_eog(vocab, tok):
                break
            out.append(_piece(vocab, tok))
            one[0] = tok
            check_decode(lib.llama_decode(ctx, lib.llama_batch_get_one(one, 1)))
        t2 = time.perf_counter()
    finally:
        if ctx != ffi.NULL:
            lib.llama_free(ctx)  # the MoE cache logs its statistics here
        lib.llama_model_free(model)

    print(f"prompt: {args.prompt!r} ({n} tokens, {n / (t1 - t0):.1f} tokens/s)")
    print(f"generated ({len(out)} tokens, {len(out) / (t2 - t1):.1f} tokens/s, random weights): {''.join(out)!r}")
    for line in collect.lines:
        print("  " + line)
    return 0
