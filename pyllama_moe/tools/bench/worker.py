"""``python -m pyllama_moe.tools.bench.worker SPEC``: the child process of one Python API run of the bench.

One model load through :class:`pyllama_moe.Llama`, timed as :func:`api_worker` says; the result is printed as one
JSON line on stdout, llama.cpp's log goes to stderr (the parent, :func:`.api.api_measure`, reads both). Only the
public API: ``Llama`` and the ``llama.h`` functions of :mod:`pyllama_moe.llama_cpp` on ``Llama.ctx``.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from pyllama_moe.tools.bench.api import decode_hits, prompt_copies, prompt_seeds
from pyllama_moe.tools.bench.draft import PROMPT_TOKENS, generate_with_drafts
from pyllama_moe.tools.bench.gpu_trace import Tracer

if TYPE_CHECKING:  # pragma: no cover
    from pyllama_moe import Llama


def bench_text(vocab_tokenize: Callable[[bytes], list[int]]) -> tuple[list[int], list[int]]:
    """The bench's real text as tokens: the documentation of standard-library modules (the prompts, and the
    tokens after them) and their source code (decoding from an empty context, and a cache's warm-up): two topics."""
    from pyllama_moe.tools.text import stdlib_text

    text = stdlib_text(120_000, source_share=0.25)
    split = int(len(text) * 0.75)  # stdlib_text: the documentation, then the source code
    return vocab_tokenize(text[:split].encode()), vocab_tokenize(text[split:].encode())


def repeated(tokens: list[int], n: int) -> list[int]:
    """``tokens``, repeated end to end until there are at least ``n`` of them (as they are where there are)."""
    if not tokens:
        raise ValueError("no tokens to repeat")
    return tokens * max(1, -(-n // len(tokens)))


def api_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """One model load: a prompt of real text evaluated (timed after a warm-up), then decoding real text from an
    empty context, one token per step (teacher-forced: the speed of generation whose tokens are text, whatever
    the model would pick; the hash is of its greedy picks)."""
    import hashlib

    from pyllama_moe import Llama, llama_cpp

    n_prompt, n_ubatch, tg = spec["n_prompt"], spec["n_ubatch"], spec["tg"]
    # verbose: the native log (cache statistics, prefetch staging) goes to stderr, which api_measure reads
    n_first = spec.get("first", 0)
    n_ctx = max(n_prompt + max(tg, n_first), spec.get("warm", 0) + 1) + 16
    drafts = spec.get("draft") or []
    if drafts:  # generate_with_drafts' prompts (at most PROMPT_TOKENS), their tokens and a last proposal
        n_ctx = max(n_ctx, PROMPT_TOKENS + tg + max(drafts) + 16)
    n_batch = spec.get("batch") or n_prompt
    with Llama(spec["model"], n_ctx=n_ctx, n_batch=n_batch, n_ubatch=min(n_ubatch, n_batch), flash_attn=True,
               verbose=True, **spec["kwargs"]) as llm:
        # the threads of llama-bench: one per physical core (Llama's default n_threads), for batches too (the
        # context reads them at each decode)
        llama_cpp.llama_set_n_threads(llm.ctx, llm.n_threads, llm.n_threads)
        docs, code = bench_text(lambda b: llm.tokenize(b, add_bos=False))
        docs = repeated(docs, n_prompt + n_first)  # a long prompt (--ttft's) reads the documentation again
        if len(code) < max(tg, spec.get("warm", 0)):
            raise ValueError(f"the bench text has {len(code)} tokens of code, too few for this run")
        tokens = [llm.token_bos(), *docs[: n_prompt - 1]]

        def decode(toks: list[int]) -> tuple[float, str]:
            """``toks`` one per decode step; the seconds and the hash of the greedy pick after each."""
            picks = []
            t0 = time.perf_counter()
            for tok in toks:
                llm.eval([tok])
                picks.append(int(last_logits(llm).argmax()))
            llama_cpp.llama_synchronize(llm.ctx)
            return time.perf_counter() - t0, hashlib.sha256(repr(picks).encode()).hexdigest()[:16]

        warmup = spec.get("warmup", -1)
        n_warmup = n_ubatch if warmup < 0 else min(n_ubatch, warmup)
        if n_warmup:  # graphs, CUDA kernels (loaded on first use), the cache's first uploads
            llm.eval(tokens[:n_warmup])
            if spec.get("warm_token"):  # a decode step's too, where the first token after the prompt is timed
                llm.eval([docs[n_warmup - 1]])
            llm.reset()
        if spec.get("warm"):  # a MoE cache warmed by another text: decode of source code before the timed prompt
            decode([llm.token_bos(), *code[: spec["warm"] - 1]])
            llm.reset()
        traced = Tracer(spec.get("trace", False))
        stats_before = llm.moe_cache_stats()
        with traced:  # the profiler's start and stop (seconds) outside the timing
            t0 = time.perf_counter()
            llm.eval(tokens)
            llama_cpp.llama_synchronize(llm.ctx)  # llama_decode returns before the device is done
            t_pp = time.perf_counter() - t0
        pp_digest = hashlib.sha256(last_logits(llm).tobytes()).hexdigest()[:16]
        stats_after = llm.moe_cache_stats()
        copies = prompt_copies(stats_before, stats_after)
        seeds = prompt_seeds(stats_before, stats_after)
        first = {}
        if n_first:  # the text continuing the prompt: the first decode steps find what the prompt left in the cache
            traced_first = Tracer(spec.get("trace", False))
            with traced_first:
                t_first, digest = decode(docs[n_prompt - 1: n_prompt - 1 + n_first])
            first = {"n": n_first, "ts": n_first / t_first, "s_with_prompt": t_pp + t_first, "digest": digest,
                     "trace": traced_first.as_dict(), **decode_hits(stats_after, llm.moe_cache_stats(), n_first)}
        # decoding from an empty context, as llama-bench's tg: a few steps warm up, then the timed ones
        llm.reset()
        decode([llm.token_bos(), *code[:3]])
        llm.reset()
        before = llm.moe_cache_stats()
        t_tg, tg_digest = decode([llm.token_bos(), *code[: tg - 1]])
        out = {"pp_ts": n_prompt / t_pp, "pp_digest": pp_digest, "n_gen": tg, "tg_ts": tg / t_tg,
               "tg_digest": tg_digest, "placement": llm.placement, "pp_trace": traced.as_dict(),
               "tg": decode_hits(before, llm.moe_cache_stats(), tg)}
        if drafts:
            out["generate"] = generate_with_drafts(llm, code, tg, drafts, bounds=spec.get("draft_bounds", False))
        if first:
            out["first"] = first
        if copies:
            out["prompt_copies"] = copies
        if seeds:
            out["prompt_seeds"] = seeds
        return out


def last_logits(llm: Llama) -> npt.NDArray[np.float32]:
    """A copy of the logits of the last decode's last output (``llama_get_logits_ith(ctx, -1)``)."""
    from pyllama_moe import LlamaError, llama_cpp

    p = llama_cpp.llama_get_logits_ith(llm.ctx, -1)  # a ctypes float pointer, as in llama-cpp-python
    if not p:
        raise LlamaError("no logits for output -1")
    return np.ctypeslib.as_array(p, shape=(llm.n_vocab(),)).copy()


def main(argv: Sequence[str] | None = None) -> int:
    """Run :func:`api_worker` on the JSON spec given as the only argument; print its result as one JSON line."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 1:
        print("usage: python -m pyllama_moe.tools.bench.worker SPEC_JSON (the child process of a bench run)",
              file=sys.stderr)
        return 2
    print(json.dumps(api_worker(json.loads(argv[0]))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
