"""`HFEngine`: a transformers model + tokenizer behind the scheduler, weight receiver and memory state.

This is the `hf` engine without HTTP (server.py puts SGLang's endpoints on top of it), so it can
also be driven in-process. It owns one model on one device; the model's forwards run in the
scheduler's decode thread and weight loads take the same step lock.

With `lora` (the server's `--enable-lora`) the model carries LoRA adapters (`relax.backends.lora`),
zero until a weight push brings the trainer's adapter tensors (`<module>.lora_A.weight`, ...): each
push replaces them, the base weights never change, so pushes do not accumulate (docs/lora.md).

Memory release (`/release_memory_occupation`, SGLang's colocate offload): on CUDA the weights
move to CPU and the CUDA cache is emptied; on CPU nothing moves (this engine keeps no KV cache
between batches). While any tag is released, generation is refused (HTTP 503) until resume. Release
and resume make the weight receiver forget its walk of the model (it keeps one across pushes), as the
move replaces buffer tensors and leaves fused MoE experts' per-expert views on the old storage.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any, AsyncIterator

import torch

from relax.backends.hf.decoder import BatchDecoder
from relax.backends.hf.grammar import GrammarCompiler
from relax.backends.hf.protocol import GenerateItem
from relax.backends.hf.rows import DecodeRow, RowResult
from relax.backends.hf.sampling import warm_up_sampler
from relax.backends.hf.scheduler import Scheduler
from relax.backends.lora import add_adapters
from relax.config.lora import LoraSpec
from relax.distributed.weights.receiver import WeightReceiver
from relax.utils.multimodal.models import is_multimodal, load_model
from relax.utils.multimodal.processor import MultimodalProcessor
from relax.utils.multimodal.sources import MediaError

logger = logging.getLogger(__name__)

DTYPE_CHOICES = {"auto": "auto", "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
MEMORY_TAGS = ("weights", "kv_cache")
# SGLang's `--rl-on-policy-target`: the trainer whose log-prob numerics the engine reproduces.
# "fsdp": report log-probs recomputed by `relax.algorithms.logprobs` (see decoder.py).
RL_ON_POLICY_TARGETS = (None, "fsdp")
# SGLang's `--load-format`: "auto" reads the checkpoint's weights; "dummy" builds the model from
# its config.json with random weights (benchmarks, and engines whose weights arrive by a push).
LOAD_FORMATS = ("auto", "dummy")


def engine_model(model_path: str, dtype: str, load_format: str, device: torch.device) -> torch.nn.Module:
    """The engine's model on `device`, in eval mode: the checkpoint's weights, or (`dummy`) random
    ones made on the device, with no host copy of a large model."""
    from transformers import AutoConfig

    if load_format != "dummy":
        return load_model(model_path, dtype=DTYPE_CHOICES[dtype]).to(device).eval()
    config = AutoConfig.from_pretrained(model_path)
    torch_dtype = DTYPE_CHOICES[dtype] if dtype != "auto" else getattr(config, "dtype", None) or torch.float32
    if isinstance(torch_dtype, str):  # config.json's "dtype": "bfloat16"
        torch_dtype = getattr(torch, torch_dtype)
    with device:
        return load_model(model_path, config=config, dtype=torch_dtype, from_config=True).to(device).eval()


class EngineUnavailable(RuntimeError):
    """Generation refused right now (memory released); maps to HTTP 503."""


def eos_token_ids(model: torch.nn.Module, tokenizer: Any) -> list[int]:
    """EOS ids from the generation config, the model config and the tokenizer (Qwen3 has two)."""
    found: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(value, int):
            found.add(value)
        elif isinstance(value, (list, tuple)):
            found.update(int(v) for v in value)
    return sorted(found)


class HFEngine:
    """One model on one device, serving batched generation and SGLang's control operations."""

    def __init__(self, model_path: str, *, device: str = "cpu", dtype: str = "auto",
                 max_running_requests: int = 256, max_context_len: int | None = None,
                 served_model_name: str | None = None, tokenizer_path: str | None = None,
                 seed: int | None = None, weight_sync_timeout_s: float = 600.0, batch_wait_s: float = 0.02,
                 rl_on_policy_target: str | None = None, load_format: str = "auto",
                 max_total_tokens: int | None = None, cuda_graphs: bool = True, cuda_graph_max_bs: int | None = None,
                 lora: LoraSpec | None = None, routed_experts: bool = False):
        from transformers import AutoTokenizer

        if dtype not in DTYPE_CHOICES:
            raise ValueError(f"--dtype must be one of {sorted(DTYPE_CHOICES)}, got {dtype!r}")
        if rl_on_policy_target not in RL_ON_POLICY_TARGETS:
            raise ValueError(f"--rl-on-policy-target must be one of {sorted(t for t in RL_ON_POLICY_TARGETS if t)} "
                             f"or unset, got {rl_on_policy_target!r}")
        if load_format not in LOAD_FORMATS:
            raise ValueError(f"--load-format must be one of {list(LOAD_FORMATS)}, got {load_format!r}")
        self.rl_on_policy_target = rl_on_policy_target
        self.model_path, self.tokenizer_path = model_path, tokenizer_path or model_path
        self.served_model_name = served_model_name or model_path
        self.device = torch.device(device)
        self.tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_path)
        self.load_format = load_format
        self.model = engine_model(model_path, dtype, load_format, self.device)
        self.lora = lora
        if lora is not None:  # --enable-lora: adapters at zero (the base model) until a push brings them
            add_adapters(self.model, lora)
        # VL / Omni checkpoints: image_data (and audio_data) on /generate (relax.utils.multimodal.processor)
        self.processor = MultimodalProcessor(model_path, self.tokenizer) if is_multimodal(self.model.config) else None
        text_config = self.model.config.get_text_config()  # a VL model's language model
        self.vocab_size = int(text_config.vocab_size)
        self.max_context_len = max_context_len or int(getattr(text_config, "max_position_embeddings", 4096))
        self.step_lock = threading.Lock()
        pad = self.tokenizer.pad_token_id
        # regex / json_schema / ebnf / structural_tag (grammar.py): llguidance over this tokenizer
        self.grammars = GrammarCompiler(self.tokenizer, self.vocab_size, eos_token_ids(self.model, self.tokenizer))
        self.decoder = BatchDecoder(self.model, self.tokenizer, device=self.device,
                                    eos_token_ids=eos_token_ids(self.model, self.tokenizer),
                                    max_context_len=self.max_context_len, pad_token_id=pad if pad is not None else 0,
                                    step_lock=self.step_lock, seed=seed,
                                    true_on_policy=rl_on_policy_target is not None,
                                    max_running_requests=max_running_requests, max_total_tokens=max_total_tokens,
                                    cuda_graphs=cuda_graphs, cuda_graph_max_bs=cuda_graph_max_bs,
                                    banned_token_ids=self.processor.media_token_ids if self.processor else (),
                                    routed_experts=routed_experts)
        if self.device.type == "cuda":  # compile the GPU sampler now, not in the first rollout
            warm_up_sampler(self.vocab_size, self.device)
        if self.decoder.static_path_note is not None:
            logger.info("decoding through transformers' DynamicCache: %s", self.decoder.static_path_note)
        self.scheduler = Scheduler(self.decoder, max_running_requests=max_running_requests,
                                   batch_wait_s=batch_wait_s, version=lambda: self.weight_version)
        self.receiver = WeightReceiver(self.model, step_lock=self.step_lock, timeout_s=weight_sync_timeout_s,
                                       device=self.device, cache_walk=True)  # (forgotten in release/resume_memory)
        self.weight_version = "default"
        self.weight_session_open = False  # SGLang's /begin_weight_update .. /end_weight_update
        self.released_tags: set[str] = set()
        self.weight_update_lock = asyncio.Lock()
        # Pipelined pushes (`bucket_index`): the bucket whose turn it is, reset by each session.
        self.next_bucket = 0
        self.bucket_turn = asyncio.Condition()

    @property
    def weight_version(self) -> str:
        """SGLang's `weight_version` of the weights held: the receiver's, set by the last bucket of a
        push (`WeightReceiver.finish`) or by /update_weight_version."""
        return self.receiver.version

    @weight_version.setter
    def weight_version(self, version: str) -> None:
        self.receiver.version = version

    async def start(self) -> None:
        self.scheduler.start()

    async def stop(self) -> None:
        await self.scheduler.stop()

    # ---- generation ------------------------------------------------------------------
    async def generate(self, items: list[GenerateItem]) -> list[RowResult]:
        """Run every item through the scheduler (they batch with whatever else is queued)."""
        rows, media = await self.prepare(items)
        results = list(await asyncio.gather(*(self.scheduler.generate(item.rid, row)
                                              for item, row in zip(items, rows))))
        await self.score_inputs(items, results, media)
        return results

    async def stream(self, items: list[GenerateItem], rows: list[DecodeRow], media: list
                     ) -> AsyncIterator[tuple[int, int, float | RowResult]]:
        """Run prepared items (`prepare`, which raises a bad request's error before anything starts)
        as `generate` does, yielding `(i, token, logprob)` as item i draws each token and
        `(i, -1, result)` when it finishes (after its tokens). Closing the iterator early (the client
        went away) aborts the items still running."""
        loop, events = asyncio.get_running_loop(), asyncio.Queue()
        for i, row in enumerate(rows):
            row.on_token = lambda token, logprob, i=i: loop.call_soon_threadsafe(events.put_nowait, (i, token, logprob))

        async def one(i: int) -> None:
            try:
                result = await self.scheduler.generate(items[i].rid, rows[i])
                await self.score_inputs([items[i]], [result], [media[i]])
            except Exception as exc:  # noqa: BLE001 - a failed decode fails the stream, in order
                events.put_nowait((i, -2, exc))
                return
            events.put_nowait((i, -1, result))

        tasks = [asyncio.ensure_future(one(i)) for i in range(len(items))]
        try:
            finished = 0
            while finished < len(items):
                i, token, value = await events.get()
                if token == -2:
                    raise value
                finished += token == -1
                yield i, token, value
        finally:
            for task in tasks:
                task.cancel()

    async def prepare(self, items: list[GenerateItem]) -> tuple[list[DecodeRow], list[dict | None]]:
        """Check the items against the engine's state and mode, compile their grammars; their rows
        and media tensors. ValueError (a 400) names the bad input; EngineUnavailable is a 503."""
        if self.rl_on_policy_target and any(item.params.has_penalties for item in items):
            raise ValueError("sampling penalties and logit_bias change the sampled distribution, which the "
                             "trainer cannot reproduce (--rl-on-policy-target): send them neutral")
        constrained = [item.params.constraint for item in items if item.params.constraint is not None]
        if self.rl_on_policy_target and constrained:
            raise ValueError(f"{constrained[0].field} constrains the sampled distribution, which the trainer "
                             "cannot reproduce (--rl-on-policy-target / --true-on-policy-mode): send no constraint, "
                             "or run without true on-policy mode (docs/true-on-policy.md)")
        if self.decoder.routing is None and any(item.routed_experts_start is not None for item in items):
            raise ValueError("return_routed_experts: this engine was started without --enable-return-routed-experts "
                             "(SGLang's server flag; --use-rollout-routing-replay sets it)")
        if self.released_tags:
            raise EngineUnavailable(f"engine memory is released (tags {sorted(self.released_tags)}); "
                                    "call /resume_memory_occupation before generating")
        grammars = await asyncio.to_thread(self.row_grammars, items) if constrained else [None] * len(items)
        media = await asyncio.to_thread(self.batch_media, items)
        rows = [DecodeRow(item.input_ids, item.params, media=m, grammar=g)
                for item, m, g in zip(items, media, grammars)]
        return rows, media

    def row_grammars(self, items: list[GenerateItem]) -> list[Any]:
        """Each item's grammar matcher (None: unconstrained); ValueError names a bad grammar."""
        return [None if item.params.constraint is None else self.grammars.row_grammar(item.params.constraint)
                for item in items]

    async def score_inputs(self, items: list[GenerateItem], results: list[RowResult], media: list) -> None:
        """Input-token log-probs of the items that asked (`logprob_start_len`) and were not aborted."""
        scored = [i for i, item in enumerate(items)
                  if item.logprob_start_len is not None and results[i].finish_reason.get("type") != "abort"]
        if scored:  # input-token logprobs: one cache-free forward per chunk, off the event loop
            logprobs = await asyncio.to_thread(
                self.decoder.prompt_logprobs, [items[i].input_ids for i in scored], media=[media[i] for i in scored],
                temperatures=[1.0 if items[i].params.is_greedy else items[i].params.temperature for i in scored])
            for i, lp in zip(scored, logprobs):
                results[i].input_logprobs = lp

    def batch_media(self, items: list[GenerateItem]) -> list[dict[str, torch.Tensor] | None]:
        """Each item's encoder tensors (None: text); items with the same media share one object, so
        the decoder prefills a group's samples once."""
        import json

        done: dict[str, dict[str, torch.Tensor]] = {}
        out: list[dict[str, torch.Tensor] | None] = []
        for item in items:
            if not item.media:
                out.append(None)
                continue
            key = json.dumps(item.media, sort_keys=True) + str(item.input_ids)
            if key not in done:
                done[key] = self.media_tensors(item)
            out.append(done[key])
        return out

    def media_tensors(self, item: GenerateItem) -> dict[str, torch.Tensor]:
        """The encoder tensors of an item's media (MediaError, a 400, when the model takes none or
        the ids do not hold the images' / audios' pad tokens)."""
        if self.processor is None:
            raise MediaError(f"{'/'.join(sorted(item.media))}_data was sent, but model type "
                             f"{getattr(self.model.config, 'model_type', None)!r} takes text only; serve a "
                             "vision-language checkpoint (docs/multimodal.md)")
        takes = self.processor.family.modalities
        unsupported = sorted(set(item.media) - set(takes))
        if unsupported:
            raise MediaError(f"{unsupported[0]}_data is not supported by model type "
                             f"{self.model.config.model_type!r} (it takes {', '.join(m + '_data' for m in takes)})")
        return self.processor.request_tensors(item.input_ids, item.media.get("image"), item.media.get("audio"),
                                              item.media.get("video"))

    async def health_generate(self, timeout_s: float = 20.0) -> bool:
        """A 1-token greedy generation; True when the model answers in time (or is deliberately paused)."""
        if self.released_tags:
            return False
        if self.scheduler.paused_mode is not None:
            return True
        from relax.backends.hf.sampling import parse_sampling_params

        item = GenerateItem(f"health-{time.monotonic_ns()}", [0],
                            parse_sampling_params({"temperature": 0, "max_new_tokens": 1}), False)
        try:
            await asyncio.wait_for(self.generate([item]), timeout_s)
        except (asyncio.TimeoutError, RuntimeError) as exc:
            logger.warning("health_generate failed: %s", exc)
            self.scheduler.abort(item.rid)
            return False
        return True

    # ---- memory ----------------------------------------------------------------------
    async def release_memory(self, tags: list[str] | None) -> str:
        tags = list(tags or MEMORY_TAGS)
        self.scheduler.abort(abort_all=True, message="aborted by release_memory_occupation")
        await self.scheduler.wait_idle()
        with self.step_lock:
            self.decoder.release_cache()  # the KV cache and the graphs (they hold parameter addresses)
            if "weights" in tags and self.device.type == "cuda" and "weights" not in self.released_tags:
                self.model.to("cpu")
            self.receiver.forget_walk()  # model.to() makes new buffers; fused experts' views keep the old storage
        if self.device.type == "cuda":
            if hasattr(torch._C, "_cuda_clearCublasWorkspaces"):  # the decode streams' cuBLAS workspaces
                torch._C._cuda_clearCublasWorkspaces()
            torch.cuda.empty_cache()
        self.released_tags.update(tags)
        return f"released {sorted(tags)}"

    async def resume_memory(self, tags: list[str] | None) -> str:
        tags = list(tags or MEMORY_TAGS)
        if "weights" in tags and self.device.type == "cuda" and "weights" in self.released_tags:
            with self.step_lock:
                self.model.to(self.device)
                self.decoder.release_cache()
        with self.step_lock:
            self.receiver.forget_walk()  # (as in release_memory)
        self.released_tags.difference_update(tags)
        return f"resumed {sorted(tags)}"

    def cuda_memory_allocated(self) -> int | None:
        return torch.cuda.memory_allocated(self.device) if self.device.type == "cuda" else None

    def memory_info(self) -> dict[str, int | None]:
        """GPU memory: this engine's tensors, what its allocator holds, and what the whole GPU has in
        use (every process on it). None on CPU."""
        if self.device.type != "cuda":
            return {"cuda_memory_allocated": None, "cuda_memory_reserved": None, "gpu_used_bytes": None}
        free, total = torch.cuda.mem_get_info(self.device)
        return {"cuda_memory_allocated": torch.cuda.memory_allocated(self.device),
                "cuda_memory_reserved": torch.cuda.memory_reserved(self.device), "gpu_used_bytes": total - free}

    def info(self) -> dict[str, Any]:
        return {
            "model_path": self.model_path, "tokenizer_path": self.tokenizer_path, "is_generation": True,
            "preferred_sampling_params": None, "weight_version": self.weight_version,
            "served_model_name": self.served_model_name, "max_context_len": self.max_context_len,
            "device": str(self.device), "dtype": str(self.model.dtype).replace("torch.", ""),
            "backend": "hf", "rl_on_policy_target": self.rl_on_policy_target,
            "enable_return_routed_experts": self.decoder.routing is not None,
            # SGLang's /get_model_info fields that clients read
            "model_type": getattr(self.model.config, "model_type", None),
            "architectures": list(getattr(self.model.config, "architectures", None) or []),
            "has_image_understanding": self.processor is not None,
            "has_audio_understanding": self.processor is not None and "audio" in self.processor.family.modalities,
        }
