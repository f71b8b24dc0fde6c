"""The bench's models: written with :mod:`pyllama_moe.tools.synth` where absent, and what their GGUF headers say
(the routing regime), read once by :class:`pyllama_moe.gguf_info.GGUFInfo`."""

from __future__ import annotations

from pathlib import Path

from pyllama_moe.gguf_info import GGUFInfo

# --dense with --preset: the synth preset of the dense model beside a MoE preset (others: the preset as a dense qwen3)
DENSE_PRESETS = {"30b-a3b": "8b"}


def write_model(path: Path, preset: str, dense: bool = False, progress: bool = False,
                routing: str = "realistic") -> None:
    """The bench's model of ``preset`` (with ``dense``: DENSE_PRESETS' dense preset, else the preset as a dense
    qwen3), its routing regime ``routing`` (see ``synth``)."""
    from pyllama_moe.tools.synth import writer

    if dense:
        writer.write_model(path, DENSE_PRESETS.get(preset, preset), arch="qwen3", progress=progress)
    else:
        writer.write_model(path, preset, progress=progress, routing=routing)


def routing_regime(model: Path) -> str:
    """The routing regime a synthetic model was written with (``pyllama_moe.synth.routing``; files from before
    the key: ``collapsed`` with positive scales, else ``uniform`` or ``skew``), ``-`` for other models."""
    from pyllama_moe.tools.synth import regime_of, writer

    meta = GGUFInfo.read(model).meta
    routing, signs = meta.get(writer.META_PREFIX + "routing"), meta.get(writer.META_PREFIX + "scale_signs")
    if routing is None and signs is None:
        return "-"  # not a synthetic model
    return regime_of(routing or "", float(meta.get(writer.META_PREFIX + "skew", 0.0)), signs or "")
