"""A short decode through the MoE cache's device lookup (and prefetched prompts), small enough to run
under compute-sanitizer: ``ci/gpu.sh sanitize`` runs it with each lookup policy and prompt copy path.

``python ci/sanitize_decode.py [ARCH [N_LAYER [CACHE_MIB [HYBRID_SHARE]]]]``: qwen3moe, 2 layers and 1 MiB unless
given (4 layers and 2 MiB leave the prediction three layers ahead room for its pins); with HYBRID_SHARE (0 to 1) and
``LLAMA_MOE_HYBRID=1`` the CPU takes that share of the misses, whatever the rates (the context field
``moe_hybrid_share``)."""

from __future__ import annotations

import os
import sys
import tempfile

from pyllama_moe import llama
from pyllama_moe.llama import Llama
from pyllama_moe.params import ContextParams
from pyllama_moe.tools import synth


def context_fields(**fields: object) -> None:
    """Llama's contexts made with fields no keyword sets (the library reads no environment for them), as the tests'
    ``fixtures.native.context_fields`` does."""
    llama.ContextParams = lambda **kw: ContextParams(**{**kw, **fields})  # type: ignore[assignment,misc]


def main() -> int:
    arch = sys.argv[1] if len(sys.argv) > 1 else "qwen3moe"
    n_layer = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    cache_mib = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    # the 64-token batches prefetched (the scheduler's min batch is 256), so that the prompts seed the cache and the
    # prefetch copies from it
    fields: dict[str, object] = {"prefetch_min_batch": 1}
    if len(sys.argv) > 4:
        fields["moe_hybrid_share"] = float(sys.argv[4])
    context_fields(**fields)
    path = os.path.join(tempfile.gettempdir(), f"pyllama-moe-sanitize-{arch}-{n_layer}x16x216k.gguf")
    if not os.path.exists(path):
        # 16 experts of 216 KiB a layer (3.4 MiB a layer): a cache of 1 MiB holds a few of them, so lookups evict and
        # a prefetch finds at most one slot free beside the two the lookup before it pinned
        synth.write_model(path, "tiny", arch=arch, skew=1.0, seed=3, n_layer=n_layer, n_embd=256, n_ff_exp=512,
                          n_expert=16)
    # batches of 64 tokens: every batch of a prompt of several batches seeds the cache
    with Llama(path, n_gpu_layers=-1, cpu_moe=True, load_mode="none", moe_cache_mib=cache_mib, n_ctx=512, n_batch=64,
               verbose=False) as llm:
        out = llm("The quick brown fox " * 20, max_tokens=12, temperature=0)
        # a second large ubatch after the decode filled the cache: unless LLAMA_MOE_CACHE_PREFETCH=0, its prefetch
        # copies the cached experts from the cache banks
        llm("The quick brown fox " * 20 + "jumps over the lazy dog " * 12, max_tokens=4, temperature=0)
        # a prompt of four batches from the start: each of them seeds
        llm.reset()
        llm("jumps over the lazy dog " * 40, max_tokens=4, temperature=0)
        stats = llm.moe_cache_stats()
    print(f"{arch}: {out['choices'][0]['text']!r} {stats}")
    ok = (stats is not None and stats["device"]["hits"] + stats["device"]["misses"] > 0
          and stats["seed"]["ubatches"] > 0)
    # the prediction ran where the device lookups found experts in the cache: its copies were made (gpt-oss's 1 MiB
    # cache here hits nothing: no slot is ever free for a prediction beside the lookup's)
    if os.environ.get("LLAMA_MOE_CACHE_PREDICT", "2") != "0" and stats is not None and stats["device"]["hits"] > 0:
        ok = ok and stats["predicted"]["experts"] > 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
