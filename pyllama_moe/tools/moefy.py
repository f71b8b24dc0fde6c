"""A mixture-of-experts model made from a dense one (MoEfication), for routing that comes from real weights.

    python -m pyllama_moe synth OUT.gguf --from-dense DENSE.gguf --experts 64 --used 8

Each layer's FFN neurons (the rows of ``ffn_gate``/``ffn_up``, the columns of ``ffn_down``) are split into
``n_expert`` experts of equal size, and each layer gets a router, from what the dense model does on a calibration
text (Python's standard-library documentation and code, a part that :func:`pyllama_moe.tools.text.stdlib_text`
does not use): the router inputs of every layer (``ffn_norm``) are recorded on it, and

- the neurons are clustered by a balanced k-means over their activation profiles (the magnitude of each neuron's
  activation on every calibration token): neurons that fire together go together;
- the router is the least-squares (ridge) fit from the router input to the norm of each expert's output on those
  tokens: a token selects the experts that would add the most to the dense FFN's output.

The router's logits are scaled down so that llama.cpp's softmax gives the selected experts nearly equal weights
(1/K each), and each expert's down projection is scaled by K: the K selected experts then add up as the same
neurons of the dense FFN would. The rest of the model (attention, norms, embeddings, the tokenizer and its chat
template) is copied unchanged.

Sources: ``llama`` (written as a ``llama`` MoE, Mixtral's tensor names and keys) and ``qwen3`` (written as
``qwen3moe``). The weights of the source may be quantized (any type gguf-py can dequantize); the experts are written
in F16, the router in F32. Public API: :func:`moefy`, :func:`split_neurons`, :func:`quality`.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

# the dense architectures this knows, and the MoE architecture each one becomes
TARGETS = {"llama": "llama", "qwen3": "qwen3moe"}
# softmax(ROUTER_SCALE * logits): near-uniform weights over the selected experts, the ranking unchanged
ROUTER_SCALE = 1e-3


def split_neurons(features: npt.NDArray[np.float32], n_expert: int, seed: int = 0, iters: int = 12
                  ) -> npt.NDArray[np.int64]:
    """The expert of each neuron (an array of ``len(features)`` ints, ``len(features) // n_expert`` per expert).

    Balanced spherical k-means over the normalised rows of ``features`` (one per neuron): each round gives every
    (neuron, expert) pair the cosine of the neuron's row with the expert's centroid and assigns the pairs greedily,
    best first, while the expert has room."""
    n = len(features)
    if n_expert < 1 or n % n_expert:
        raise ValueError(f"the FFN's {n} neurons do not split into {n_expert} experts of equal size")
    size = n // n_expert
    x = features / np.maximum(np.linalg.norm(features, axis=1, keepdims=True), 1e-12)
    rng = np.random.default_rng(seed)
    centroids = x[rng.choice(n, n_expert, replace=False)]
    assign = np.zeros(n, dtype=np.int64)
    for _ in range(iters):
        score = x @ centroids.T  # [n, n_expert]
        order = np.argsort(-score, axis=None)
        room = np.full(n_expert, size)
        done = np.zeros(n, dtype=bool)
        left = n
        for flat in order:
            i, e = divmod(int(flat), n_expert)
            if done[i] or room[e] == 0:
                continue
            assign[i], done[i] = e, True
            room[e] -= 1
            left -= 1
            if left == 0:
                break
        for e in range(n_expert):
            c = x[assign == e].sum(axis=0)
            centroids[e] = c / max(float(np.linalg.norm(c)), 1e-12)
    return assign


def _silu(x: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    return (x / (1.0 + np.exp(-x))).astype(np.float32)


def split_layer(g: npt.NDArray[np.float32], u: npt.NDArray[np.float32], d: npt.NDArray[np.float32],
                x: npt.NDArray[np.float32], n_expert: int, seed: int = 0, ridge: float = 1e-2
                ) -> tuple[list[npt.NDArray[np.int64]], npt.NDArray[np.float32]]:
    """One layer's experts (the neurons of each) and router (``[n_expert, n_embd]``), from its gate and up rows
    ``g``, ``u`` (``[n_ff, n_embd]``), down projection ``d`` (``[n_embd, n_ff]``) and its router inputs ``x`` on the
    calibration tokens (``[n_tokens, n_embd]``)."""
    h = _silu(x @ g.T) * (x @ u.T)  # [n_tokens, n_ff]: the neurons' activations
    assign = split_neurons(np.abs(h).T, n_expert, seed=seed)
    idx = [np.flatnonzero(assign == e) for e in range(n_expert)]
    # the norm of each expert's output on each token: what the router should rank by
    target = np.stack([np.linalg.norm(h[:, i] @ d[:, i].T, axis=1) for i in idx], axis=1)  # [n_tokens, n_expert]
    xtx = x.T @ x
    lam = ridge * float(np.trace(xtx)) / len(xtx)
    router = np.linalg.solve(xtx + lam * np.eye(len(xtx), dtype=xtx.dtype), x.T @ target).T
    return idx, router.astype(np.float32)


def calibration_tokens(src: str | os.PathLike[str], n_tokens: int = 2048) -> list[int]:
    """Tokens of the calibration text (the standard library's documentation and code that
    :func:`pyllama_moe.tools.text.stdlib_text` leaves out), tokenized by ``src``."""
    from pyllama_moe import Llama
    from pyllama_moe.tools.text import CALIBRATION_MODULES, stdlib_text

    with Llama(str(src), vocab_only=True, verbose=False) as tok:
        return tok.tokenize(stdlib_text(modules=CALIBRATION_MODULES).encode(), add_bos=True)[:n_tokens]


def moefy(src: str | os.PathLike[str], dst: str | os.PathLike[str], n_expert: int, n_expert_used: int,
          seed: int = 0, progress: bool = False, n_calibration: int = 2048, threads: int | None = None) -> Path:
    """Write the MoE made from the dense GGUF ``src`` to ``dst`` and return ``dst``."""
    import gguf

    from pyllama_moe.tools import capture, routing

    if not 1 <= n_expert_used <= n_expert:
        raise ValueError(f"experts used must be 1 to the number of experts ({n_expert}), got {n_expert_used}")
    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    if arch not in TARGETS:
        raise ValueError(f"{src}: a dense {', '.join(TARGETS)} model is needed, this one is {arch}")
    if f"{arch}.expert_count" in reader.fields:
        raise ValueError(f"{src} is a MoE model already")
    out_arch = TARGETS[arch]
    n_ff = int(reader.fields[f"{arch}.feed_forward_length"].contents())
    if n_ff % n_expert:
        raise ValueError(f"the FFN's {n_ff} neurons do not split into {n_expert} experts of equal size")
    m = n_ff // n_expert

    dst = Path(dst)
    fd, tmp_name = tempfile.mkstemp(prefix=dst.name + ".", suffix=".tmp", dir=dst.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        writer = gguf.GGUFWriter(tmp, out_arch)
        for key, field in reader.fields.items():
            if key.startswith("GGUF.") or key == "general.architecture":
                continue
            name = out_arch + key[len(arch):] if key.startswith(arch + ".") else key
            if name == f"{out_arch}.feed_forward_length" and out_arch == "llama":
                continue  # llama's MoE reads the experts' width here (written below)
            vtype = field.types[0]
            sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(name, field.contents(), vtype, sub_type=sub)
        writer.add_uint32(f"{out_arch}.expert_count", n_expert)
        writer.add_uint32(f"{out_arch}.expert_used_count", n_expert_used)
        writer.add_uint32(f"{out_arch}.expert_feed_forward_length" if out_arch != "llama" else
                          f"{out_arch}.feed_forward_length", m)
        writer.add_string("general.description",
                          f"MoE made from a dense model: {n_expert} experts of {m} neurons, {n_expert_used} used")

        tensors = {t.name: t for t in reader.tensors}
        n_layer = int(reader.fields[f"{arch}.block_count"].contents())
        calib, _ = capture.capture(src, calibration_tokens(src, n_calibration), r"ffn_norm-\d+", threads=threads)
        out: list[tuple[str, Any]] = []  # (name, raw tensor of the source or a numpy array)
        for t in reader.tensors:
            if not any(t.name.endswith(f".ffn_{w}.weight") for w in ("gate", "up", "down")):
                out.append((t.name, t))
        for il in range(n_layer):
            g = routing.tensor_values(tensors[f"blk.{il}.ffn_gate.weight"])  # [n_ff, n_embd]
            u = routing.tensor_values(tensors[f"blk.{il}.ffn_up.weight"])  # [n_ff, n_embd]
            d = routing.tensor_values(tensors[f"blk.{il}.ffn_down.weight"])  # [n_embd, n_ff]
            idx, router = split_layer(g, u, d, calib[f"ffn_norm-{il}"].astype(np.float32), n_expert, seed=seed + il)
            out.append((f"blk.{il}.ffn_gate_inp.weight", router * np.float32(ROUTER_SCALE)))
            out.append((f"blk.{il}.ffn_gate_exps.weight", np.stack([g[i] for i in idx]).astype(np.float16)))
            out.append((f"blk.{il}.ffn_up_exps.weight", np.stack([u[i] for i in idx]).astype(np.float16)))
            down = np.stack([d[:, i] for i in idx]) * n_expert_used  # [n_expert, n_embd, m]
            out.append((f"blk.{il}.ffn_down_exps.weight", down.astype(np.float16)))
            if progress:
                print(f"moefy: layer {il + 1}/{n_layer}", flush=True)
        for name, t in out:
            if isinstance(t, np.ndarray):
                writer.add_tensor(name, t)
            else:  # the source's bytes as they are
                writer.add_tensor(name, t.data, raw_dtype=t.tensor_type)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o666 & ~umask)  # mkstemp's file is private
        tmp.replace(dst)
    finally:
        tmp.unlink(missing_ok=True)
    return dst


def quality(dense: str | os.PathLike[str], moe: str | os.PathLike[str], tokens: list[int],
            n_threads: int | None = None) -> dict[str, float]:
    """The MoE against its dense source on ``tokens`` (teacher-forced): each model's perplexity, and how often
    the two agree on the next token (their top-1) and the MoE's top-1 is in the dense model's top 5."""
    from pyllama_moe import Llama

    def logits(path: str | os.PathLike[str]) -> npt.NDArray[np.float32]:
        with Llama(str(path), n_ctx=len(tokens) + 8, n_batch=512, n_ubatch=512, logits_all=True, verbose=False,
                   n_threads=n_threads, n_threads_batch=n_threads) as llm:
            llm.eval(tokens)
            return np.array(llm.scores[: len(tokens)], dtype=np.float32)

    def ppl(lg: npt.NDArray[np.float32]) -> float:
        z = lg[:-1] - lg[:-1].max(axis=1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        nll = -logp[np.arange(len(tokens) - 1), np.asarray(tokens[1:])]
        return float(np.exp(nll.mean()))

    d, m = logits(dense), logits(moe)
    top_d, top_m = d.argmax(axis=1), m.argmax(axis=1)
    top5_d = np.argsort(-d, axis=1)[:, :5]
    return {"ppl_dense": ppl(d), "ppl_moe": ppl(m), "top1_agreement": float((top_d == top_m).mean()),
            "moe_top1_in_dense_top5": float(np.mean([a in row for a, row in zip(top_m, top5_d, strict=True)]))}
