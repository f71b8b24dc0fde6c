"""``Llama(moe_cache_state=FILE)``: the MoE cache's warm start across runs (#46).

At load, a state file of this model and shape (:mod:`.moe_state`, written by ``python -m pyllama_moe calibrate`` or by
the last run) fills the cache with each cached layer's most used experts, from their host copies, before the first
token (``llama_moe_cache_fill``); at close, the experts the cache holds are written back to it (counts of 1 for the
held ones: the device lookups keep no use counts). A missing, corrupt or mismatched file is a cold start with a
warning; a file that cannot be written loses only the warm start (a warning), never the run's results. Results are
those of a cold start: only which experts the slots hold differs.

Public API: :class:`WarmStart`.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import numpy as np

from pyllama_moe import moe_state
from pyllama_moe.context import Context
from pyllama_moe.model import Model

logger = logging.getLogger("pyllama_moe")


class WarmStart:
    """The state file of one ``Llama``: ``restore`` at load, ``save`` at close; ``restored`` experts filled in, in
    ``restore_s`` seconds (the file read and the copies: what the warm start adds to the load)."""

    def __init__(self, path: str | os.PathLike[str], model: Model, ctx: Context) -> None:
        self.path = Path(path)  # its type checked by Llama, before the load
        self.ctx = ctx
        self.model_id, self.n_layer, self.n_expert = model.fingerprint(), model.n_layer(), model.n_expert()
        self.restored = 0
        self.restore_s = 0.0
        self.saved = False
        self.active = self.n_expert > 0 and ctx.moe_cache_stats() is not None
        if not self.active:
            logger.warning("moe_cache_state=%s ignored: the context has no MoE cache", self.path)

    def restore(self) -> int:
        """Fill the cache from the file, if it is of this model and shape: the experts copied in (0 otherwise)."""
        if not self.active:
            return 0
        t0 = time.perf_counter()
        state = moe_state.load(self.path, self.model_id, self.n_layer, self.n_expert)
        if state is None:
            return 0
        n = self.ctx.moe_cache_fill(state.counts.astype(np.float32))
        self.restored = n or 0
        self.restore_s = time.perf_counter() - t0
        logger.info("moe_cache_state: %d experts restored from %s (%s, %d tokens) in %.3f s", self.restored, self.path,
                    state.source, state.n_tokens, self.restore_s)
        return self.restored

    def save(self) -> None:
        """Write the experts the cache holds to the file, once (a warning, never an exception, if it cannot)."""
        if not self.active or self.saved:
            return
        self.saved = True
        try:
            held = self.ctx.moe_cache_held(self.n_layer, self.n_expert)
            if held is None:
                return
            moe_state.save(moe_state.MoeCacheState(self.model_id, self.n_layer, self.n_expert,
                                                   held.astype(np.uint32), 0, "run"), self.path)
        except Exception as e:  # noqa: BLE001 - the run's results are not lost for a state file
            logger.warning("moe_cache_state: cannot write %s: %s", self.path, e)
