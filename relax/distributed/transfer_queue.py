"""The data plane: TransferQueue partitions, one per rollout step (`<run>/train_{step}`).

Rollout writes one row per sample (key = the sample's global index; an agent episode's prior
segments are rows of their own, `episode_rows`); downstream roles add
columns to the same rows (`ref_log_probs`, `advantages`, ...); the Actor reads what it needs
and clears the partition after training, which is also the back-pressure. Variable-length
columns travel as jagged nested tensors and come back as lists of 1-D tensors.

The `transfer_queue` package is imported on first use (`_package`). Every process on the data
plane imports torch._dynamo with it (~2 s of CPU on a small machine), and no import order avoids
that: tensordict's torch.compile marks import it, and so does every jagged nested tensor built
(`torch.nested` marks its sequence lengths dynamic), in this module and in TransferQueue's own
reads. An earlier import without tensordict's marks only moved it to the first row (measured).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Any, Awaitable, Callable, Sequence

import torch

from relax.distributed.ray.names import named_actor_running
from relax.types import Sample
from relax.utils.routing import RoutingShape
from relax.utils.routing import to_bytes as routing_to_bytes
from relax.utils.logging import setup_logging
from relax.utils.metrics import METRICS_APP_ENV, MetricsReporter
from relax.utils.poll import Backoff
from relax.utils.proc import RUN_ENV

logger = logging.getLogger(__name__)
_reporters: dict[tuple[str, str | None], MetricsReporter] = {}  # stream_step's: (task, metrics app) -> reporter

# Columns written by Rollout; name -> (dtype, is_sequence).
ROLLOUT_COLUMNS: dict[str, tuple[torch.dtype, bool]] = {
    "tokens": (torch.int64, True),
    "loss_masks": (torch.int64, True),
    "rollout_log_probs": (torch.float32, True),
    "response_lengths": (torch.int64, False),
    "rewards": (torch.float32, False),
    "group_indices": (torch.int64, False),
    "sample_indices": (torch.int64, False),
    "weight_versions": (torch.int64, False),
    "truncated": (torch.int64, False),
    "episode_indices": (torch.int64, False),
    "episode_rows": (torch.int64, False),
}
MEDIA_COLUMN = ("multimodal_train_inputs", torch.uint8)  # rows' encoder tensors (multimodal runs only)
ROUTING_COLUMN = "rollout_routed_experts"  # rows' routing records (R3 only), uint8 bytes as the media column


def _package() -> Any:
    """The `transfer_queue` package, imported on first use (module doc)."""
    import transfer_queue

    return transfer_queue


def _namespace() -> str:
    """This process's run: runs sharing one data system (jobs on one cluster) never see each
    other's rows."""
    run = os.environ.get(RUN_ENV, "")
    return f"{run}/" if run else ""


def partition_id(step: int) -> str:
    return f"{_namespace()}train_{step}"


def steps_partition() -> str:
    """One row per finished rollout step: how many rows it wrote."""
    return f"{_namespace()}relax_steps"


def running() -> bool:
    """A TransferQueue controller is up on this Ray cluster (e.g. a test session's)."""
    return named_actor_running("TransferQueueController", "transfer_queue")


def init_data_system(num_storage_units: int = 1, node_resource: str | None = None, *,
                     polling_mode: bool = True) -> bool:
    """Start TransferQueue's controller and storage, or attach to the one already running (its
    leftover rows are cleared). Returns True when this call started it (and so owns closing it).
    `node_resource` ("node:<address>"): the storage units go on the node that has it (a run over
    several nodes keeps its data on the driver's node, which it does not lose), else round the nodes.

    Polling mode (--polling-mode; the config refuses false, TransferQueue's blocking fetch): a consumer
    asking for more ready rows than exist gets an empty answer at once instead of blocking the
    controller (streaming consumers poll)."""
    tq = _package()
    from omegaconf import OmegaConf

    if running():
        tq.init()
        return False
    storage: dict[str, Any] = {"num_data_storage_units": num_storage_units}
    if node_resource:
        storage["required_node_resource"] = node_resource
    tq.init(OmegaConf.create({"controller": {"polling_mode": polling_mode}, "backend": {"SimpleStorage": storage}}))
    return True


def wait_for_controller(starting: Any, timeout_s: float = 120.0) -> None:
    """Until the data system's controller exists (a role attaching from now on joins it instead of
    starting a second one); `starting` is the future of `init_data_system`, whose error is raised."""
    import time

    deadline, backoff = time.monotonic() + timeout_s, Backoff(first_s=0.02, max_s=0.2)
    while not running():
        if starting.done():
            starting.result()  # raises why the data system did not start
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"TransferQueue's controller did not start within {timeout_s:.0f}s")
        backoff.sleep()


def clear_run() -> None:
    """Drop every row this run left in a shared data system (a run stopped mid-step leaves some)."""
    tq = _package()

    for partition, rows in tq.kv_list().items():
        if rows and partition.startswith(_namespace()):
            tq.kv_clear(keys=list(rows), partition_id=partition)


def attach() -> None:
    tq = _package()

    tq.init()


def attach_if_running() -> None:
    """Attach to the run's data system when there is one (a role's replica); a role constructed
    outside a run (a unit test) stays detached instead of starting Ray and a data system."""
    import ray

    if ray.is_initialized() and running():
        attach()


def start_replica() -> None:
    """A role replica's first act: its logging, then the run's data system. Attached in the
    constructor, not in `setup`: the replicas construct side by side (~1 s a process)."""
    setup_logging()
    attach_if_running()


def close_data_system() -> None:
    tq = _package()

    tq.close()


def _column(values: Sequence[Any], dtype: torch.dtype, is_sequence: bool) -> torch.Tensor:
    if is_sequence:
        return torch.nested.nested_tensor([torch.as_tensor(v, dtype=dtype) for v in values], layout=torch.jagged)
    return torch.as_tensor(list(values), dtype=dtype)


def row_version(sample: Sample, started_at: int | None = None) -> int:
    """The weight version a row is stamped with: the oldest one any of its tokens may have seen.

    Engines report the version that finished a request; in fully-async mode weights can change
    mid-request, so the Rollout also passes the engine version at which the step started
    (`started_at`), a lower bound for every token of the step. -1: unknown (replayed data)."""
    versions = list(sample.weight_versions) + ([started_at] if started_at is not None else [])
    return min(versions) if versions else -1


def media_column(samples: Sequence[Sample]) -> torch.Tensor:
    """The samples' `multimodal_train_inputs` (encoder tensors) as safetensors bytes per row."""
    from relax.utils.multimodal.tensors import to_bytes

    rows = [to_bytes(s.multimodal_train_inputs) for s in samples]
    return torch.nested.nested_tensor([torch.frombuffer(bytearray(b), dtype=MEDIA_COLUMN[1]) if b
                                       else torch.zeros(0, dtype=MEDIA_COLUMN[1]) for b in rows], layout=torch.jagged)


def routing_column(samples: Sequence[Sample], shape: RoutingShape) -> torch.Tensor:
    """R3: the samples' routing records (`relax.utils.routing`) as bytes per row. ValueError for a
    sample with a response but no record (a custom generate function must ask for it:
    `relax.engine.rollout.routing`)."""
    for s in samples:
        if s.response_length and s.rollout_routed_experts is None:
            raise ValueError(f"sample {s.index}: --use-rollout-routing-replay is on but the sample has no "
                             "rollout_routed_experts; a custom generate function must send request_fields() and "
                             "keep_routing() of relax.engine.rollout.routing around its /generate calls")
    rows = [routing_to_bytes(s.rollout_routed_experts, shape) for s in samples]
    return torch.nested.nested_tensor([torch.frombuffer(bytearray(b), dtype=torch.uint8) if b
                                       else torch.zeros(0, dtype=torch.uint8) for b in rows], layout=torch.jagged)


def media_bytes(values: Sequence[Any] | None) -> list[bytes] | None:
    """A bytes column read back (uint8 tensors: the media and routing columns) as one bytes object per row."""
    return None if values is None else [v.numpy().tobytes() if hasattr(v, "numpy") else bytes(v) for v in values]


SEGMENT_KEY_BASE = 1 << 40  # a prior segment's row key: base + its episode's index * MAX_SEGMENTS + k
MAX_SEGMENTS = 1024


def episode_rows(samples: Sequence[Sample], reward_values: Sequence[float]
                 ) -> tuple[list[Sample], list[float], list[tuple[int, int]]]:
    """The rows of `samples` (types.Sample.prior_segments): each sample's prior segments, then the
    sample itself; every row with its episode's reward and (episode index, episode rows). A
    segment's row is keyed `SEGMENT_KEY_BASE + index * MAX_SEGMENTS + k` and joins its episode's group."""
    rows: list[Sample] = []
    rewards: list[float] = []
    episodes: list[tuple[int, int]] = []
    for s, reward in zip(samples, reward_values):
        n = 1 + len(s.prior_segments)
        if n > MAX_SEGMENTS:
            raise ValueError(f"sample {s.index}: {n - 1} prior segments, at most {MAX_SEGMENTS - 1}")
        for k, seg in enumerate(s.prior_segments):
            rows.append(dataclasses.replace(seg, index=SEGMENT_KEY_BASE + s.index * MAX_SEGMENTS + k,
                                            group_index=s.group_index, prior_segments=[]))
            rewards.append(reward)
            episodes.append((s.index, n))
        rows.append(s)
        rewards.append(reward)
        episodes.append((s.index, n))
    return rows, rewards, episodes


def row_count(samples: Sequence[Sample]) -> int:
    """Rows `put_samples` writes for `samples` (no custom conversion): one each, plus their prior segments."""
    return sum(1 + len(s.prior_segments) for s in samples)


def samples_to_columns(samples: Sequence[Sample], reward_values: Sequence[float], *,
                       started_at: int | None = None, media: bool = False,
                       routing: RoutingShape | None = None,
                       episodes: Sequence[tuple[int, int]] | None = None) -> dict[str, torch.Tensor]:
    """Rollout rows: one entry per sample, response-aligned sequences for masks/log-probs;
    `media`: also the multimodal column (a multimodal run); `routing`: also the routing records (R3);
    `episodes`: each row's (episode index, episode rows) from `episode_rows` (default: its own, 1)."""
    episodes = list(episodes) if episodes is not None else [(s.index, 1) for s in samples]
    columns = {
        "tokens": [s.tokens for s in samples],
        "loss_masks": [s.loss_mask if s.loss_mask is not None else [1] * s.response_length for s in samples],
        "rollout_log_probs": [s.rollout_log_probs or [0.0] * s.response_length for s in samples],
        "response_lengths": [s.response_length for s in samples],
        "rewards": list(reward_values),
        "group_indices": [s.group_index if s.group_index is not None else -1 for s in samples],
        "sample_indices": [s.index for s in samples],
        "weight_versions": [row_version(s, started_at) for s in samples],
        "truncated": [int(s.status == Sample.Status.TRUNCATED) for s in samples],
        "episode_indices": [e for e, _ in episodes],
        "episode_rows": [n for _, n in episodes],
    }
    for s in samples:
        if len(s.tokens) < s.response_length or (s.loss_mask is not None and len(s.loss_mask) != s.response_length):
            raise ValueError(f"sample {s.index}: tokens ({len(s.tokens)}), response_length ({s.response_length}) and "
                             f"loss_mask ({len(s.loss_mask or [])}) disagree; a custom generate function must keep "
                             "len(loss_mask) == response_length <= len(tokens)")
    out = {name: _column(columns[name], *ROLLOUT_COLUMNS[name]) for name in ROLLOUT_COLUMNS}
    if media:
        out[MEDIA_COLUMN[0]] = media_column(samples)
    if routing is not None:
        out[ROUTING_COLUMN] = routing_column(samples, routing)
    return out


def train_data_to_columns(data: Any, samples: Sequence[Sample], reward_values: Sequence[float], *,
                          started_at: int | None = None, media: bool = False,
                          routing: RoutingShape | None = None) -> dict[str, torch.Tensor]:
    """Rows from a `--custom-convert-samples-to-train-data-path` result: its per-sample lists
    (slime's train-data keys: tokens, response_lengths, rewards, loss_masks, rollout_log_probs,
    truncated, sample_indices, ...) replace the default conversion's columns; keys it leaves
    out keep the default. Keys no role here reads (raw_reward, metadata, ...) are dropped."""
    flag = "--custom-convert-samples-to-train-data-path"
    if not isinstance(data, dict):
        raise TypeError(f"{flag}: the function must return a dict of per-sample lists, got {type(data).__name__}")
    unused = sorted(set(data) - set(ROLLOUT_COLUMNS))
    if unused:
        logger.debug("%s: keys without a consumer here, dropped: %s", flag, unused)
    columns = {name: list(values) for name, values in data.items() if name in ROLLOUT_COLUMNS}
    for name, values in columns.items():
        if len(values) != len(samples):
            raise ValueError(f"{flag}: '{name}' has {len(values)} entries for {len(samples)} samples; return one "
                             "entry per sample, in the samples' order")
    out = samples_to_columns(samples, reward_values, started_at=started_at, media=media, routing=routing)
    out.update({name: _column(values, *ROLLOUT_COLUMNS[name]) for name, values in columns.items()})
    lengths = out["response_lengths"].tolist()
    for i, n in enumerate(lengths):
        if len(out["tokens"][i]) < n or len(out["loss_masks"][i]) != n or len(out["rollout_log_probs"][i]) != n:
            raise ValueError(f"{flag}: row {i} has {len(out['tokens'][i])} tokens, response_length {n}, "
                             f"{len(out['loss_masks'][i])} loss_masks and {len(out['rollout_log_probs'][i])} "
                             "rollout_log_probs; keep len(loss_masks) == len(rollout_log_probs) == response_length "
                             "<= len(tokens)")
    return out


async def put_columns(step: int, keys: Sequence[str], columns: dict[str, torch.Tensor]) -> None:
    """Write `columns` for rows `keys` (new rows, or new columns on existing rows)."""
    tq = _package()
    from tensordict import TensorDict

    await tq.async_kv_batch_put(keys=list(keys), partition_id=partition_id(step),
                                fields=TensorDict(columns, batch_size=len(keys)))


def sequence_column(values: Sequence[Sequence[float]], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Per-row lists -> the jagged column TransferQueue stores."""
    return _column(values, dtype, True)


async def put_samples(step: int, samples: Sequence[Sample], reward_values: Sequence[float],
                      train_data: dict[str, Any] | None = None, *, started_at: int | None = None,
                      media: bool = False, routing: RoutingShape | None = None) -> list[str]:
    """One row per sample (key = Sample.index); `train_data` is a custom conversion's result;
    `started_at`: the engine version the step started at (fully async, see `row_version`);
    `media`: write the multimodal column too (a multimodal run's Rollout); `routing`: the routing
    records too (R3, the model's `RoutingShape`)."""
    if train_data is None:  # a sample's prior segments (an agent's rewritten history) are rows of their own
        samples, reward_values, episodes = episode_rows(samples, reward_values)
    elif any(s.prior_segments for s in samples):
        raise ValueError("--custom-convert-samples-to-train-data-path: samples with prior_segments (an agent's "
                         "rewritten history) are not converted by a custom conversion; return their rows from it "
                         "or drop the conversion")
    keys = [str(s.index) for s in samples]
    if len(set(keys)) != len(keys):
        raise ValueError(f"step {step}: duplicate sample indices; every sample needs a unique Sample.index")
    if train_data is None:
        columns = samples_to_columns(samples, reward_values, started_at=started_at, media=media, routing=routing,
                                     episodes=episodes)
    else:
        columns = train_data_to_columns(train_data, samples, reward_values, started_at=started_at, media=media,
                                        routing=routing)
    await put_columns(step, keys, columns)
    return keys


async def list_keys(step: int) -> list[str]:
    tq = _package()

    listing = await tq.async_kv_list(partition_id=partition_id(step))
    return sorted(listing.get(partition_id(step), {}), key=int)


def _unpack(value: torch.Tensor) -> Any:
    if getattr(value, "is_nested", False):
        return list(value.unbind())
    return value


async def get_columns(step: int, keys: Sequence[str], fields: Sequence[str]) -> dict[str, Any]:
    """Columns for `keys` in key order: sequences as lists of 1-D tensors, scalars as a tensor."""
    tq = _package()

    data = await tq.async_kv_batch_get(keys=list(keys), partition_id=partition_id(step), select_fields=list(fields))
    return {name: _unpack(data[name]) for name in fields}


async def fetch_ready(step: int, fields: Sequence[str], task: str, chunk: int) -> tuple[list[str], dict[str, Any]]:
    """Streaming read: every row of the step whose `fields` are all written and that `task` has
    not fetched yet, in chunks of `chunk` rows (fewer ready rows than `chunk` -> none of them).
    Returns (keys, columns); each row is handed to a task once. Keys are sample indices, as
    `put_samples` wrote them."""
    tq = _package()

    client = tq.get_client()
    keys: list[str] = []
    columns: dict[str, list[Any]] = {name: [] for name in fields}
    select = list(dict.fromkeys([*fields, "sample_indices"]))  # a row's key is its sample index
    while True:
        meta = await client.async_get_meta(data_fields=select, batch_size=chunk,
                                           partition_id=partition_id(step), mode="fetch", task_name=task)
        if meta.size == 0:
            break
        data = await client.async_get_data(meta)
        keys.extend(str(int(i)) for i in data["sample_indices"].tolist())
        for name in fields:
            value = _unpack(data[name])
            columns[name].extend(value if isinstance(value, list) else value.tolist())
    return keys, columns


async def stream_step(step: int, *, task: str, chunk: int, fields: Sequence[str],
                      score: Callable[[list[str], dict[str, Any]], Awaitable[None]],
                      alive: Callable[[], bool]) -> int:
    """Hand every row of `step` to `await score(keys, columns)` as soon as its `fields` are
    written (in chunks of `chunk` rows, the last one smaller), until Rollout marked the step done
    and every row was handed over; returns how many. Polls with backoff while nothing is ready.
    The fully-async consumers (ActorFwd, Reference, Critic, Advantages, the Actor) read this way.
    With `--use-metrics-service` each step's `stream/<task>_seconds` (first poll to last row) and
    `stream/<task>_rows` go to the metrics service (the streaming scorers have no other way to report)."""
    done, backoff, start = 0, Backoff(), time.perf_counter()
    while alive():
        total = await step_rows(step)
        want = chunk if total is None else max(1, min(chunk, total - done))
        keys, cols = await fetch_ready(step, fields, task=task, chunk=want)
        if keys:
            await score(keys, cols)
            done += len(keys)
            backoff.reset()
            continue
        if total is not None and done >= total:
            break
        await backoff.wait()
    key = (task, os.environ.get(METRICS_APP_ENV))
    reporter = _reporters.get(key) or _reporters.setdefault(key, MetricsReporter(task))
    reporter.report(step, {f"stream/{task}_seconds": time.perf_counter() - start, f"stream/{task}_rows": float(done)})
    return done


async def mark_step_done(step: int, num_rows: int) -> None:
    """Rollout has written every row of `step` (consumers compare this count with theirs)."""
    tq = _package()
    from tensordict import TensorDict

    await tq.async_kv_batch_put(keys=[str(step)], partition_id=steps_partition(),
                                fields=TensorDict({"num_rows": torch.tensor([num_rows])}, batch_size=1))


async def step_rows(step: int) -> int | None:
    """Rows written for `step` once Rollout marked it done, else None."""
    tq = _package()

    partition = steps_partition()
    listing = (await tq.async_kv_list(partition_id=partition)).get(partition, {})
    if str(step) not in listing:
        return None
    try:
        data = await tq.async_kv_batch_get(keys=[str(step)], partition_id=steps_partition(), select_fields=["num_rows"])
    except ValueError:  # listed while its put is still landing: not done yet from here
        return None
    return int(data["num_rows"][0])


async def clear(step: int) -> None:
    tq = _package()

    keys = await list_keys(step)
    if keys:
        await tq.async_kv_clear(keys=keys, partition_id=partition_id(step))
    if await step_rows(step) is not None:
        await tq.async_kv_clear(keys=[str(step)], partition_id=steps_partition())


async def live_steps() -> list[int]:
    """Steps whose partition still holds rows (generated, not yet trained and cleared)."""
    tq = _package()

    listing = await tq.async_kv_list()
    prefix = partition_id(0)[:-1]
    return sorted(int(p[len(prefix):]) for p, rows in listing.items() if p.startswith(prefix) and rows)
