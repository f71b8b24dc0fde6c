"""What a model's graph computes on a text, captured through llama.cpp's eval callback: any named tensors
(:func:`capture`), and the experts every MoE layer selects with its router's input (:func:`record`).

Public API: :class:`Recording`, :func:`capture`, :func:`record`.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt


@dataclasses.dataclass
class Recording:
    """Per MoE layer: the experts each token selected (``[n_tokens, K]``, in the router's order) and the router's
    input (``[n_tokens, n_embd]``; no entry where it was not recorded)."""

    n_expert: int
    topk: dict[int, npt.NDArray[np.int32]]
    router_in: dict[int, npt.NDArray[np.float32]]

    @property
    def layers(self) -> list[int]:
        return sorted(self.topk)


def _tensor_array(lib: Any, ffi: Any, t: Any) -> npt.NDArray[Any]:
    """The values of a computed tensor (any backend, views with their strides)."""
    dtype = {lib.GGML_TYPE_F32: np.float32, lib.GGML_TYPE_I32: np.int32}[t.type]
    n = int(lib.ggml_nbytes(t))
    buf = bytearray(n)
    lib.ggml_backend_tensor_get(t, ffi.from_buffer(buf), 0, n)
    # [ne1, ne0] with the tensor's own strides: the top-k of an argsort is a view of its rows
    return np.ndarray((int(t.ne[1]), int(t.ne[0])), dtype=dtype, buffer=buf,
                      strides=(int(t.nb[1]), int(t.nb[0]))).copy()


def capture(model: str | os.PathLike[str], tokens: Sequence[int], names: str, n_batch: int = 512, n_gpu_layers: int = 0,
            threads: int | None = None) -> tuple[dict[str, npt.NDArray[Any]], int]:
    """Evaluate ``tokens`` (in batches of ``n_batch``, every token an output) and keep the values of the graph's
    tensors whose names (``ffn_norm-3``) match the regular expression ``names``, the rows of all batches together.
    Returns them and the model's experts used per token (0 for a dense model)."""
    from pyllama_moe import ContextError, DecodeError, ModelLoadError, backend
    from pyllama_moe.llama_cpp import ffi, lib

    backend.init()
    mp = lib.llama_model_default_params()
    mp.n_gpu_layers = n_gpu_layers
    m = lib.llama_model_load_from_file(str(model).encode(), mp)
    if m == ffi.NULL:
        raise ModelLoadError(f"cannot load {model}")
    got: dict[str, list[npt.NDArray[Any]]] = {}
    pat = re.compile(names)

    def cb(t: Any, ask: bool, _: Any) -> bool:
        name = ffi.string(t.name).decode()
        if pat.fullmatch(name) is None:
            return False
        if not ask:
            got.setdefault(name, []).append(_tensor_array(lib, ffi, t))
        return True

    c_cb = ffi.callback("ggml_backend_sched_eval_callback", cb)
    try:
        cp = lib.llama_context_default_params()
        cp.n_ctx = len(tokens) + 8
        cp.n_batch = cp.n_ubatch = n_batch
        if threads:
            cp.n_threads = cp.n_threads_batch = threads
        cp.cb_eval = c_cb
        cp.cb_eval_user_data = ffi.NULL
        ctx = lib.llama_init_from_model(m, cp)
        if ctx == ffi.NULL:
            raise ContextError("cannot create the context")
        batch = lib.llama_batch_init(n_batch, 0, 1)
        try:
            for i in range(0, len(tokens), n_batch):
                n = min(n_batch, len(tokens) - i)
                # every token an output: the last layer then computes every row (else only the outputs')
                for j in range(n):
                    batch.token[j] = tokens[i + j]
                    batch.pos[j] = i + j
                    batch.n_seq_id[j] = 1
                    batch.seq_id[j][0] = 0
                    batch.logits[j] = 1
                batch.n_tokens = n
                rc = lib.llama_decode(ctx, batch)
                if rc != 0:
                    raise DecodeError("llama_decode", rc)
        finally:
            lib.llama_batch_free(batch)
            lib.llama_free(ctx)
        n_expert_used = _n_expert_used(lib, m)
    finally:
        lib.llama_model_free(m)
    return {name: np.concatenate(parts) for name, parts in got.items()}, n_expert_used


def record(model: str | os.PathLike[str], tokens: Sequence[int], n_batch: int = 512, n_gpu_layers: int = 0,
           router_inputs: bool = True, threads: int | None = None) -> Recording:
    """Evaluate ``tokens`` and record what every MoE layer selected (and its router's input)."""
    names = r"ffn_moe_argsort-\d+" + (r"|ffn_norm-\d+" if router_inputs else "")
    got, n_expert_used = capture(model, tokens, names, n_batch, n_gpu_layers, threads)
    sel = {int(k.rsplit("-", 1)[1]): a for k, a in got.items() if k.startswith("ffn_moe_argsort")}
    if not sel or not n_expert_used:
        raise ValueError(f"{model}: no MoE layer selected experts (not a MoE model?)")
    # the argsort rows hold every expert, best first: the first n_expert_used are the selection
    n_expert = next(iter(sel.values())).shape[1]
    topk = {il: a[:, :n_expert_used].astype(np.int32) for il, a in sel.items()}
    ins = {int(k.rsplit("-", 1)[1]): a.astype(np.float32) for k, a in got.items() if k.startswith("ffn_norm")}
    return Recording(n_expert, topk, {il: a for il, a in ins.items() if il in topk})


def _n_expert_used(lib: Any, m: Any) -> int:
    from pyllama_moe.llama_cpp import ffi

    arch = ffi.new("char[64]")
    lib.llama_model_meta_val_str(m, b"general.architecture", arch, 64)
    val = ffi.new("char[32]")
    key = ffi.string(arch) + b".expert_used_count"
    if lib.llama_model_meta_val_str(m, key, val, 32) < 0:
        return 0  # dense
    return int(ffi.string(val))
