"""`TrainerGroup`: a training role's ranks as one typed object.

The components (Actor, Critic, ActorFwd / Reference, an OPD teacher on the training backend)
talk to their ranks through these methods: each fans one `Trainer` method out over the ranks
(`relax.distributed.ray.actor_group.RayActorGroup`: every rank, or one argument per data-parallel
shard) and returns what the components need (one result per shard, rank 0's, or the worst rank's
figure). No call names a method in a string, so a reader and a type checker can follow each one to
`relax.backends.trainer.trainer.Trainer`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Sequence

from relax.backends.base import TrainerSpec
from relax.backends.trainer.trainer import Trainer
from relax.distributed.ray.actor_group import RayActorGroup
from relax.types import TrainBatch


@dataclass
class ScoreShard:
    """One data-parallel shard of a scoring pass: its rows' tokens, response lengths, media and
    (R3) routing records."""

    tokens: list[list[int]]
    lengths: list[int]
    media: list[bytes] | None = None
    routing: list[bytes] | None = None


class TrainerGroup:
    """`world_size` `Trainer` ranks built from `spec` (placed by `rank_options`, Ray options per
    rank; a process per rank on CPU)."""

    def __init__(self, spec: TrainerSpec, world_size: int, *, name: str,
                 rank_options: Sequence[dict[str, Any]] | None = None, env_vars: dict[str, str] | None = None) -> None:
        self.spec, self.name = spec, name
        self.ranks = RayActorGroup(Trainer, world_size, spec, num_cpus=1, name=name, rank_options=rank_options,
                                   env_vars=env_vars)

    @property
    def dp_size(self) -> int:
        return self.ranks.dp_size

    @property
    def workers(self) -> list[Any]:
        """The ranks' actor handles (weight receivers reach them directly)."""
        return self.ranks.workers

    async def ready(self) -> None:
        await self.ranks.ready()

    # ---- profiling
    @contextlib.asynccontextmanager
    async def profiled_step(self) -> AsyncIterator[None]:
        """One step of the role on these ranks, marked for their profilers (--use-pytorch-profiler,
        --record-memory-history: `relax.backends.trainer.profiling`); no calls when neither is set."""
        p = self.spec.profile
        if not (p.use_pytorch_profiler or p.record_memory_history):
            yield
            return
        await self.ranks.on_all(lambda w: w.profile_step_begin.remote())
        yield
        await self.ranks.on_all(lambda w: w.profile_step_end.remote())

    # ---- scoring
    async def score(self, shards: Sequence[ScoreShard], weights_version: int | None = None
                    ) -> list[list[list[float]]]:
        """Per shard, per row: response log-probs (an "lm" head) or values (a "value" head);
        `weights_version` (--keep-old-actor): log-probs on the ranks' kept copy of that version."""
        if self.spec.head == "value":
            return await self.ranks.on_shards(lambda w, s: w.compute_values.remote(s.tokens, s.lengths), shards)
        return await self.ranks.on_shards(lambda w, s: w.compute_log_probs.remote(
            s.tokens, s.lengths, s.media, routing=s.routing, weights_version=weights_version), shards)

    async def score_base(self, shards: Sequence[ScoreShard]) -> list[list[list[float]]]:
        """Per shard, per row: response log-probs of the base model, LoRA adapters off (the Reference
        of a --lora-rank run, scored by the actor's own ranks)."""
        return await self.ranks.on_shards(
            lambda w, s: w.compute_log_probs.remote(s.tokens, s.lengths, s.media, False, True, routing=s.routing),
            shards)

    async def score_with_entropy(self, shards: Sequence[ScoreShard], weights_version: int | None = None
                                 ) -> list[tuple[list[list[float]], list[list[float]]]]:
        """Per shard: (response log-probs, per-token entropies) of each row (--use-rollout-entropy)."""
        return await self.ranks.on_shards(lambda w, s: w.compute_log_probs.remote(
            s.tokens, s.lengths, s.media, True, routing=s.routing, weights_version=weights_version), shards)

    async def pop_compute_seconds(self) -> float:
        """The slowest rank's forward/backward/optimizer seconds since the last call."""
        return max(await self.ranks.on_all(lambda w: w.pop_compute_seconds.remote()))

    # ---- training
    async def train(self, shards: Sequence[TrainBatch], num_steps: int, tokens_per_step: list[int]
                    ) -> list[dict[str, float]]:
        """`num_steps` optimizer steps over each shard; each shard's metrics."""
        return await self.ranks.on_shards(lambda w, b: w.train.remote(b, num_steps, tokens_per_step), shards)

    async def train_begin(self, lengths: Sequence[list[int]], num_steps: int, tokens_per_step: list[int]) -> None:
        await self.ranks.on_shards(lambda w, n: w.train_begin.remote(n, num_steps, tokens_per_step), lengths)

    def train_rows(self, shard: int, positions: list[int], rows: TrainBatch) -> Awaitable[int]:
        """Queue rows of `shard` (in the order submitted); awaits the micro-batches they let run."""
        return self.ranks.submit(shard, lambda w: w.train_rows.remote(positions, rows))

    async def train_end(self) -> list[dict[str, float]]:
        """Every rank's metrics of the pass."""
        return await self.ranks.on_all(lambda w: w.train_end.remote())

    async def forget_routing(self) -> None:
        """Routing replay (R2): every rank drops the routing its step's first forward recorded."""
        await self.ranks.on_all(lambda w: w.forget_routing.remote())

    async def reset_optimizer(self) -> None:
        """`--reset-optimizer-states`: every rank drops its optimizer state."""
        await self.ranks.on_all(lambda w: w.reset_optimizer.remote())

    # ---- weights
    async def connect_receivers(self, endpoints: list[Any], api_key: str | None, pause_mode: str,
                                devices: list[Any] | None, lane: int = 1) -> str:
        """Rank 0 (re)builds lane `lane`'s weight group; how weights travel."""
        return (await self.ranks.on_all(
            lambda w: w.connect_receivers.remote(endpoints, api_key, pause_mode, devices, lane)))[0]

    async def push_weights(self, version: int, background: bool = False,
                           lanes: list[int] | None = None) -> dict[str, float]:
        return (await self.ranks.on_all(lambda w: w.push_weights.remote(version, background, lanes)))[0]

    async def settle_weight_push(self) -> None:
        """Wait for rank 0's background weight push in flight, if any."""
        await self.ranks.on_rank0(lambda w: w.settle_weight_push.remote())

    async def weight_version(self) -> int | None:
        """The last complete version rank 0 received (ActorFwd, the Reference)."""
        return await self.ranks.on_rank0(lambda w: w.weight_version.remote())

    async def gpu_identities(self) -> list[str | None]:
        return await self.ranks.on_all(lambda w: w.gpu_identity.remote())

    # ---- state
    async def move(self, to_host: bool) -> dict[str, float]:
        """Offload (`to_host`) or onload every rank; the largest rank's figures."""
        results = await self.ranks.on_all(lambda w: (w.offload if to_host else w.onload).remote())
        return {key: max(r.get(key, 0.0) for r in results) for key in results[0]} if results else {}

    async def save(self, path: str, rollout_id: int, save_optim: bool, background: bool = False) -> None:
        """Every rank writes its part of checkpoint `path`; `background` (--async-save): each copies its
        state to the host and returns, writing it from a thread (`wait_saved`)."""
        await self.ranks.on_all(lambda w: w.save.remote(path, rollout_id, save_optim, background))

    async def wait_saved(self) -> None:
        """Wait until every rank's background checkpoint write is done; raises the first one's failure."""
        await self.ranks.on_all(lambda w: w.wait_saved.remote())

    async def load(self, path: str) -> dict[str, Any]:
        """Resume every rank from checkpoint `path`; its meta (rank 0's)."""
        return (await self.ranks.on_all(lambda w: w.load.remote(path)))[0]

    async def load_weights(self, path: str) -> None:
        await self.ranks.on_all(lambda w: w.load_weights.remote(path))

    async def export_hf(self, out_dir: str, tokenizer_path: str) -> None:
        await self.ranks.on_all(lambda w: w.export_hf.remote(out_dir, tokenizer_path))

    async def shutdown(self) -> None:
        """Tear down every rank's groups, then end their processes."""
        await self.ranks.on_all(lambda w: w.shutdown.remote())
        self.ranks.kill()
