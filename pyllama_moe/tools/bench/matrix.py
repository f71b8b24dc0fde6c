"""The matrix of the bench: the placements (setups) it can run, the switch settings each one runs under, and what a
setup becomes for the native tools and for ``Llama`` (its cache size, a fit's arguments)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from pyllama_moe.gguf_info import GGUFInfo


@dataclasses.dataclass(frozen=True)
class Setup:
    """One placement: how the tools are told about it."""

    name: str
    args: tuple[str, ...]          # common to both tools
    bench_args: tuple[str, ...]    # llama-bench only
    batched_args: tuple[str, ...]  # llama-batched-bench only
    cache_fraction: float = 0.0    # of the expert bytes; > 0 runs llama-batched-bench
    cache_mib_fixed: int = 0       # or a size in MiB (the cache-<N>mib setups)
    needs_gpu: bool = True
    llama_kwargs: tuple[tuple[str, Any], ...] = ()  # the same placement as Llama keyword arguments
    dense: bool = False            # runs on the --dense model; "{half}" and "{upper}" in the arguments are
                                   # half its layers and a pattern of the FFN weights of its upper half
    fit_gib: int = 0               # fit-<G>gib[-cache]: Python only, fit=True with a device target that leaves G GiB,
    cache_auto: bool = False       # without the cache or with moe_cache_mib="auto" (the fit chooses layers or cache)

    @property
    def has_cache(self) -> bool:
        return self.cache_fraction > 0 or self.cache_mib_fixed > 0

    @property
    def hybrid(self) -> bool | str | None:
        """``Llama``'s ``moe_hybrid`` of a ``-hybrid`` or ``-auto`` setup (True, ``"auto"``), None otherwise."""
        value: bool | str | None = dict(self.llama_kwargs).get("moe_hybrid")
        return value

    @property
    def python_only(self) -> bool:
        """Run through the Python API only: a fit (ours is Python's) or the hybrid decode (the native tools have no
        option for it, and would run the cache alone under its name)."""
        return bool(self.fit_gib) or self.hybrid is not None

    def resolve(self, n_layer: int) -> Setup:
        """The setup with its placeholders filled in for a model of ``n_layer`` layers."""
        half = n_layer // 2
        upper = r"blk\.(" + "|".join(map(str, range(half, n_layer))) + r")\.ffn_(up|down|gate)\.weight"

        def fill(v: Any) -> Any:  # a keyword argument that is only "{half}" is the number
            return half if v == "{half}" else v.format(half=half, upper=upper) if isinstance(v, str) else v

        return dataclasses.replace(self, args=tuple(a.format(half=half, upper=upper) for a in self.args),
                                   llama_kwargs=tuple((k, fill(v)) for k, v in self.llama_kwargs))


_HOST = (("n_gpu_layers", -1), ("cpu_moe", True))
SETUPS: dict[str, Setup] = {
    "gpu": Setup("gpu", ("-ngl", "99"), (), (), llama_kwargs=(("n_gpu_layers", -1),)),
    "cpu_moe-mmap": Setup("cpu_moe-mmap", ("-ngl", "99", "-lm", "mmap"), ("-ncmoe", "99"), ("--cpu-moe",),
                          needs_gpu=False, llama_kwargs=(*_HOST, ("load_mode", "mmap"))),
    "cpu_moe-none": Setup("cpu_moe-none", ("-ngl", "99", "-lm", "none"), ("-ncmoe", "99"), ("--cpu-moe",),
                          needs_gpu=False, llama_kwargs=(*_HOST, ("load_mode", "none"))),
    "cache-10": Setup("cache-10", ("-ngl", "99", "-lm", "none"), (), ("--cpu-moe",), cache_fraction=0.10,
                      llama_kwargs=(*_HOST, ("load_mode", "none"))),
    "cache-25": Setup("cache-25", ("-ngl", "99", "-lm", "none"), (), ("--cpu-moe",), cache_fraction=0.25,
                      llama_kwargs=(*_HOST, ("load_mode", "none"))),
    "cache-50": Setup("cache-50", ("-ngl", "99", "-lm", "none"), (), ("--cpu-moe",), cache_fraction=0.50,
                      llama_kwargs=(*_HOST, ("load_mode", "none"))),
    "cache-80": Setup("cache-80", ("-ngl", "99", "-lm", "none"), (), ("--cpu-moe",), cache_fraction=0.80,
                      llama_kwargs=(*_HOST, ("load_mode", "none"))),
    # a dense model (--dense) with half of it in pinned host memory: its upper layers (-ngl, their KV cache
    # and attention on the CPU too), or only their FFN weights (-ot, everything else on the GPU)
    "dense-gpu": Setup("dense-gpu", ("-ngl", "99"), (), (), dense=True, llama_kwargs=(("n_gpu_layers", -1),)),
    "dense-ngl-half": Setup("dense-ngl-half", ("-ngl", "{half}", "-lm", "none"), (), (), needs_gpu=False, dense=True,
                            llama_kwargs=(("n_gpu_layers", "{half}"), ("load_mode", "none"))),
    "dense-ffn-half": Setup("dense-ffn-half", ("-ngl", "99", "-lm", "none", "-ot", "{upper}=CPU"), (), (),
                            needs_gpu=False, dense=True,
                            llama_kwargs=(("n_gpu_layers", -1), ("load_mode", "none"),
                                          ("override_tensor", "{upper}=CPU"))),
}
DENSE_SETUPS = tuple(n for n, s in SETUPS.items() if s.dense)
CACHE_MIB_SETUP = re.compile(r"cache-(\d+)mib")
MMAP_SUFFIX = "-mmap"
# a cache setup with one of these appended: Llama(moe_hybrid=...) beside it, Python only
HYBRID_SUFFIXES: dict[str, bool | str] = {"-hybrid": True, "-auto": "auto"}


FIT_SETUP = re.compile(r"fit-(\d+)gib(-cache)?")


def setup_named(name: str) -> Setup | None:
    """A setup of SETUPS, ``cache-<N>mib`` (the cache setups with a cache of N MiB), ``fit-<G>gib`` and
    ``fit-<G>gib-cache`` (``fit=True`` with G GiB of the first GPU, without the cache and with ``"auto"``), or a
    cache setup with ``-mmap`` appended: its experts loaded with mmap (llama.cpp's default load) instead of in
    pinned memory, where a host lookup uploads its misses from page-cache pages; or a cache setup with ``-hybrid``
    or ``-auto`` appended (``cache-25-hybrid``): the same with ``moe_hybrid=True`` or ``"auto"``, Python only."""
    if name in SETUPS:  # cpu_moe-mmap is a setup of its own
        return SETUPS[name]
    for suffix, mode in HYBRID_SUFFIXES.items():
        if name.endswith(suffix):
            base = setup_named(name[:-len(suffix)])
            if base is None or not base.has_cache or base.hybrid is not None:
                return None
            return dataclasses.replace(base, name=name, llama_kwargs=(*base.llama_kwargs, ("moe_hybrid", mode)))
    if name.endswith(MMAP_SUFFIX):
        base = setup_named(name[:-len(MMAP_SUFFIX)])
        if base is None or not base.has_cache:
            return None
        args = list(base.args)
        args[args.index("-lm") + 1] = "mmap"  # the load mode's value, not any other "none"
        return dataclasses.replace(base, name=name, args=tuple(args),
                                   llama_kwargs=tuple((k, "mmap" if k == "load_mode" else v)
                                                      for k, v in base.llama_kwargs))
    m = CACHE_MIB_SETUP.fullmatch(name)
    if m and int(m.group(1)) > 0:
        return dataclasses.replace(SETUPS["cache-25"], name=name, cache_fraction=0.0, cache_mib_fixed=int(m.group(1)))
    m = FIT_SETUP.fullmatch(name)
    if m and int(m.group(1)) > 0:
        return Setup(name, (), (), (), fit_gib=int(m.group(1)), cache_auto=bool(m.group(2)))
    return None


# every kill switch of the patch series: all of them at 0 is upstream's behaviour (--upstream)
KILL_SWITCHES = ("GGML_SCHED_ASYNC_INPUTS", "GGML_SCHED_PREFETCH", "LLAMA_MOE_CACHE_DEVICE", "LLAMA_MOE_CACHE_PREFETCH",
                 "LLAMA_MOE_CACHE_SEED", "LLAMA_MOE_CACHE_PREDICT")
UPSTREAM = "upstream"
# the switch setting of the rows of --pristine: upstream's own tools, run with no switch set
PRISTINE = {"(pristine build)": "1"}


def upstream_switches() -> dict[str, str]:
    return {k: "0" for k in KILL_SWITCHES}


def cache_mib(model: Path, setup: Setup) -> int:
    """The MoE cache's MiB of ``setup`` on ``model`` (0: no cache)."""
    if setup.cache_mib_fixed:
        return setup.cache_mib_fixed
    return cache_mib_of(GGUFInfo.read(model).expert_bytes, setup) if setup.cache_fraction else 0


def cache_mib_of(expert_bytes: int, setup: Setup) -> int:
    """The MoE cache's MiB of ``setup`` on a model of ``expert_bytes`` bytes of experts: its fixed size, or its
    fraction of them in whole MiB, at least 1 (0: no cache)."""
    if setup.cache_mib_fixed:
        return setup.cache_mib_fixed
    return max(1, int(expert_bytes * setup.cache_fraction) >> 20) if setup.cache_fraction else 0


def fit_kwargs(setup: Setup) -> dict[str, Any]:
    """``Llama`` arguments of a fit setup: a fit target that leaves ``fit_gib`` GiB of the first GPU's free memory."""
    from pyllama_moe import backend

    gpu = next(d for d in backend.devices() if d.type == "gpu")
    target = max(0, gpu.memory_free - (setup.fit_gib << 30)) >> 20
    return {"fit": True, "fit_target_mib": target, "n_gpu_layers": -1, "load_mode": "none",
            "moe_cache_mib": "auto" if setup.cache_auto else 0}
