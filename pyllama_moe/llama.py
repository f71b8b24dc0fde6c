"""``Llama``: llama-cpp-python 0.3.36's class over the patched library, with the MoE controls.

Orchestration only: the keywords become ``params``' structs, ``moe.place`` decides the placement (cache
size, fit, load mode), the C handles are owned by ``Model``, ``Context``, ``Batch`` and ``Sampler``, the
evaluated tokens and their state by ``Session``, and a completion is ``completion``'s request over that session.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
import threading
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from typing import Any, TypeVar, cast

import numpy as np

from pyllama_moe import backend, moe, rpc, ubatch
from pyllama_moe.batch import Batch
from pyllama_moe.cache import longest_token_prefix
from pyllama_moe.completion import Completion, make_request
from pyllama_moe.context import Context
from pyllama_moe.draft_adapt import AdaptiveDraft
from pyllama_moe.errors import ClosedError, LlamaError
from pyllama_moe.fairlock import FairRLock
from pyllama_moe.ffi import lib
from pyllama_moe.llama_types import CreateEmbeddingResponse, LlamaState
from pyllama_moe.model import LoraAdapter, Model, model_path_str
from pyllama_moe.moe_warm import WarmStart
from pyllama_moe.mtmd import CHUNK_TEXT, InputChunks, MtmdContext
from pyllama_moe.params import (
    ContextParams,
    ModelParams,
    check_bool,
    check_float,
    check_int,
    check_numa,
    check_rpc_servers,
    load_mode,
    load_mode_name,
)
from pyllama_moe.sampler import Sampler, SamplingParams
from pyllama_moe.session import Session, logits_to_logprobs
from pyllama_moe.slots import Job, Slots
from pyllama_moe.vocab import BaseLlamaTokenizer, LlamaTokenizer, token_array

logger = logging.getLogger("pyllama_moe")

F = TypeVar("F", bound=Callable[..., Any])


def _open(fn: F) -> F:
    """The method needs the Llama open (after ``close()`` it raises ``ClosedError``); llama.cpp's
    log is dropped during the call unless the Llama is verbose."""

    @functools.wraps(fn)
    def wrapper(self: Llama, *args: Any, **kwargs: Any) -> Any:
        # one call at a time: the context is not thread-safe, a second thread waits for the first (and for a
        # stream of another thread to end)
        with self._lock:
            self._wait_turn()
            if self._closed:
                raise ClosedError(f"Llama.{fn.__name__}: this Llama ({self.model_path}) has been closed")
            with backend.verbosity(self.verbose):
                return fn(self, *args, **kwargs)

    return cast(F, wrapper)


_SAMPLING_KEYS = ("temperature", "top_k", "top_p", "min_p", "typical_p", "repeat_penalty", "frequency_penalty",
                  "presence_penalty", "mirostat_mode", "mirostat_tau", "mirostat_eta", "logit_bias", "grammar")


class Llama:
    """High-level model and context, as llama-cpp-python's ``Llama``; also a context manager."""

    def __init__(
        self,
        model_path: str,
        *,
        # model
        n_gpu_layers: int = 0,
        split_mode: int = lib.LLAMA_SPLIT_MODE_LAYER,
        main_gpu: int = 0,
        tensor_split: list[float] | None = None,
        vocab_only: bool = False,
        use_mmap: bool = True,
        use_mlock: bool = False,
        kv_overrides: dict[str, bool | int | float | str] | None = None,
        # context
        seed: int = lib.LLAMA_DEFAULT_SEED,
        n_ctx: int = 512,
        n_batch: int = ubatch.UNSET,
        n_ubatch: int = ubatch.UNSET,
        n_threads: int | None = None,
        n_threads_batch: int | None = None,
        rope_scaling_type: int | None = lib.LLAMA_ROPE_SCALING_TYPE_UNSPECIFIED,
        pooling_type: int = lib.LLAMA_POOLING_TYPE_UNSPECIFIED,
        attention_type: int = lib.LLAMA_ATTENTION_TYPE_UNSPECIFIED,
        rope_freq_base: float = 0.0,
        rope_freq_scale: float = 0.0,
        yarn_ext_factor: float | None = None,
        yarn_attn_factor: float | None = None,
        yarn_beta_fast: float | None = None,
        yarn_beta_slow: float | None = None,
        yarn_orig_ctx: int = 0,
        logits_all: bool = False,
        embedding: bool = False,
        offload_kqv: bool = True,
        flash_attn: bool | None = False,
        op_offload: bool | None = None,
        swa_full: bool | None = None,
        # sampling
        no_perf: bool = False,
        last_n_tokens_size: int = 64,
        # LoRA
        lora_base: str | None = None,
        lora_scale: float = 1.0,
        lora_path: str | None = None,
        # backend
        numa: bool | int = False,
        rpc_servers: str | list[str] | None = None,
        # chat
        chat_format: str | None = None,
        chat_handler: Any = None,
        draft_model: Any = None,
        draft_adapt: bool = False,
        tokenizer: Any = None,
        # KV cache
        type_k: int | str | None = None,
        type_v: int | str | None = None,
        spm_infill: bool = False,
        verbose: bool = True,
        # MoE and placement (pyllama-moe)
        moe_cache_mib: int | str = 0,
        moe_cache_predict: int | None = None,
        moe_cache_predict_depth: int | None = None,
        moe_hybrid: bool | str | None = None,
        moe_cache_state: str | os.PathLike[str] | None = None,
        cpu_moe: bool = False,
        n_cpu_moe: int = 0,
        override_tensor: str | Mapping[str, str] | None = None,
        load_mode: str | None = None,
        fit: bool = False,
        fit_target_mib: int | list[int] | None = None,
        n_seq_max: int = 1,
        **kwargs: Any,
    ) -> None:
        """Load ``model_path`` and create its context; llama-cpp-python 0.3.36's keywords and meanings,
        except that the YaRN factors default to the model's values (None) rather than fixed numbers, and that
        ``n_ubatch`` left at its default is chosen larger where the experts come from host memory: the largest of
        2048 and its halves, at most ``n_batch`` if given and the context, whose compute buffer fits the device
        memory left (an auto-sized MoE cache gives up to a quarter of itself to it); ``n_batch``, if not given,
        follows it. ``placement["n_ubatch_reason"]`` says why. An ``n_ubatch`` given is honoured.

        MoE and placement keywords (llama.cpp's options of the same meaning):
            moe_cache_mib: device cache in MiB for the experts kept in host memory (0 off; ``"auto"``:
                what the GPUs have left, measured); ignored with a warning without a GPU.
            draft_adapt: verify of each proposal of ``draft_model`` only the part that gives the most tokens a
                second, from the verifications' measured times and the draft's measured acceptance (none where a
                draft does not pay: with a MoE cache a verification looks up the union of its tokens' experts).
            moe_cache_predict: after each device lookup of a decode step, copy at most this many of the experts
                that the next MoE layer is predicted to select (None: the library's default, 2; 0: off).
            moe_cache_predict_depth: how many MoE layers ahead each device lookup predicts, at most
                ``moe_cache_predict`` copies for each (1 to 8; None: the library's default, 1: the next layer only);
                a prediction's copies then run on through the layers before its own. Results unchanged.
            moe_hybrid: in decode steps looked up on the device, the CPU computes a share of each MoE layer's cache
                misses from the host experts while PCIe uploads the rest, the parts summed on the GPU; the share
                follows from the upload and CPU rates the context measures when it is created (``moe_cache_stats()``
                gives them and the experts the CPU computed). ``True``: on; ``"auto"``: on where the decode steps
                are faster with it, by their own times (windows of 32 decode steps with and without it, the faster
                kept and the other tried again after 16 windows), off without a try while the device lookups miss
                too little for the CPU to take an expert a layer or where the CPU is more than twice as slow as the
                upload; ``False`` or None (the default): off, results byte-identical to a context without it. On,
                results are close to, not byte-identical with, the GPU's (the CPU's kernels round differently).
                Needs the MoE cache (``moe_cache_mib``): without one it is ignored with a warning.
            moe_cache_state: a warm-start file (``python -m pyllama_moe calibrate``, or the last run's): at load
                the cache is filled with the experts it names, at close the experts the cache holds are written
                to it; a missing, corrupt or mismatched file is a cold start with a warning.
            cpu_moe: keep every layer's experts in host memory (``--cpu-moe``).
            n_cpu_moe: keep the experts of the first N layers in host memory (``--n-cpu-moe N``).
            override_tensor: ``"pattern=BUFT,..."`` or ``{pattern: BUFT}`` (``-ot``), e.g. ``{"exps": "CPU"}``.
            load_mode: ``"auto"``, ``"none"``, ``"mmap"``, ``"mlock"``, ``"mmap_mlock"``, ``"direct_io"``
                (``--load-mode``); ``use_mmap`` / ``use_mlock`` map onto it when it is not given.
            fit, fit_target_mib: fit the GPU layers, tensor split, overrides (and ``n_ctx=0``) to the
                free device memory less ``fit_target_mib`` per device (``--fit``, ``--fit-target``).
            n_seq_max: sequences of the context (``--parallel``): ``submit_completion`` and
                ``create_completions`` run up to this many completions in one batch per step; each sequence gets
                ``n_ctx / n_seq_max`` of the context, and so does every completion (``n_ctx()``).

        Raises ValueError naming a bad parameter (``ModelNotFoundError``, also a ValueError, for a
        missing file), ``ModelLoadError`` / ``ContextError`` with llama.cpp's reason otherwise.
        """
        # held by every call and by each step of a stream or of the parallel slots; granted in the order asked, so
        # that a call waits for the step in progress only (fairlock.py)
        self._lock = FairRLock()
        # notified when a stream ends: the calls of other threads wait (a FairRLock has what a Condition uses)
        self._turn = threading.Condition(self._lock)  # type: ignore[arg-type]
        self._streamer: int | None = None  # the thread consuming a stream in progress
        self._closed = True  # until everything is made; close() is safe on a half-made Llama
        self._handles: list[Any] = []
        self._projectors: dict[tuple[str, bool], MtmdContext] = {}  # load_projector's, by path and use_gpu
        self._init_kwargs = {k: v for k, v in locals().items() if k not in ("self", "kwargs", "__class__")}
        self._init_kwargs.update(kwargs)
        if kwargs:
            logger.warning("Llama: ignoring unknown keyword arguments %s", ", ".join(sorted(kwargs)))
        if tokenizer is not None and not isinstance(tokenizer, BaseLlamaTokenizer):
            raise ValueError(f"tokenizer must be a BaseLlamaTokenizer (e.g. LlamaHFTokenizer), got {tokenizer!r}")
        self._tokenizer: BaseLlamaTokenizer | None = tokenizer
        if draft_model is not None and not callable(draft_model):
            raise ValueError("draft_model must be a LlamaDraftModel (a callable of the input ids), "
                             f"got {draft_model!r}")
        if not isinstance(draft_adapt, bool):
            raise ValueError(f"draft_adapt must be True or False, got {draft_adapt!r}")
        if draft_adapt and draft_model is None:
            raise ValueError("draft_adapt=True needs a draft_model")
        self.draft_model = AdaptiveDraft(draft_model) if draft_adapt else draft_model
        if moe_cache_state is not None and not isinstance(moe_cache_state, (str, os.PathLike)):
            raise TypeError(f"moe_cache_state must be a path, got {moe_cache_state!r}")
        self.verbose = verbose
        if verbose:
            backend.show_log_on_stderr()
        backend.init()
        backend.numa_init(check_numa(numa))
        rpc_servers = check_rpc_servers(rpc_servers)
        if rpc_servers:
            rpc.add_rpc_servers(rpc_servers)  # their devices take layers like local GPUs
        self.model_path = model_path_str(model_path)
        self.tensor_split, self.kv_overrides = tensor_split, kv_overrides
        if lora_path is not None:
            lora_path = model_path_str(lora_path, "lora_path")
        self.lora_base, self.lora_scale, self.lora_path = lora_base, check_float("lora_scale", lora_scale), lora_path
        self.last_n_tokens_size = check_int("last_n_tokens_size", last_n_tokens_size, -1)
        self.spm_infill = spm_infill
        seed = check_int("seed", seed, -(2**63), 2**64 - 1)  # the session keeps it from here
        self._logits_all = bool(logits_all)
        self.cache: Any = None

        self.model_params = self._model_params(locals())
        devices = rpc.model_devices(rpc_servers)
        if devices is not None:
            self.model_params.set_devices(devices)
        # checked before they are combined, so that a wrong type is named; llama-cpp-python's batch sizes until the
        # placement chooses (moe.place: a larger ubatch where the experts come from host memory and none was given)
        batches = ubatch.Batches.asked(n_batch, n_ubatch)
        n_batch, n_ubatch = batches.defaults(check_int("n_ctx", n_ctx, 0, 2**32 - 1))
        self.context_params = ContextParams(
            n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch, n_threads=n_threads, n_threads_batch=n_threads_batch,
            rope_scaling_type=rope_scaling_type, pooling_type=pooling_type, attention_type=attention_type,
            rope_freq_base=rope_freq_base, rope_freq_scale=rope_freq_scale, yarn_ext_factor=yarn_ext_factor,
            yarn_attn_factor=yarn_attn_factor, yarn_beta_fast=yarn_beta_fast, yarn_beta_slow=yarn_beta_slow,
            yarn_orig_ctx=yarn_orig_ctx, embedding=embedding, offload_kqv=offload_kqv, flash_attn=flash_attn,
            op_offload=op_offload, swa_full=swa_full, no_perf=no_perf, type_k=type_k, type_v=type_v,
            moe_cache_predict=moe_cache_predict, moe_cache_predict_depth=moe_cache_predict_depth,
            moe_hybrid=moe_hybrid, n_seq_max=n_seq_max, moe_cache_cpu=moe.cache_on_cpu(),
        )
        self._placed = moe.place(self.model_path, self.model_params, self.context_params,
                                 moe_cache_mib=moe_cache_mib, fit_memory=fit, fit_target_mib=fit_target_mib,
                                 verbose=verbose, batches=batches)
        self._load(seed)
        moe.warn_unmatched(override_tensor, self._model.tensor_names)
        self._warm: WarmStart | None = None
        if moe_cache_state is not None:
            self._warm = WarmStart(moe_cache_state, self._model, self._ctx)
            self._warm.restore()
        self.placement = self._placement()
        if verbose:
            logger.info("%s", backend.system_info().strip())
            logger.info("placement: %s", ", ".join(f"{k}={v}" for k, v in self.placement.items()))
        self.chat_format = chat_format
        self.chat_handler = chat_handler
        self._chat_handlers: dict[str, Any] = {}
        if chat_format is None and chat_handler is None:
            self.chat_format = self._default_chat_format()

    def _default_chat_format(self) -> str:
        """llama-cpp-python's choice: the built-in format the GGUF's template is, else the template
        itself, and ``llama-2`` for a model without one."""
        if "tokenizer.chat_template" not in self.metadata:
            return "llama-2"
        try:
            from pyllama_moe.chat.dispatch import guess_chat_format_from_gguf_metadata
        except ImportError:  # pragma: no cover - a build without the chat package
            return "chat_template.default"
        return guess_chat_format_from_gguf_metadata(self.metadata) or "chat_template.default"

    def _model_params(self, a: dict[str, Any]) -> ModelParams:
        # llama-cpp-python turns mmap off under a LoRA adapter (it changes the weights in memory)
        no_mmap = a["lora_path"] is not None and a["load_mode"] is None
        mode = load_mode(a["load_mode"], check_bool("use_mmap", a["use_mmap"]) and not no_mmap, a["use_mlock"])
        return ModelParams(
            n_gpu_layers=a["n_gpu_layers"], split_mode=a["split_mode"], main_gpu=a["main_gpu"],
            tensor_split=a["tensor_split"], vocab_only=a["vocab_only"], kv_overrides=a["kv_overrides"],
            load_mode=mode, overrides=moe.placement_overrides(a["cpu_moe"], a["n_cpu_moe"], a["override_tensor"]),
        )

    def _load(self, seed: int) -> None:
        try:
            self._model = self._own(Model(self.model_path, self.model_params, verbose=self.verbose))
            self.context_params.use_model_n_ctx(self._model.n_ctx_train())
            cp = self.context_params.ptr
            self.n_batch = int(cp.n_batch)
            self.n_threads, self.n_threads_batch = int(cp.n_threads), int(cp.n_threads_batch)
            # the adapter is freed after the context that uses it (handles close in reverse)
            lora = self._own(LoraAdapter(self._model, self.lora_path)) if self.lora_path else None
            self._ctx = self._own(Context(self._model, self.context_params, verbose=self.verbose))
            self._batch = self._own(Batch(self.n_batch))
            if lora is not None:
                lora.apply(self._ctx, self.lora_scale)
        except BaseException:
            self._closed = False
            self.close()
            raise
        self._vocab = self._model.vocab
        cp = self.context_params.ptr
        self._session = Session(self._ctx, self._batch, self._vocab, self._logits_all, seed,
                                model_id=self._model.fingerprint(), n_ctx=int(cp.n_ctx) // int(cp.n_seq_max))
        self._slots: Slots | None = None  # made by the first submit_completion
        self._n_vocab, self._n_ctx = self._vocab.n_tokens, self._session.n_ctx
        self._token_nl, self._token_eos = self._vocab.nl(), self._vocab.eos()
        # llama-cpp-python's attributes: a recurrent (or hybrid) model's memory cannot drop a suffix of its tokens
        self._is_recurrent, self._is_hybrid = self._model.is_recurrent(), self._model.is_hybrid()
        self._sampler: Sampler | None = None
        self.metadata = self._model.metadata()
        self._closed = False

    def _placement(self) -> dict[str, Any]:
        """Where the weights went, as chosen by the arguments and ``fit`` / ``moe_cache_mib="auto"``."""
        mp, cp = self.model_params.ptr, self.context_params.ptr
        n_layer = self._model.n_layer()
        return {
            "n_gpu_layers": n_layer + 1 if mp.n_gpu_layers < 0 else min(int(mp.n_gpu_layers), n_layer + 1),
            "n_layer": n_layer,
            "host_tensor_patterns": self.model_params.override_patterns(),
            "moe_cache_mib": self._placed.cache_bytes // moe.MIB,
            "load_mode": load_mode_name(self._placed.load_mode),
            "n_ctx": int(cp.n_ctx),
            # as loaded (n_ctx=0 cuts them to the model's context); chosen: not given, and larger than
            # llama-cpp-python's 512 for experts in host memory; the reason says why, and what gave way
            "n_batch": int(cp.n_batch),
            "n_ubatch": int(cp.n_ubatch),
            "n_ubatch_chosen": self._placed.batch.chosen,
            "n_ubatch_reason": self._placed.batch.reason,
        }

    def _own(self, handle: Any) -> Any:
        self._handles.append(handle)
        return handle

    # lifetime
    def close(self) -> None:
        """Free the sampler, batch, context and model (idempotent). From another thread it waits for the call
        (or the step of a stream) in progress; a stream then raises ClosedError at its next step."""
        # set before waiting: a stream re-takes the lock right after each step (a Lock is not fair), so it has to
        # see the flag at its next step and stop, or close() would wait for the whole stream
        self._closed = True
        slots = getattr(self, "_slots", None)
        if slots is not None:  # its worker takes the lock for each step: stopped before the lock is taken here
            slots.close()
        lock = getattr(self, "_lock", None)
        with lock if lock is not None else contextlib.nullcontext():
            warm = getattr(self, "_warm", None)
            if warm is not None:
                warm.save()
            sampler = getattr(self, "_sampler", None)
            if sampler is not None:
                sampler.close()
            for handle in reversed(getattr(self, "_handles", [])):
                handle.close()
            turn = getattr(self, "_turn", None)
            if turn is not None:
                turn.notify_all()  # the calls waiting for a stream find the Llama closed

    @contextlib.contextmanager
    def _hold(self) -> Iterator[None]:
        """One step of the parallel slots: the lock, this thread's turn, the Llama open, its verbosity."""
        with self._lock:
            self._wait_turn()
            if self._closed:
                raise ClosedError(f"this Llama ({self.model_path}) has been closed")
            with backend.verbosity(self.verbose):
                yield

    def _wait_turn(self) -> None:
        """Wait (holding the lock) while another thread's stream is in progress: between two steps of a stream the
        context holds that stream's tokens, and a call of another thread would move it under the stream (eight
        threads streaming the same greedy request got eight texts). So each call sees what a lone call sees."""
        me = threading.get_ident()
        while self._streamer is not None and self._streamer != me and not self._closed:
            self._turn.wait()

    def _stream(self, steps: Generator[Any, Any, Any]) -> Generator[Any, Any, Any]:
        """A stream consumed outside the call that made it. From its first step to its end (exhausted, closed, or
        dropped) it holds the Llama: calls of other threads wait for it (``_wait_turn``). Each step holds the lock,
        finds the Llama open and runs under its verbosity (values sent go through); it returns what ``steps``
        returns (a completion's usage). A call of the consuming thread that moves the context between two steps
        (another completion, ``eval``, ``reset``, ``load_state``) makes the stream's next step raise LlamaError
        rather than go on from the other call's tokens."""
        value = None
        held = False
        moves = -1  # the session's count of moves after this stream's last step
        try:
            while True:
                with self._lock:
                    if not held:
                        self._wait_turn()
                    if self._closed:
                        raise ClosedError(f"this Llama ({self.model_path}) was closed during a stream")
                    if held and self._session.moves != moves:
                        raise LlamaError("this stream was interrupted: another call moved the Llama's context "
                                         "between two of its steps (finish or close a stream before the next call)")
                    self._streamer, held = threading.get_ident(), True
                    with backend.verbosity(self.verbose):
                        try:
                            item = steps.send(value) if value is not None else next(steps)
                        except StopIteration as end:
                            return end.value
                    moves = self._session.moves
                value = yield item
        finally:
            if held:
                with self._lock:
                    try:
                        if not self._closed:
                            with backend.verbosity(self.verbose):
                                steps.close()  # its sampler freed, unsampled draft tokens removed, now
                    finally:
                        if self._streamer == threading.get_ident() or self._closed:
                            self._streamer = None
                        self._turn.notify_all()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001  # pragma: no cover - interpreter shutdown
            pass

    def __enter__(self) -> Llama:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def _seed(self) -> int:
        """The sampling seed (llama-cpp-python's attribute): the next request without one draws from it."""
        return self._session.seed

    def __getstate__(self) -> dict[str, Any]:
        """The constructor's arguments (as llama-cpp-python): unpickling loads the model again."""
        state = dict(self._init_kwargs)
        state["seed"] = self._seed
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)  # type: ignore[misc]

    # accessors
    @property
    def ctx(self) -> Any:
        return self._ctx.ptr

    @property
    def model(self) -> Any:
        return self._model.ptr

    @property
    def n_tokens(self) -> int:
        return self._session.n_tokens

    @n_tokens.setter
    def n_tokens(self, value: int) -> None:
        self._session.n_tokens = value

    @property
    def input_ids(self) -> np.ndarray:
        return self._session.input_ids

    @input_ids.setter
    def input_ids(self, value: np.ndarray) -> None:
        self._session.input_ids[:len(value)] = value

    @property
    def scores(self) -> np.ndarray:
        return self._session.scores

    @property
    def _input_ids(self) -> np.ndarray:
        return self.input_ids[:self.n_tokens]

    @property
    def _scores(self) -> np.ndarray:
        return self.scores[:self.n_tokens, :]

    @property
    def eval_tokens(self) -> Any:
        from collections import deque

        return deque(self._input_ids.tolist(), maxlen=self._n_ctx)

    @property
    def eval_logits(self) -> Any:
        from collections import deque

        rows = self._scores if self._logits_all else self._scores[-1:]
        return deque(rows.tolist(), maxlen=self._n_ctx if self._logits_all else 1)

    @_open
    def n_ctx(self) -> int:
        """The context: the ``n_ctx`` asked for (the model's training context for 0), which prompt and completion share;
        llama.cpp's own is rounded up to a multiple of 256 (``llama_n_ctx(llm.ctx)``)."""
        return self._n_ctx

    @property
    def moe_cache_restored(self) -> int:
        """Experts the warm start (``moe_cache_state``) filled in at load, 0 without one."""
        return self._warm.restored if self._warm is not None else 0

    @property
    def moe_cache_restore_s(self) -> float:
        """The seconds the warm start added to the load."""
        return self._warm.restore_s if self._warm is not None else 0.0

    @_open
    def moe_cache_stats(self) -> moe.MoeCacheStats | None:
        """The MoE cache's counts since the context was created (a frozen :class:`moe.MoeCacheStats`: ``b - a`` is what
        happened between two readings, ``.hits("device")`` the hits and misses of lookup paths, ``.as_dict()`` the
        groups below for JSON, and ``stats["device"]["hits"]`` reads a group of it), None if it has no cache.

        The groups: experts found (``hits``) and uploaded (``misses``, ``bytes_uploaded``) per
        MoE layer and ubatch, by lookup path: ``small`` and ``large`` (host lookups, ubatches of up to 8 tokens
        and larger ones), ``device`` (looked up on the GPU, decode); ``copied``: experts that large
        ubatches read from the cache instead of host memory; ``prefetch``: the
        prefetch of large ubatches through the cache (off with ``LLAMA_MOE_CACHE_PREFETCH=0``): batched copy calls,
        regions, bytes copied from the cache and uploaded, in all and per large ubatch; ``seed``: the seeds of the
        cache from the experts staged for the last large ubatch of a batch (off with ``LLAMA_MOE_CACHE_SEED=0``):
        ubatches, experts admitted, bytes copied, layers rolled back; ``predicted`` (with
        ``LLAMA_MOE_CACHE_PREDICT=N``): the experts the device lookups prefetched for the next layer's predicted
        routing (``experts``, ``bytes``), those a lookup then found (``used``, also counted in ``device`` hits) and
        those evicted unused (``wasted``); ``hybrid`` (``moe_hybrid``): the device lookups'
        misses the CPU computed instead of uploading (``experts``, counted in ``device`` misses too), the hand-offs
        that gave it work (``calls``) and its busy time in them (``busy_us``), the split the context chose when it
        was made (``host_max``: the most misses per layer and ubatch the CPU takes, 0 with the hybrid off or where
        ``"auto"`` chose off; the rates it follows from, measured then: ``host_expert_us``, ``upload_expert_us``,
        ``handoff_us``), and derived: ``share`` (of the device lookups' misses), ``experts_per_call``,
        ``busy_us_per_call``. ``(b - a).per_token(n)`` gives, over ``n`` tokens decoded between two readings, the
        experts computed on the CPU, its busy ms, the experts uploaded and an estimate of PCIe's busy ms, per token.
        """
        return self._ctx.moe_cache_stats()

    @_open
    def n_embd(self) -> int:
        return self._model.n_embd()

    @_open
    def n_vocab(self) -> int:
        return self._vocab.n_tokens

    @_open
    def token_eos(self) -> int:
        return self._vocab.eos()

    @_open
    def token_bos(self) -> int:
        return self._vocab.bos()

    @_open
    def token_nl(self) -> int:
        return self._vocab.nl()

    @_open
    def pooling_type(self) -> int:
        return self._ctx.pooling_type()

    # tokens
    @_open
    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        """The text's token ids: the model's vocabulary's, or those of the ``tokenizer`` the Llama was made with."""
        if self._tokenizer is not None:
            return self._vocab.check_tokens(self._tokenizer.tokenize(text, add_bos, special))
        return self._vocab.tokenize(text, add_bos, special)

    @_open
    def detokenize(self, tokens: Sequence[int], prev_tokens: Sequence[int] | None = None,
                   special: bool = False) -> bytes:
        if self._tokenizer is not None:
            return self._tokenizer.detokenize(tokens, prev_tokens=prev_tokens, special=special)
        return self._vocab.detokenize(list(tokens), special)

    @property
    def tokenizer_(self) -> BaseLlamaTokenizer:
        """llama-cpp-python's attribute: the tokenizer given to the constructor, else the model's."""
        return self._tokenizer if self._tokenizer is not None else LlamaTokenizer(self)

    def set_cache(self, cache: Any) -> None:
        """A ``LlamaRAMCache``: completions start from the cached state sharing most of the prompt."""
        self.cache = cache

    def set_seed(self, seed: int) -> None:
        self._session.seed = check_int("seed", seed, -(2**63), 2**64 - 1)

    # images: a multimodal projector over this model
    @_open
    def load_projector(self, clip_model_path: str | os.PathLike[str], *, use_gpu: bool = True) -> MtmdContext:
        """The projector (an mmproj GGUF) of ``clip_model_path`` over this model, loaded at the first call and owned
        by this Llama (freed before its model by ``close()``): what the vision chat handlers encode images with.
        Its threads are the Llama's; its flash attention is on only where the context's is (as llama-cpp-python's
        handlers set it)."""
        key = (os.path.abspath(os.fspath(clip_model_path)), bool(use_gpu))
        projector = self._projectors.get(key)
        if projector is None:
            flash = int(self.context_params.ptr.flash_attn_type) == int(lib.LLAMA_FLASH_ATTN_TYPE_ENABLED)
            projector = self._own(MtmdContext(clip_model_path, self._model, use_gpu=bool(use_gpu),
                                              n_threads=self.n_threads, flash_attn=flash, verbose=self.verbose))
            self._projectors[key] = projector
        return projector

    @_open
    def eval_chunks(self, projector: MtmdContext, chunks: InputChunks) -> list[int]:
        """Evaluate a prompt of text and images (``projector.tokenize``'s chunks) from the start of the context: a
        text chunk as a prompt's tokens (in batches of ``n_batch``), an image encoded by ``projector`` and its
        embeddings decoded. Returns the prompt to complete from: ``create_completion(prompt=...)`` right after this
        call keeps all of it but its last token (images included); any other call moves the context, and its prompt
        keeps nothing from the first image on (``input_ids`` holds a placeholder id at an image's positions)."""
        if projector.model is not self._model:
            raise ValueError("eval_chunks: the projector was loaded over another model (use this Llama's "
                             "load_projector)")
        session = self._session
        session.reset()
        self._ctx.memory_clear()
        for i in range(len(chunks)):
            chunk = chunks[i]
            if chunk.type == CHUNK_TEXT:
                if chunk.tokens:
                    session.eval(chunk.tokens)
                continue
            session.eval_media(chunk.n_tokens, functools.partial(self._eval_media_chunk, projector, chunks, i))
        if not session.n_tokens:
            raise ValueError("the prompt has no tokens")
        return session.media_prompt()

    def _eval_media_chunk(self, projector: MtmdContext, chunks: InputChunks, i: int, n_past: int) -> int:
        return projector.eval_chunk(self._ctx, chunks, i, n_past=n_past, n_batch=self.n_batch)

    @_open
    def reset(self) -> None:
        """Forget the evaluated tokens (the next prompt is evaluated from the start)."""
        self._session.reset()

    # low level: llama-cpp-python's eval / sample / generate
    @_open
    def eval(self, tokens: Sequence[int]) -> None:
        self._session.eval(tokens)

    def _sampling(self, args: dict[str, Any]) -> SamplingParams:
        """SamplingParams from the arguments of ``sample`` / ``generate`` (``temp`` is the temperature)."""
        kw = {k: v for k, v in args.items() if k in _SAMPLING_KEYS}
        return SamplingParams(temperature=args["temp"], seed=self._seed, penalty_last_n=self.last_n_tokens_size, **kw)

    @_open
    def sample(self, top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05, typical_p: float = 1.0,
               temp: float = 0.80, repeat_penalty: float = 1.0, frequency_penalty: float = 0.0,
               presence_penalty: float = 0.0, tfs_z: float = 1.0, mirostat_mode: int = 0, mirostat_eta: float = 0.1,
               mirostat_tau: float = 5.0, penalize_nl: bool = True, logits_processor: Any = None,
               grammar: Any = None, idx: int | None = None) -> int:
        """Sample a token from the last evaluated logits (or those of position ``idx``)."""
        if self.n_tokens <= 0:
            raise ValueError("sample: nothing has been evaluated")
        if idx is not None:
            # an output the last decode kept: every evaluated position with logits_all, else the last one
            check_int("idx", idx, 0 if self._logits_all else self.n_tokens - 1, self.n_tokens - 1)
        params = self._sampling(locals())
        sampler = self._sampler or Sampler(self._vocab, params)
        try:
            ridx = idx - self.n_tokens if idx is not None else -1
            if logits_processor is not None:
                return sampler.sample_logits(logits_processor(self._input_ids, self._ctx.logits_ith(ridx)))
            return int(sampler.sample(self._ctx, ridx))
        finally:
            if sampler is not self._sampler:
                sampler.close()

    @_open
    def generate(self, tokens: Sequence[int], top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05,
                 typical_p: float = 1.0, temp: float = 0.80, repeat_penalty: float = 1.0, reset: bool = True,
                 frequency_penalty: float = 0.0, presence_penalty: float = 0.0, tfs_z: float = 1.0,
                 mirostat_mode: int = 0, mirostat_tau: float = 5.0, mirostat_eta: float = 0.1,
                 penalize_nl: bool = True, logits_processor: Any = None, stopping_criteria: Any = None,
                 grammar: Any = None) -> Iterator[int]:
        """Yield sampled tokens after ``tokens`` forever (the caller stops). The tokens are checked now and evaluated
        at the first step (as llama-cpp-python's generator does), when the stream holds the Llama."""
        params = self._sampling(locals())
        ids = token_array("tokens", tokens, self._n_vocab).tolist()
        if not ids:
            raise ValueError("the prompt has no tokens")
        steps = self._generate(ids, reset, Sampler(self._vocab, params), logits_processor, stopping_criteria)
        return self._stream(steps)

    def _generate(self, tokens: list[int], reset: bool, sampler: Sampler, logits_processor: Any,
                  stopping_criteria: Any) -> Generator[int, Sequence[int] | None, None]:
        try:
            self._session.prepare(tokens, reset)
        except BaseException:
            sampler.close()
            raise
        steps = self._session.generate(sampler, logits_processor=logits_processor,
                                       stopping_criteria=stopping_criteria, draft_model=self.draft_model)
        try:
            sent = None
            while True:
                try:
                    token, _ = steps.send(sent) if sent is not None else next(steps)
                except StopIteration:
                    return
                sent = yield token
        finally:
            steps.close()
            sampler.close()

    # completions
    @_open
    def create_completion(
        self,
        prompt: str | list[int],
        suffix: str | None = None,
        max_tokens: int | None = 16,
        temperature: float = 0.8,
        top_p: float = 0.95,
        min_p: float = 0.05,
        typical_p: float = 1.0,
        logprobs: int | None = None,
        echo: bool = False,
        stop: str | list[str] | None = [],  # noqa: B006 - llama-cpp-python's signature
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        repeat_penalty: float = 1.0,
        top_k: int = 40,
        stream: bool = False,
        seed: int | None = None,
        tfs_z: float = 1.0,
        mirostat_mode: int = 0,
        mirostat_tau: float = 5.0,
        mirostat_eta: float = 0.1,
        model: str | None = None,
        stopping_criteria: Any = None,
        logits_processor: Any = None,
        grammar: Any = None,
        logit_bias: dict[int, float] | None = None,
    ) -> Any:
        """Generate text from a prompt: a ``text_completion`` dict, or an iterator of chunks with ``stream``."""
        job = self._completion(locals(), self.draft_model)
        return self._stream(job.chunks()) if stream else job.result()

    def _completion(self, a: dict[str, Any], draft_model: Any) -> Completion:
        """The request of ``create_completion``'s arguments ``a``, checked, as a ``Completion``."""
        sampling = {k: v for k, v in a.items() if k in _SAMPLING_KEYS}
        model = a["model"]
        req = make_request(self._session, a["prompt"], suffix=a["suffix"], max_tokens=a["max_tokens"], stop=a["stop"],
                           logprobs=a["logprobs"], echo=a["echo"], seed=a["seed"],
                           model=model if model is not None else self.model_path,
                           logits_processor=a["logits_processor"], stopping_criteria=a["stopping_criteria"],
                           sampling=sampling, penalty_last_n=self.last_n_tokens_size, spm_infill=self.spm_infill,
                           draft_model=draft_model, tokenizer=self._tokenizer)
        # the prompt cache goes through save_state / load_state, as llama-cpp-python's does (a subclass or a wrapper
        # of them sees each use)
        return Completion(self._session, req, self.cache, save_state=self.save_state, load_state=self.load_state)

    @_open
    def submit_completion(self, prompt: str | list[int], **kwargs: Any) -> Job:
        """Queue a completion on the parallel slots (``n_seq_max`` > 1 batches several in each step): a ``Job`` whose
        ``chunks()`` streams it and ``result()`` returns the whole, as ``create_completion`` would (its keywords; no
        ``logits_processor``, ``stopping_criteria``, draft model or prompt cache). ``job.cancel()`` frees its slot at
        the next step. Its generation runs on a worker thread that this Llama's ``close()`` stops."""
        args = inspect.signature(Llama.create_completion).bind(self, prompt, **kwargs)
        args.apply_defaults()
        a = dict(args.arguments)
        completion = self._completion(a, None)
        if self._slots is None:
            self._slots = Slots(self._ctx, self._session, int(self.context_params.ptr.n_seq_max), self.n_batch,
                                self._hold)
        return self._slots.submit(completion, stream=bool(a["stream"]))

    def create_completions(self, prompts: Sequence[str | list[int]], **kwargs: Any) -> list[dict[str, Any]]:
        """``create_completion`` of each prompt (the same keywords, no ``stream``), up to ``n_seq_max`` of them batched
        in each step; the results in the prompts' order."""
        if kwargs.get("stream"):
            raise ValueError("create_completions returns whole results: use submit_completion(..., stream=True)")
        jobs: list[Job] = []
        try:
            for p in prompts:
                jobs.append(self.submit_completion(p, **kwargs))
            return [j.result() for j in jobs]
        finally:
            for j in jobs:
                j.cancel()

    @property
    def slots(self) -> Slots | None:
        """The parallel slots, once a completion was submitted (their ``stats``, ``busy`` and ``queued``)."""
        return self._slots

    def __call__(self, prompt: str | list[int], *args: Any, **kwargs: Any) -> Any:
        return self.create_completion(prompt, *args, **kwargs)

    @_open
    def create_chat_completion(self, messages: list[dict[str, Any]], **kwargs: Any) -> Any:
        """A ``chat.completion`` (or its chunks with ``stream=True``) with the model's chat format."""
        from pyllama_moe import chat

        return chat.create_chat_completion(self, messages=messages, **kwargs)

    # embeddings
    @_open
    def embed(self, input: str | list[str], normalize: bool = False, truncate: bool = True,
              return_count: bool = False) -> Any:
        """Embeddings of a text or texts: a vector per text, or per token with pooling none."""
        texts = [input] if isinstance(input, str) else input
        if not isinstance(texts, (list, tuple)) or not all(isinstance(t, str) for t in texts):
            raise ValueError(f"input must be a string or a list of strings, got {input!r:.200}")
        if not self.context_params.ptr.embeddings:
            raise RuntimeError("Llama model must be created with embedding=True to call this method")
        data, total = self._session.embed(list(texts), normalize, truncate)
        out = data[0] if isinstance(input, str) else data
        return (out, total) if return_count else out

    def create_embedding(self, input: str | list[str], model: str | None = None) -> CreateEmbeddingResponse:
        embeds, total = self.embed(input, return_count=True)
        if isinstance(input, str):
            embeds = [embeds]
        return {
            "object": "list",
            "data": [{"object": "embedding", "embedding": e, "index": i} for i, e in enumerate(embeds)],
            "model": model if model is not None else self.model_path,
            "usage": {"prompt_tokens": total, "total_tokens": total},
        }

    # state
    @_open
    def save_state(self) -> LlamaState:
        return self._session.save_state()

    @_open
    def load_state(self, state: LlamaState) -> None:
        self._session.load_state(state)

    # llama-cpp-python's static helpers
    logits_to_logprobs = staticmethod(logits_to_logprobs)

    longest_token_prefix = staticmethod(longest_token_prefix)

    def tokenizer(self) -> LlamaTokenizer:
        return LlamaTokenizer(self)

    def create_chat_completion_openai_v1(self, *args: Any, **kwargs: Any) -> Any:
        """``create_chat_completion`` as the ``openai`` package's types (it must be installed)."""
        try:
            from openai.types.chat import ChatCompletion, ChatCompletionChunk
        except ImportError as e:
            raise ImportError("create_chat_completion_openai_v1 needs the openai package: pip install openai") from e
        if kwargs.get("stream", False):
            return (ChatCompletionChunk(**chunk) for chunk in self.create_chat_completion(*args, **kwargs))
        return ChatCompletion(**self.create_chat_completion(*args, **kwargs))

    @classmethod
    def from_pretrained(cls, repo_id: str, filename: str | None, additional_files: list[str] | None = None,
                        local_dir: str | os.PathLike[str] | None = None, local_dir_use_symlinks: Any = "auto",
                        cache_dir: str | os.PathLike[str] | None = None, **kwargs: Any) -> Llama:
        """Download ``filename`` (a glob) of a Hugging Face repository and load it (needs huggingface-hub)."""
        from pyllama_moe.hub import download

        return cls(model_path=download(repo_id, filename, additional_files, local_dir, cache_dir), **kwargs)

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"n_ctx={self._n_ctx}"
        return f"<pyllama_moe.Llama {self.model_path!r} {state}>"
