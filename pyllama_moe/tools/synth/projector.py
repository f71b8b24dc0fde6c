"""Write a random-weight multimodal projector (an "mmproj" GGUF) that libmtmd (b11549) loads beside a synthetic text
model, so that images can be tested without downloads.

``llama4``: Llama 4's vision tower as ``clip.cpp`` reads it (``PROJECTOR_TYPE_LLAMA4``, ``models/llama4.cpp``): an
unfolded patch convolution (a linear layer over ``patch_size`` x ``patch_size`` x 3 pixels), a class embedding, learned
and 2D rotary positions, a ViT of layer-normed blocks with biases, the CLS token dropped, a pixel shuffle of
``scale_factor`` x ``scale_factor`` patches, a two-layer GELU MLP and the projection to the text model's width. The
tensor names, shapes and metadata keys are those of Llama-4-Scout's mmproj (``convert_hf_to_gguf.py``); the sizes are
tiny: with the defaults an image tile is 56 x 56 pixels, 16 patches and 4 tokens, and the file is about 210 KiB. The
text model is ``synth``'s ``llama4`` (a MoE every other layer); the projector only needs its width (``n_embd_text``).

Weights are f32, normal with standard deviation ``DENSE_STD`` (norm weights ones, biases zero), from ``seed``: the
same arguments give a byte-identical file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pyllama_moe.tools.synth.shapes import DENSE_STD

PROJECTOR_FAMILIES = ("llama4",)
# the projector family of each text architecture of synth that has a vision variant in the pin
FAMILY_OF_ARCH = {"llama4": "llama4"}


def family_of(arch: str) -> str:
    """The projector family for synth's text architecture ``arch``; ``ValueError`` for one without a vision variant."""
    try:
        return FAMILY_OF_ARCH[arch]
    except KeyError:
        raise ValueError(f"no projector for --arch {arch}: synth writes one for "
                         f"{', '.join(sorted(FAMILY_OF_ARCH))}") from None


@dataclass(frozen=True)
class ProjectorShape:
    n_embd: int = 32  # the vision tower's width
    n_ff: int = 64
    n_head: int = 2
    n_layer: int = 2
    image_size: int = 56  # a tile's side, in pixels
    patch_size: int = 14
    scale_factor: int = 2  # the pixel shuffle's merge
    n_mlp: int = 64  # the adapter MLP's width

    @property
    def n_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def tokens_per_tile(self) -> int:
        return self.n_patches // (self.scale_factor * self.scale_factor)

    def check(self) -> None:
        for name in ("n_embd", "n_ff", "n_head", "n_layer", "image_size", "patch_size", "scale_factor", "n_mlp"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be a multiple of n_head ({self.n_head})")
        side = self.image_size // self.patch_size
        if self.image_size % self.patch_size or side % self.scale_factor:
            raise ValueError(f"image_size ({self.image_size}) must be a multiple of patch_size ({self.patch_size}) "
                             f"times scale_factor ({self.scale_factor})")


def _tensors(s: ProjectorShape, n_embd_text: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Every tensor, as numpy arrays whose shapes are ggml's reversed (rows = output features)."""

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * DENSE_STD).astype(np.float32)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    def zeros(n: int) -> np.ndarray:
        return np.zeros(n, dtype=np.float32)

    e, p = s.n_embd, s.patch_size
    out: dict[str, np.ndarray] = {
        "v.patch_embd.weight": w(e, 3 * p * p),
        "v.class_embd": w(e),
        "v.position_embd.weight": w(s.n_patches + 1, e),
        "v.pre_ln.weight": ones(e), "v.pre_ln.bias": zeros(e),
        "v.post_ln.weight": ones(e), "v.post_ln.bias": zeros(e),
    }
    for il in range(s.n_layer):
        b = f"v.blk.{il}"
        for t in ("attn_q", "attn_k", "attn_v", "attn_out"):
            out[f"{b}.{t}.weight"] = w(e, e)
            out[f"{b}.{t}.bias"] = zeros(e)
        for t in ("ln1", "ln2"):
            out[f"{b}.{t}.weight"] = ones(e)
            out[f"{b}.{t}.bias"] = zeros(e)
        out[f"{b}.ffn_up.weight"] = w(s.n_ff, e)
        out[f"{b}.ffn_up.bias"] = zeros(s.n_ff)
        out[f"{b}.ffn_down.weight"] = w(e, s.n_ff)
        out[f"{b}.ffn_down.bias"] = zeros(e)
    merged = e * s.scale_factor * s.scale_factor
    out["mm.model.mlp.1.weight"] = w(s.n_mlp, merged)
    out["mm.model.mlp.2.weight"] = w(s.n_mlp, s.n_mlp)
    out["mm.model.fc.weight"] = w(n_embd_text, s.n_mlp)
    return out


def write_projector(path: str | os.PathLike[str], n_embd_text: int, family: str = "llama4", *, seed: int = 0,
                    shape: ProjectorShape | None = None) -> Path:
    """Write a random-weight mmproj GGUF of ``family`` whose embeddings are ``n_embd_text`` wide (the text model's
    ``embedding_length``) to ``path`` and return it. Bad arguments raise ``ValueError`` naming the parameter."""
    if family not in PROJECTOR_FAMILIES:
        raise ValueError(f"family must be one of {', '.join(PROJECTOR_FAMILIES)}, got {family!r}")
    if isinstance(n_embd_text, bool) or not isinstance(n_embd_text, int) or n_embd_text < 1:
        raise ValueError(f"n_embd_text must be a positive integer, got {n_embd_text!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
        raise ValueError(f"seed must be an integer in [0, 2**64), got {seed!r}")
    s = shape or ProjectorShape()
    s.check()
    import gguf

    out = Path(path)
    tmp = out.with_name(out.name + ".partial")
    writer: Any = gguf.GGUFWriter(tmp, "clip")
    try:
        writer.add_string("general.name", f"pyllama-moe synthetic {family} projector")
        writer.add_string("clip.projector_type", family)
        writer.add_bool("clip.has_vision_encoder", True)
        writer.add_bool("clip.has_audio_encoder", False)
        writer.add_bool("clip.use_gelu", True)
        writer.add_uint32("clip.vision.embedding_length", s.n_embd)
        writer.add_uint32("clip.vision.feed_forward_length", s.n_ff)
        writer.add_uint32("clip.vision.block_count", s.n_layer)
        writer.add_uint32("clip.vision.projection_dim", n_embd_text)
        writer.add_uint32("clip.vision.attention.head_count", s.n_head)
        writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-5)
        writer.add_uint32("clip.vision.image_size", s.image_size)
        writer.add_uint32("clip.vision.patch_size", s.patch_size)
        writer.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
        writer.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
        writer.add_uint32("clip.vision.projector.scale_factor", s.scale_factor)
        writer.add_uint64("pyllama_moe.synth.seed", seed)
        for name, arr in _tensors(s, n_embd_text, np.random.default_rng(seed)).items():
            writer.add_tensor(name, arr)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
    os.replace(tmp, out)
    return out
