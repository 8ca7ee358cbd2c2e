"""One rank of a training role (a Ray actor): the backend-agnostic half of training.

The `Trainer` joins the role's process group, builds the backend's `ModelRunner`
(`relax.backends.registry.TRAIN_BACKENDS`: fsdp, megatron) and does everything that does not
depend on how the model is built or run:
    scoring     `compute_log_probs` / `compute_values`: forward-only passes in micro-batches
    training    `train` (a whole shard) or `train_begin` / `train_rows` / `train_end` (the
                fully-async streaming loader: micro-batches run as their rows arrive, in the plan
                made from the lengths, so a streamed pass computes exactly what a whole one does);
                the loss (`losses.py`), gradient reduction and clipping (the runner's), the
                optimizer step (`optim.py`)
    weights     out: rank 0 pushes the runner's HF-named weights to every receiver lane
                (`weights_out.py`); in: the receiving side of SGLang's weight-update protocol,
                reached through a Ray handle (ActorFwd and the Reference take the actor's weights);
                --keep-old-actor: host copies of the versions pushed or received, scored on by
                `compute_log_probs(weights_version=)` (`kept_weights.py`)
    state       offload/onload (colocate on shared GPUs; --train-memory-margin-bytes caps the CUDA
                allocator there, `memory_margin.py`), checkpoints (meta, RNG, LR schedule
                here; the model and optimizer state in the runner's format; --async-save: a host
                snapshot written by a background thread), HF export
    routing     MoE routing replay (`routing.py`): what each forward of a row replays, the
                engine's record (R3) or the policy's first forward's (R2); the runner applies it
    profiling   torch profiler windows of the role's steps, memory history, memory checks around
                collectives (`profiling.py`; the role marks its steps: `profile_step_begin/end`)

Data parallelism is the runner's business: rows arrive per data-parallel shard (a model-parallel
group of ranks receives the same rows, `parallel_info`), each rank normalises its loss by the
step's loss tokens over the data-parallel size, and the runner reduces gradients before the
optimizer step. The loss math is `relax.algorithms`, never re-implemented here or in a runner.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import time
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.distributed as dist

from relax.backends.base import RankLayout, Rows, TrainerSpec
from relax.backends.lora import adapters_off
from relax.backends.registry import TRAIN_BACKENDS
from relax.backends.trainer import passes
from relax.backends.trainer.losses import MicroLoss
from relax.backends.trainer.kept_weights import KeptWeights, kept_weights_of
from relax.backends.trainer.memory_margin import reserve_margin
from relax.backends.trainer.offload import HostStash
from relax.backends.trainer.optim import (
    build_optimizer, optimizer_memory, optimizer_state_tensors, refresh_host_copies, reset_optimizer_state,
)
from relax.backends.trainer.profiling import RankProfiler
from relax.backends.trainer.routing import RouteBook
from relax.backends.trainer.runner_kit import rng_state, set_rng_state
from relax.backends.trainer.weights_out import WeightPush
from relax.distributed.store import pin_gloo_interface, tcp_store
from relax.distributed.weights.protocol import parse_dtype
from relax.types import TrainBatch
from relax.utils.peft_files import adapter_config
from relax.utils import memory_check, startup_gc
from relax.utils.plugins import import_object

logger = logging.getLogger(__name__)

GIB = float(1 << 30)


def adapter_files(spec: TrainerSpec) -> tuple[str, dict[str, Any]] | None:
    """Where and how a LoRA adapter is pushed as peft files (engines that load adapters from disk), or None."""
    lora = spec.lora
    if lora is None or spec.adapter_dir is None:
        return None
    return spec.adapter_dir, adapter_config(lora.rank, lora.alpha, lora.targets, lora.dropout, spec.model_path)


def gpu_used_bytes(device: torch.device) -> int:
    """Memory in use on the whole GPU (every process on it, CUDA contexts included)."""
    free, total = torch.cuda.mem_get_info(device)
    return total - free


def collectives(spec: TrainerSpec, device: torch.device) -> tuple[str, timedelta, str]:
    """(the ranks' torch.distributed backend, its timeout, the weight-push backend) on `device`:
    --distributed-backend and --checkpoint-engine-backend on GPUs, gloo on CPU (NCCL cannot carry
    CPU tensors); --distributed-timeout-minutes bounds the rendezvous and every collective."""
    cuda = device.type == "cuda"
    return (spec.dist_backend if cuda else "gloo", timedelta(minutes=spec.timeout_minutes),
            spec.weight_sync_backend if cuda else "gloo")


class Trainer:
    """One rank: `Trainer(rank, world_size, master_addr, master_port, spec)`."""

    def __init__(self, rank: int, world_size: int, master_addr: str, master_port: int, spec: TrainerSpec) -> None:
        self.rank, self.world_size, self.spec = rank, world_size, spec
        # The rank's GPU: the one it sees (Ray gives each rank one), or the one set current for it
        # where a rank sees several (bench/megatron_throughput.py --async-tp).
        self.device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
            else torch.device("cpu")
        if self.device.type == "cpu":
            torch.set_num_threads(spec.threads or max(1, (os.cpu_count() or 1) // world_size))
        # first: --record-memory-history records the model's build too (profiling.py)
        self.profiler = RankProfiler(spec.profile, spec.trace_dir, spec.name, rank, self.device)
        backend, timeout, weights_backend = collectives(spec, self.device)
        pin_gloo_interface(master_addr)  # gloo and the store listen on the group's address only
        store = tcp_store(master_addr, master_port, world_size, is_master=rank == 0, timeout=timeout)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
        runner_cls = import_object(TRAIN_BACKENDS[spec.backend], flag="--train-backend")
        self.runner = runner_cls(spec, rank, world_size, self.device)
        self.optimizer = self.scheduler = self.loss = None
        if spec.trainable:
            self.optimizer, self.scheduler = build_optimizer(
                self.runner.optimized_parameters(), spec.optim, spec.total_steps, self.device,
                self.runner.optimizer_group())
            self.runner.attach_optimizer(self.optimizer)
            self.loss = MicroLoss(spec, self.device)
        self.weights = WeightPush(device=self.device, backend=weights_backend, bucket_bytes=spec.bucket_bytes,
                                  timeout_s=spec.sync_timeout_s, adapter_files=adapter_files(spec),
                                  check=spec.check_weights)  # --check-weight-update-equal
        self._receiver: Any = None
        self.stash = HostStash(spec.keep_host_buffers)  # colocate offload: pinned host copies of the state
        # --keep-old-actor: host copies of the weights at the versions the engines were given
        self.kept = KeptWeights(spec.keep_weights, self.device, self.runner.offload_tensors) \
            if spec.keep_weights else None
        self._restash_after_push = False  # a push arrived while offloaded: offload again at its end
        self.step = 0
        self.compute_seconds = 0.0
        self._pass: passes.TrainPass | None = None
        self.routes = RouteBook(spec)  # routing replay (MoE): what each forward of a row replays
        self._writer: ThreadPoolExecutor | None = None  # --async-save: the background checkpoint write
        self._writing: futures.Future | None = None
        startup_gc.started()  # the rank's imports and model are built (relax/utils/startup_gc.py)

    @property
    def layout(self) -> RankLayout:
        return self.runner.layout

    def parallel_info(self) -> dict[str, Any]:
        """Where this rank's rows come from and whether its results are returned: every rank of
        one data-parallel shard receives the same rows; `output` ranks (one per shard) answer."""
        return {"dp_rank": self.layout.dp_rank, "dp_size": self.layout.dp_size, "output": self.layout.answers}

    # ---- scoring -----------------------------------------------------------------------
    @torch.no_grad()
    def compute_log_probs(self, tokens: list[list[int]], lengths: list[int], media: list[bytes] | None = None,
                          entropy: bool = False, base: bool = False, routing: list[bytes] | None = None,
                          weights_version: int | None = None) -> Any:
        """Per-row response log-probs under the current weights (old policy, reference, teacher), or
        (`weights_version`, --keep-old-actor) the copy of that version the rank keeps;
        `media`: a multimodal run's encoder tensors per row (TransferQueue's bytes). `entropy`
        (--use-rollout-entropy): (log-probs, per-token entropies) from the same forward. `base`
        (--lora-rank): the base model's, every adapter switched off (the LoRA Reference). `routing`
        (R3): each row's engine routing record, replayed (`routing.RouteBook`)."""
        if self.spec.head != "lm":
            raise RuntimeError(f"{self.spec.name}: compute_log_probs needs a language-model head; this model "
                               "has a value head (compute_values)")
        with kept_weights_of(self.kept, weights_version), \
                adapters_off(self.runner.model) if base else contextlib.nullcontext():
            out, entropies = self._score(tokens, lengths, media, entropy, routing)
        return (out, entropies) if entropy else out

    @torch.no_grad()
    def compute_values(self, tokens: list[list[int]], lengths: list[int]) -> list[list[float]]:
        """A value head's per-row response values under the current weights."""
        if self.spec.head != "value":
            raise RuntimeError(f"{self.spec.name}: compute_values needs a value head (a critic)")
        return self._score(tokens, lengths, None)[0]

    def _score(self, tokens: list[list[int]], lengths: list[int], media: list[bytes] | None,
               entropy: bool = False, routing: list[bytes] | None = None
               ) -> tuple[list[list[float]], list[list[float]]]:
        """Per-row response scores, and (`entropy`) per-token entropies (else empty rows)."""
        self.runner.model.eval()
        start = time.perf_counter()
        b = self.spec.batch
        micro = passes.micro_batches([len(t) for t in tokens], b, b.log_probs_max_tokens_per_gpu or
                                     b.max_tokens_per_gpu, self.layout, self.device)
        rows = [self.routes.attach(passes.scoring_rows(idx, tokens, lengths, media),
                                   None if routing is None or not idx else [routing[i] for i in idx]) for idx in micro]
        with self.profiler.target("train_log_probs"):
            scores = self.runner.run(rows, None, entropy=entropy)
        for r, s in zip(rows, scores):  # R2: a recording forward's routing, for the passes after it
            self.routes.keep(r, s)
        out: list[list[float]] = [[] for _ in tokens]
        entropies: list[list[float]] = [[] for _ in tokens]
        for idx, s in zip(micro, scores):  # the answering ranks' (a pipeline's other stages return none)
            for row, i in enumerate(idx):
                out[i] = s.values_BT[row, : lengths[i]].cpu().tolist()
                if entropy:
                    entropies[i] = s.entropy_BT[row, : lengths[i]].cpu().tolist()
        self.runner.end_scoring(len(tokens))
        self.compute_seconds += time.perf_counter() - start
        return out, entropies

    def pop_compute_seconds(self) -> float:
        """Seconds spent in forward/backward/optimizer since the last call (for overhead accounting)."""
        value, self.compute_seconds = self.compute_seconds, 0.0
        return value

    # ---- training ----------------------------------------------------------------------
    def train(self, batch: TrainBatch, num_steps: int, global_tokens_per_step: list[int]) -> dict[str, float]:
        """`num_steps` optimizer steps over this rank's shard (split evenly, in order): the whole
        shard at once (`train_begin`, `train_rows` with every row, `train_end`).

        A policy's batch has advantages and old log-probs (and ref/rollout log-probs when the
        loss uses them); a value model's has values (the old values) and returns."""
        self.train_begin([len(t) for t in batch.tokens_RL], num_steps, global_tokens_per_step)
        self.train_rows(list(range(len(batch))), batch)
        return self.train_end()

    def train_begin(self, lengths: list[int], num_steps: int, global_tokens_per_step: list[int]) -> None:
        """Start a pass over a shard of `len(lengths)` rows (token counts `lengths`) whose rows
        arrive later, in any order, through `train_rows`. The micro-batch plan is fixed now."""
        if self.optimizer is None:
            raise RuntimeError(f"{self.spec.name} ranks do not train (a frozen model)")
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)  # train_end reports this pass's peak
        plan = passes.plan_pass(lengths, num_steps, self.spec.batch, self.layout, self.device)
        self._pass = passes.TrainPass(plan=plan, global_tokens=list(global_tokens_per_step), num_rows=len(lengths))
        self._pass.totals |= reserve_margin(self.device, self.spec.memory_margin_bytes, self.spec.name)
        self.runner.model.train()
        self.profiler.begin("train_actor")  # ends in train_end

    def train_rows(self, positions: list[int], rows: TrainBatch) -> int:
        """Rows `positions` of the shard (`rows`, in that order) have arrived: run every
        micro-batch whose rows are all in, in plan order (a pipeline runner: whole steps),
        stepping the optimizer after each step's last one. Returns how many micro-batches ran."""
        p = self._pass
        if p is None:
            raise RuntimeError("train_rows before train_begin")
        p.take(positions, rows)
        start, ran = time.perf_counter(), 0
        while (ready := p.ready(self.runner.whole_step)) > 0:
            self._run_micro_batches(p, ready)
            ran += ready
        self.compute_seconds += time.perf_counter() - start
        return ran

    def _run_micro_batches(self, p: passes.TrainPass, count: int) -> None:
        """The next `count` micro-batches of the current step; the optimizer step after its last."""
        micro = p.plan[p.step]
        if p.micro == 0:
            self.optimizer.zero_grad(set_to_none=True)
        chunk, batch = micro[p.micro:p.micro + count], p.batch
        num_samples, num_tokens = sum(map(len, micro)), p.global_tokens[p.step] / self.layout.dp_size
        value_head = self.spec.head == "value"
        media = None if value_head else batch.multimodal_train_inputs_RB
        routing = None if value_head else batch.rollout_routed_experts_RB
        inputs = [self.routes.attach(Rows([batch.tokens_RL[i] for i in m], [batch.response_lengths_R[i] for i in m],
                                          None if media is None else [media[i] for i in m]),
                                     None if routing is None else [routing[i] for i in m]) for m in chunk]

        def loss(k: int, scores: Any) -> Any:
            self.routes.keep(inputs[k], scores)  # R2: the first pass records what later passes replay
            return self.loss(batch, chunk[k], scores, num_samples=num_samples, num_tokens=num_tokens)

        with memory_check.collective("forward/backward (FSDP all-gathers and gradient reduce-scatters)"):
            outputs = self.runner.run(
                inputs, loss,
                entropy=not value_head, entropy_grad=self.loss.entropy_grad, ends_step=p.micro + count == len(micro))
        passes.add_micro_metrics(p.sums, outputs)
        p.micro += count
        if p.micro == len(micro):
            passes.add_step_metrics(p.totals, self._optimizer_step(p.sums), len(p.plan))
            p.step, p.micro, p.sums = p.step + 1, 0, {}

    def _optimizer_step(self, sums: dict[str, float]) -> dict[str, float]:
        with memory_check.collective("gradient reduction"):
            self.runner.reduce_grads()
        with memory_check.collective("gradient norm"):
            grad_norm = self.runner.clip_grad_norm(self.spec.optim.clip_grad)
        if math.isfinite(grad_norm):
            self.optimizer.step()
        else:
            logger.warning("step %d: non-finite grad norm %s; optimizer step skipped", self.step, grad_norm)
        self.runner.after_optimizer_step()
        self.scheduler.step()
        self.step += 1
        return {**sums, "grad_norm": grad_norm, "lr": self.scheduler.get_last_lr()[0]}

    def forget_routing(self) -> int:
        """The step is trained: drop the routing its first forward recorded (R2); how many rows had one."""
        return self.routes.forget()

    def reset_optimizer(self) -> int:
        """`--reset-optimizer-states`: this rank's optimizer state dropped (`optim.reset_optimizer_state`)."""
        with self._resident():
            return reset_optimizer_state(self.optimizer) if self.optimizer is not None else 0

    def train_end(self) -> dict[str, float]:
        """Finish the pass: every optimizer step must have run. Metrics averaged over steps."""
        p, self._pass = self._pass, None
        self.profiler.end("train_actor")
        if p is None or p.step < len(p.plan):
            missing = 0 if p is None else p.missing()
            raise RuntimeError(f"{self.spec.name} rank {self.rank}: train_end with {missing} row(s) of the pass "
                               "never sent; every row of the shard must arrive through train_rows")
        p.totals["compute_seconds"] = self.pop_compute_seconds()
        p.totals |= optimizer_memory(self.optimizer)  # where the state lives, what bf16 moments saved
        if self.device.type == "cuda":
            p.totals |= {"memory/train_peak_gib": torch.cuda.max_memory_allocated(self.device) / GIB,
                         "memory/train_gpu_used_gib": gpu_used_bytes(self.device) / GIB}
        return p.totals

    # ---- profiling (`profiling.py`) -------------------------------------------------------
    def profile_step_begin(self) -> None:
        """The role starts a step on its ranks (`TrainerGroup.profiled_step`), counted from 0 since this launch."""
        self.profiler.step_begin()

    def profile_step_end(self) -> None:
        self.profiler.step_end()

    # ---- offload (colocate on shared GPUs) -----------------------------------------------
    @torch.no_grad()
    def offload(self) -> dict[str, float]:
        """Move weights and optimizer state to pinned host memory (`offload.HostStash`; gradients
        are dropped) and return the GPU memory to the driver, so the engines on this GPU have it
        while they generate."""
        if self.device.type != "cuda":
            return {}
        start = time.perf_counter()
        nbytes = self._stash_state()
        seconds = time.perf_counter() - start
        # cuBLAS keeps its workspaces in the caching allocator; one left inside a large segment
        # pins the whole segment (seen: 64 MiB of workspace holding 2.1 GiB of a Qwen3-0.6B run).
        if hasattr(torch._C, "_cuda_clearCublasWorkspaces"):
            torch._C._cuda_clearCublasWorkspaces()
        torch.cuda.empty_cache()
        return {"memory/trainer_offloaded_gib": torch.cuda.memory_reserved(self.device) / GIB,
                "memory/rollout_phase_gpu_used_gib": gpu_used_bytes(self.device) / GIB,
                "time/offload_train": time.perf_counter() - start, "offload/gib": nbytes / GIB,
                "offload/gbps": nbytes / max(seconds, 1e-9) / 1e9}

    def _stash_state(self) -> int:
        """Weights and optimizer state into the stash (gradients dropped: the next step starts from none)."""
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)
        return self.stash.offload([*self.runner.offload_tensors(), *optimizer_state_tensors(self.optimizer)],
                                  self.device)

    @contextlib.contextmanager
    def _resident(self) -> Iterator[None]:
        """For a call that reads or writes the state (a checkpoint, an export, a push) on a rank that
        is offloaded (colocate, between steps): the state comes back for the call and returns to
        the host after it. A no-op on a rank that holds its state."""
        stashed = bool(self.stash.stashed)
        if stashed:
            self.stash.onload()
        try:
            yield
        finally:
            if stashed:
                self._stash_state()

    @torch.no_grad()
    def onload(self) -> dict[str, float]:
        """Back to the GPU before scoring and training."""
        if self.device.type != "cuda":
            return {}
        start = time.perf_counter()
        nbytes = self.stash.onload()
        seconds = time.perf_counter() - start
        return {"time/onload_train": seconds, "onload/gbps": nbytes / max(seconds, 1e-9) / 1e9,
                **reserve_margin(self.device, self.spec.memory_margin_bytes, self.spec.name)}

    # ---- weights out -------------------------------------------------------------------
    def connect_receivers(self, endpoints: list[Any], api_key: str | None, pause_mode: str = "in_place",
                          devices: list[Any] | None = None, lane: int = 1) -> str | None:
        """(Re)build lane `lane`'s weight group for a new topology: receiver endpoints (engine URLs,
        ranks behind Ray handles) with the GPUs each holds its weights on (`devices`, identities as
        `gpu_identity()` gives them). Returns how weights travel (rank 0; None on the others)."""
        if self.rank != 0:
            return None
        return self.weights.connect(lane, endpoints, api_key, pause_mode, devices, self.gpu_identity())

    def push_weights(self, version: int, background: bool = False, lanes: list[int] | None = None
                     ) -> dict[str, float]:
        """Gather full weights (all ranks) and send them to `lanes` (default: every connected lane)
        from rank 0. `background` (fully async): the send of a snapshot overlaps the next
        training step; the metrics returned are then those of the push that finished meanwhile."""
        dtype = parse_dtype(self.spec.push_dtype) if self.spec.push_dtype else None
        with self._resident(), memory_check.collective("weight gather for a push"):
            state = list(self.runner.hf_state(dtype))
            if self.kept is not None and 1 in (lanes or [1]):  # --keep-old-actor: what the engines take now
                self.kept.pushed(version)
        if self.rank != 0:
            return {}
        return self.weights.push(state, version, sorted(self.weights.senders) if lanes is None else lanes,
                                 background)

    def settle_weight_push(self) -> None:
        """Wait for a background weight push in flight (rank 0); its metrics stay for the next push."""
        if self.rank == 0:
            self.weights.settle()

    def gpu_identity(self) -> str | None:
        """This rank's GPU as weight receivers are described to the sender (None on CPU)."""
        from relax.distributed.ray.placement import gpu_identity

        return gpu_identity() if self.device.type == "cuda" else None

    # ---- weights in (ActorFwd and the Reference take the actor's weights) ----------------
    def weight_version(self) -> int | None:
        return None if self._receiver is None else self._receiver.version

    def receive_weights(self, path: str, payload: dict) -> dict[str, Any]:
        """The receiving side of SGLang's weight-update protocol, reached through a Ray handle.

        Pause/flush/continue are no-ops: this actor runs one call at a time, so no forward pass
        overlaps a load. `received` tells the sender whether the bucket's bytes were consumed."""
        if self._receiver is None:
            self._receiver = self.runner.weight_receiver()
        try:
            if path == "/begin_weight_update":
                if self.stash.stashed:  # an offloaded rank (colocate): the push loads into its state
                    self.stash.onload()
                    self._restash_after_push = True
                self._receiver.begin()
                if self.kept is not None:  # the live weights are no version until the push ends
                    self.kept.receiving()
            elif path == "/end_weight_update" and self._restash_after_push:
                self._restash_after_push = False
                self._stash_state()
            elif path == "/init_weights_update_group":
                return {"success": True, "message": self._receiver.init_group(**payload)}
            elif path == "/update_weights_from_distributed":
                return self._loaded(*self._receiver.update(payload))
            elif path == "/update_weights_from_tensor":  # the sender shares this GPU: CUDA IPC handles
                return self._loaded(*self._receiver.load_tensor_payload(payload))
            elif path == "/destroy_weights_update_group":
                return {"success": True, "message": self._receiver.destroy_group(payload["group_name"])}
        except (ValueError, RuntimeError, KeyError) as exc:
            return {"success": False, "message": f"{type(exc).__name__}: {exc}", "received": False}
        return {"success": True, "message": f"{path}: nothing to do on a training rank"}

    def _loaded(self, success: bool, message: str) -> dict[str, Any]:
        """A bucket was received (and loaded, `success`); --keep-old-actor keeps a version it completed."""
        if success and self.kept is not None:
            self.kept.received(self._receiver.version)
        return {"success": success, "message": message, "received": True}

    # ---- checkpoints -------------------------------------------------------------------
    def save(self, ckpt_dir: str, rollout_id: int, save_optim: bool = True, background: bool = False) -> None:
        """The runner's model (and optimizer) state and every rank's RNG; rank 0 writes meta.json.
        `background` (--async-save): the state is copied to the host now and written by a thread
        while training goes on (meta.json last); `wait_saved` waits for it, as the next save does."""
        self.wait_saved()
        path = Path(ckpt_dir)
        save_optim = save_optim and self.optimizer is not None
        with self._resident():
            if background:
                extra, write = self.runner.snapshot_state(path, self.optimizer, save_optim, rng_state())
            else:
                extra, write = self.runner.save_state(path, self.optimizer, save_optim, rng_state()), None
        meta = json.dumps({"rollout_id": rollout_id, "train_step": self.step, "has_optim": save_optim, **extra,
                           "scheduler": self.scheduler.state_dict() if self.scheduler else None, "time": time.time()})
        if write is None:
            self._write_meta(path, meta)
            dist.barrier()
            return

        def write_all() -> None:
            write()
            self._write_meta(path, meta)  # last: the part is whole once it is there

        if self._writer is None:
            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-writer")
        self._writing = self._writer.submit(write_all)

    def _write_meta(self, path: Path, meta: str) -> None:
        if self.rank == 0:
            (path / "meta.json").write_text(meta)

    def wait_saved(self) -> None:
        """Wait for this rank's background checkpoint write (`save(background=True)`), if any; raises
        what the write raised (a failed write is never lost)."""
        writing, self._writing = self._writing, None
        if writing is not None:
            writing.result()

    def load(self, ckpt_dir: str) -> dict[str, Any]:
        self.wait_saved()  # (a checkpoint this rank is still writing is finished first)
        path = Path(ckpt_dir)
        meta = json.loads((path / "meta.json").read_text())
        with self._resident():
            rng = self.runner.load_state(path, meta, self.optimizer)
            refresh_host_copies(self.optimizer)  # --optimizer-cpu-offload: its host copies take the loaded weights
        if self.scheduler is not None and meta.get("scheduler"):
            self.scheduler.load_state_dict(meta["scheduler"])
        set_rng_state(rng)
        self.step = meta["train_step"]
        return meta

    def load_weights(self, ckpt_dir: str) -> None:
        """Only the model weights of a checkpoint written by `save`."""
        with self._resident():
            self.runner.load_weights(Path(ckpt_dir))
            refresh_host_copies(self.optimizer)

    def export_hf(self, out_dir: str, tokenizer_path: str) -> None:
        with self._resident():
            self.runner.export_hf(out_dir, tokenizer_path)

    def shutdown(self) -> None:
        if self._writing is not None:  # a background checkpoint write ends before the process group does
            futures.wait([self._writing])
        self.weights.close()
        self.profiler.close()
        if dist.is_initialized():
            dist.destroy_process_group()
        self.runner.shutdown()
