"""Server and model settings, named as llama-cpp-python's server names them, plus the MoE controls."""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

logger = logging.getLogger("pyllama_moe")


class ModelSettings(BaseSettings):
    """One model: the keyword arguments of ``pyllama_moe.Llama`` that a server exposes."""

    model_config = SettingsConfigDict(extra="forbid", protected_namespaces=(), env_prefix="PYLLAMA_MOE_")

    model: str = Field(description="path to the GGUF model")
    model_alias: str | None = Field(default=None, description="the name clients ask for (default: the path)")
    # placement
    n_gpu_layers: int = Field(default=0, description="layers on the GPU; -1 = all")
    split_mode: int = Field(default=1, description="llama_split_mode: 0 none, 1 layer, 2 row")
    main_gpu: int = 0
    tensor_split: list[float] | None = None
    use_mmap: bool = True
    use_mlock: bool = False
    kv_overrides: list[str] | None = Field(default=None, description="KEY=TYPE:VALUE, TYPE of bool/int/float/str")
    # context
    seed: int = 0xFFFFFFFF
    n_ctx: int = 2048
    # not given: Llama's defaults, llama-cpp-python's 512 unless the experts come from host memory (docs/compat.md)
    n_batch: int | None = Field(default=None, ge=1, description="tokens per llama_decode call (default 512, or the "
                                "chosen ubatch where the experts are in host memory)")
    n_ubatch: int | None = Field(default=None, ge=1, description="tokens per ubatch (default 512; where the experts "
                                 "are in host memory, chosen up to 2048 to fit the GPU's memory)")
    n_threads: int | None = None
    n_threads_batch: int | None = None
    rope_freq_base: float = 0.0
    rope_freq_scale: float = 0.0
    embedding: bool = False
    pooling_type: int = Field(default=-1,
                              description="llama_pooling_type: -1 the model's, 0 none, 1 mean, 2 cls, 3 last")
    offload_kqv: bool = True
    flash_attn: bool = False
    last_n_tokens_size: int = 64
    chat_format: str | None = Field(default=None, description="the chat format; with clip_model_path a vision one: "
                                    "llava-1-5, llava-1-6, mtmd (the model's template), gemma4, ...")
    clip_model_path: str | None = Field(default=None, description="a multimodal projector (mmproj GGUF): image_url "
                                        "parts of chat messages are seen by the model")
    verbose: bool = True
    # MoE and placement (pyllama-moe)
    moe_cache_mib: int = Field(default=0, description="device cache for host-resident experts, MiB; 0 = off")
    moe_cache_state: str | None = Field(default=None, description="the MoE cache's warm-start file: read at load, "
                                        "written at close (python -m pyllama_moe calibrate writes one)")
    moe_cache_predict: int | None = Field(default=None, ge=0, description="the device lookups' prefetch of the next "
                                          "MoE layer's predicted experts: copies per layer; 0 = off (default 2)")
    moe_cache_predict_depth: int | None = Field(default=None, ge=1, le=8, description="the MoE layers ahead each "
                                                "device lookup predicts (default 1: the next one)")
    moe_hybrid: bool | Literal["auto"] | None = Field(
        default=None, description="the CPU computes a share of the MoE cache's misses in decode while PCIe uploads "
                                  "the rest: false, true or auto (on where it pays, measured); default off")
    cpu_moe: bool = Field(default=False, description="keep every expert tensor in host memory")
    n_cpu_moe: int = Field(default=0, description="keep the experts of the first N layers in host memory")
    override_tensor: str | None = Field(default=None, description="llama.cpp -ot: PATTERN=BUFFER_TYPE,...")
    load_mode: str | None = Field(default=None, description="auto, none, mmap, mlock, mmap_mlock, direct_io")
    fit: bool = False
    # serving
    n_parallel: int = Field(default=1, ge=1, le=256,
                            description="requests decoded together in one batch per step, each a slot with "
                                        "n_ctx / n_parallel of the context; 1 = one request at a time")
    max_queue: int = Field(default=64, ge=0, description="requests waiting beyond the n_parallel running "
                                                         "(HTTP 429 beyond)")

    @field_validator("n_threads", "n_threads_batch")
    @classmethod
    def _threads(cls, value: int | None, info: Any) -> int | None:
        """Bounded as ``Llama`` bounds them (``params.max_threads``), refused when the settings are read."""
        from pyllama_moe.params import check_threads

        return None if value is None else check_threads(info.field_name, value)

    @field_validator("moe_hybrid", mode="before")
    @classmethod
    def _hybrid(cls, value: Any) -> Any:
        """``false``, ``true`` or ``auto`` (any case) from the command line or the environment; pydantic's own
        reading of a bool would take ``on``, ``yes`` or ``1`` too, which Llama refuses."""
        if isinstance(value, str):
            words: dict[str, bool | str] = {"false": False, "true": True, "auto": "auto"}
            if value.lower() not in words:
                raise ValueError(f"moe_hybrid must be false, true or auto, got {value!r}")
            return words[value.lower()]
        if value is not None and not isinstance(value, bool):
            raise ValueError(f"moe_hybrid must be false, true or auto, got {value!r}")
        return value

    @field_validator("n_parallel")
    @classmethod
    def _parallel(cls, value: int, info: Any) -> int:
        """Each step holds a token of every slot: at most ``n_batch`` slots (refused when the settings are read)."""
        n_batch = info.data.get("n_batch")
        if n_batch is not None and value > n_batch:
            raise ValueError(f"n_parallel ({value}) must be at most n_batch ({n_batch})")
        return value

    @model_validator(mode="after")
    def _vision(self) -> ModelSettings:
        """A vision chat format needs a projector; a projector needs one request at a time (its images are evaluated
        into the single-request context, not into the parallel slots)."""
        from pyllama_moe.chat.vision import VISION_CHAT_FORMATS

        if self.chat_format in VISION_CHAT_FORMATS and self.clip_model_path is None:
            raise ValueError(f"chat_format {self.chat_format!r} needs clip_model_path (the projector's GGUF)")
        if self.clip_model_path is not None and self.n_parallel > 1:
            raise ValueError("clip_model_path serves one request at a time: leave n_parallel at 1")
        return self

    def chat_handler(self) -> Any:
        """The vision chat handler of ``chat_format`` over ``clip_model_path`` (``mtmd``, the model's own template,
        when no chat format is given), which reads no local files; None without a projector or with a text chat
        format (the projector is then not used, as in llama-cpp-python)."""
        from pyllama_moe.chat.vision import VISION_CHAT_FORMATS

        if self.clip_model_path is None:
            return None
        name = self.chat_format or "mtmd"
        if name not in VISION_CHAT_FORMATS:
            logger.warning("clip_model_path %s is not used: chat_format %r is not a vision format (%s)",
                           self.clip_model_path, name, ", ".join(VISION_CHAT_FORMATS))
            return None
        return VISION_CHAT_FORMATS[name](self.clip_model_path, verbose=self.verbose, local_files=False)

    def llama_kwargs(self) -> dict[str, Any]:
        kw = self.model_dump(exclude={"model", "model_alias", "kv_overrides", "n_parallel", "max_queue",
                                      "clip_model_path"})
        handler = self.chat_handler()
        if handler is not None:
            kw["chat_handler"] = handler
        for name in ("n_batch", "n_ubatch"):  # not given: Llama chooses (a given one is honoured)
            if kw[name] is None:
                del kw[name]
        if self.n_parallel > 1:
            kw["n_seq_max"] = self.n_parallel
        if self.kv_overrides:
            kw["kv_overrides"] = parse_kv_overrides(self.kv_overrides)
        return kw

    @property
    def alias(self) -> str:
        return self.model_alias or self.model


class ServerSettings(BaseSettings):
    """The HTTP side."""

    model_config = SettingsConfigDict(extra="forbid", env_prefix="PYLLAMA_MOE_")

    host: str = "localhost"
    port: int = 8000
    api_key: str | None = Field(default=None, description="required as 'Authorization: Bearer <key>' when set")
    interrupt_requests: bool = Field(default=True, description="a new request stops a running stream")
    ssl_keyfile: str | None = None
    ssl_certfile: str | None = None
    # limits no real client reaches: a request past them is refused before it holds a model
    max_request_bytes: int = Field(default=32 << 20, ge=1, description="largest request body (HTTP 413 beyond)")
    max_messages: int = Field(default=10_000, ge=1, description="most chat messages in one request")
    max_grammar_bytes: int = Field(default=128 << 10, ge=1, description="largest 'grammar' of a request (HTTP 400)")
    max_logprobs: int = Field(default=20, ge=0, description="most 'logprobs' / 'top_logprobs' of a request (HTTP 400)")


class ConfigFile(ServerSettings):
    """``--config_file``: the server settings and several models."""

    models: list[ModelSettings] = Field(default_factory=list)


_KV_PARSERS: dict[str, Callable[[str], bool | int | float | str]] = {
    "bool": lambda v: v.lower() in ("1", "true"), "int": int, "float": float, "str": str}


def parse_kv_overrides(items: list[str]) -> dict[str, bool | int | float | str]:
    out: dict[str, bool | int | float | str] = {}
    for item in items:
        key, sep, rest = item.partition("=")
        kind, sep2, value = rest.partition(":")
        if not sep or not sep2 or kind not in ("bool", "int", "float", "str"):
            raise ValueError(f"kv_overrides: {item!r} is not KEY=TYPE:VALUE with TYPE bool, int, float or str")
        out[key] = _KV_PARSERS[kind](value)
    return out


def _add_fields(parser: argparse.ArgumentParser, model: type[BaseModel], skip: tuple[str, ...] = ()) -> None:
    for name, field in model.model_fields.items():
        if name in skip:
            continue
        ann = field.annotation
        text = str(ann)
        kw: dict[str, Any] = {"dest": name, "help": field.description or "", "default": argparse.SUPPRESS}
        if ann is bool:
            kw["type"] = lambda v: v.lower() in ("1", "true", "yes", "on")
        elif "list[float]" in text:
            kw.update(type=float, nargs="+")
        elif "list[str]" in text:
            kw.update(type=str, nargs="+")
        elif ann is int or text == "int | None":
            kw["type"] = int
        elif ann is float:
            kw["type"] = float
        parser.add_argument(f"--{name}", **kw)


def parse_args(argv: list[str] | None = None) -> tuple[ServerSettings, list[ModelSettings]]:
    """llama-cpp-python's command line: the model and server fields as --flags, or --config_file."""
    ap = argparse.ArgumentParser(prog="python -m pyllama_moe.server",
                                 description="OpenAI-compatible server over pyllama_moe.Llama")
    ap.add_argument("--config_file", type=Path, help="a JSON file: server settings and a 'models' list")
    _add_fields(ap, ModelSettings)
    _add_fields(ap, ServerSettings)
    args = vars(ap.parse_args(argv))
    config = args.pop("config_file", None)
    server_keys = set(ServerSettings.model_fields)
    if config is not None:
        data = json.loads(config.read_text())
        cfg = ConfigFile(**{**data, **{k: v for k, v in args.items() if k in server_keys}})
        if not cfg.models:
            ap.error(f"{config}: no models")
        return ServerSettings(**cfg.model_dump(exclude={"models"})), cfg.models
    if "model" not in args:
        ap.error("--model (or --config_file) is required")
    server = ServerSettings(**{k: v for k, v in args.items() if k in server_keys})
    model = ModelSettings(**{k: v for k, v in args.items() if k not in server_keys})
    return server, [model]


