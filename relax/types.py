"""The unit of data that flows through rollout: one prompt and one generated response.

`Sample` keeps the field names of the Relax/slime lineage so that user plugins (reward
functions, custom generate functions, filters) written for those frameworks run unchanged.
A group is the `n_samples_per_prompt` samples generated from one prompt; they share
`group_index`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


@dataclass
class Sample:
    """One prompt/response pair and everything rollout and training record about it.

    tokens: prompt + response token ids; the last `response_length` of them are the response.
    loss_mask: one entry per response token (1 = trained on, 0 = e.g. a tool observation).
    rollout_log_probs: one log-prob per response token, from the inference engine.
    weight_versions: the engine weight version(s) the response was generated with.
    rollout_routed_experts: with --use-rollout-routing-replay (MoE), the experts the engine routed
      each token to: a numpy array [positions, layers, top_k] (uint8 ids; int16 past 256 experts) for
      positions [0, positions) of `tokens`, at most len(tokens) - 1 (`relax.utils.routing`).
    prior_segments: the earlier segments of this sample's episode, when its prompts did not extend
      each other (a black-box agent that rewrote its history, docs/agents.md): samples of their own
      (tokens, loss_mask, rollout_log_probs, weight_versions, response_length). This sample is the
      episode's last segment; it alone is scored and counted in its group. With `--agent-segments`
      all (or auto, for the estimators with one advantage per sample) each prior segment is a
      training row of its own that shares this sample's reward and advantage.
    """

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    group_index: int | None = None
    index: int | None = None
    prompt: str | list[dict[str, Any]] = ""
    tokens: list[int] = field(default_factory=list)
    rollout_tokens: list[int] | None = None
    multimodal_inputs: dict[str, Any] | None = None
    multimodal_train_inputs: dict[str, Any] | None = None
    response: str = ""
    response_length: int = 0
    label: Any = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None
    weight_versions: list[int] = field(default_factory=list)
    rollout_log_probs: list[float] | None = None
    rollout_routed_experts: Any = None  # numpy [positions, layers, top_k] (see above)
    remove_sample: bool = False
    abort_count: int = 0
    teacher_log_probs: list[float] | None = None
    status: Status = Status.PENDING
    metadata: dict[str, Any] = field(default_factory=dict)
    generate_function_path: str | None = None
    train_metadata: dict[str, Any] | None = None
    session_id: str | None = None
    prior_segments: list[Sample] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly dict (status as its string value); inverse of `from_dict`."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["status"] = self.status.value
        data["prior_segments"] = [s.to_dict() for s in self.prior_segments]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Sample:
        data = dict(data)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"Sample.from_dict: unknown field(s) {unknown}; known fields are {sorted(known)}")
        if "status" in data and not isinstance(data["status"], cls.Status):
            data["status"] = cls.Status(data["status"])
        if data.get("prior_segments"):
            data["prior_segments"] = [s if isinstance(s, Sample) else cls.from_dict(s) for s in data["prior_segments"]]
        return cls(**data)

    def get_reward_value(self, reward_key: str | None = None) -> float:
        """The scalar reward: `reward` itself, or `reward[reward_key]` when the reward is a dict."""
        if isinstance(self.reward, dict):
            if not reward_key:
                raise ValueError(
                    f"sample {self.index}: reward is a dict {sorted(self.reward)}; "
                    "set --reward-key to the entry that holds the score"
                )
            if reward_key not in self.reward:
                raise KeyError(f"sample {self.index}: --reward-key {reward_key!r} not in reward dict "
                               f"{sorted(self.reward)}")
            return float(self.reward[reward_key])
        if self.reward is None:
            raise ValueError(f"sample {self.index}: reward is not set")
        return float(self.reward)

    @property
    def prompt_length(self) -> int:
        return len(self.tokens) - self.response_length


# SGLang `meta_info.finish_reason.type` -> Status.
FINISH_REASON_STATUS: dict[str, Sample.Status] = {
    "stop": Sample.Status.COMPLETED,
    "length": Sample.Status.TRUNCATED,
    "abort": Sample.Status.ABORTED,
}


# ---- the data plane's columns -------------------------------------------------------------
#
# (episode_indices: a prior segment's row (Sample.prior_segments) points at its episode's last
# segment, the row that is scored. multimodal_train_inputs: pixel_values, image_grid_thw, ... of a
# multimodal row. rollout_routed_experts: [positions, layers, top_k] top-k expert ids, one byte per
# id, two past 256 experts.)
#
# Every TransferQueue column is declared once here: its dtype and its shape per row. Shape
# letters: R = one value per row (sample); RT = one value per response token (row r has
# `response_lengths[r]` of them, response-aligned); RL = one per prompt + response token. Who
# B = bytes per row (a uint8 list; a multimodal row's encoder tensors as safetensors). Who
# writes and who reads a column depends on the run (mode, estimator, optional roles) and is
# resolved once by the run plan (`relax.config.plan`), which `relax-train --dry-run` prints.


@dataclass(frozen=True)
class Column:
    name: str
    dtype: str  # "int64" | "float32" | "uint8" (torch dtype names; this module stays free of torch)
    shape: str  # "R" | "RT" | "RL" | "RB"
    doc: str

    @property
    def ragged(self) -> bool:
        """A variable-length list per row (a jagged nested tensor in TransferQueue)."""
        return self.shape != "R"

    @property
    def field(self) -> str:
        """The `TrainBatch` field holding this column: the name with its shape suffix."""
        return f"{self.name}_{self.shape}"


COLUMNS: dict[str, Column] = {c.name: c for c in (
    Column("tokens", "int64", "RL", "prompt + response token ids"),
    Column("response_lengths", "int64", "R", "response tokens at the end of `tokens`"),
    Column("loss_masks", "int64", "RT", "1 = the token is trained on (0: padding, tool output, masked)"),
    Column("rollout_log_probs", "float32", "RT", "the engine's log-prob of each response token"),
    Column("rewards", "float32", "R", "the scalar reward (after --reward-key and any post-process)"),
    Column("group_indices", "int64", "R", "the prompt group (-1: a row from a custom conversion)"),
    Column("sample_indices", "int64", "R", "the sample's global index (the row's key)"),
    Column("weight_versions", "int64", "R", "oldest weight version any token of the row may have seen"),
    Column("truncated", "int64", "R", "1 = the response hit its length limit"),
    Column("episode_indices", "int64", "R", "the row's episode: its own index, or a prior segment's scored row"),
    Column("episode_rows", "int64", "R", "rows of that episode: 1 + its prior segments"),
    Column("old_log_probs", "float32", "RT", "behaviour policy recomputed on the trainer's weights"),
    Column("ref_log_probs", "float32", "RT", "the reference model's log-probs (KL loss / KL shaping)"),
    Column("teacher_log_probs", "float32", "RT", "the OPD teacher's log-probs"),
    Column("values", "float32", "RT", "the critic's value of the state each token is chosen in"),
    Column("advantages", "float32", "RT", "per-token advantages (estimator, OPD penalty, whitening)"),
    Column("returns", "float32", "RT", "GAE returns the critic is fitted to"),
    Column("multimodal_train_inputs", "uint8", "RB", "encoder tensors as safetensors bytes (empty: a text row)"),
    Column("rollout_routed_experts", "uint8", "RB", "the engine's experts per token and MoE layer (R3, utils.routing)"),
)}
# Written by Rollout only in multimodal runs (--multimodal-keys).
MEDIA_COLUMN = "multimodal_train_inputs"
# Written by Rollout only with --use-rollout-routing-replay (an MoE model).
ROUTING_COLUMN = "rollout_routed_experts"

# What Rollout writes for every sample, in this order.
ROLLOUT_COLUMNS = ("tokens", "loss_masks", "rollout_log_probs", "response_lengths", "rewards", "group_indices",
                   "sample_indices", "weight_versions", "truncated", "episode_indices", "episode_rows")


@dataclass
class TrainBatch:
    """One step's rows as the trainer sees them (R rows; see the shape letters above).

    Ragged fields hold one Python list per row (response-aligned for `_RT`). The optional
    fields are None when the run has no producer for them (no reference, no critic, ...).
    Groups are contiguous: rows are in sample order."""

    tokens_RL: list[list[int]]
    response_lengths_R: list[int]
    loss_masks_RT: list[list[int]]
    rollout_log_probs_RT: list[list[float]] | None = None
    rewards_R: list[float] | None = None
    old_log_probs_RT: list[list[float]] | None = None
    advantages_RT: list[list[float]] | None = None
    ref_log_probs_RT: list[list[float]] | None = None
    teacher_log_probs_RT: list[list[float]] | None = None
    values_RT: list[list[float]] | None = None
    returns_RT: list[list[float]] | None = None
    multimodal_train_inputs_RB: list[bytes] | None = None
    rollout_routed_experts_RB: list[bytes] | None = None  # R3: each row's routing record (relax.utils.routing)
    entropy_RT: list[list[float]] | None = None  # --use-rollout-entropy: per-token entropy of the old policy
    sample_indices_R: list[int] | None = None  # with episode_indices_R: which rows are prior segments (advantages)
    episode_indices_R: list[int] | None = None

    def __len__(self) -> int:
        return len(self.tokens_RL)

    def present(self) -> list[str]:
        """Names of the fields that hold data."""
        return [f.name for f in dataclasses.fields(self) if getattr(self, f.name) is not None]

    def rows(self, index: list[int]) -> TrainBatch:
        """The rows `index`, in that order (every present field)."""
        return TrainBatch(**{name: [getattr(self, name)[i] for i in index] for name in self.present()})

    @classmethod
    def empty(cls, num_rows: int, fields: list[str]) -> TrainBatch:
        """A batch of `num_rows` rows whose `fields` are still to be filled (`put`)."""
        holes = {name: [None] * num_rows for name in fields}
        required = {f.name: [None] * num_rows for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING}
        return cls(**(required | holes))

    def put(self, positions: list[int], part: TrainBatch) -> None:
        """Write `part`'s rows (in order) at `positions`, field by field."""
        for name in part.present():
            column = getattr(self, name)
            if column is None:
                column = [None] * len(self)
                setattr(self, name, column)
            for pos, value in zip(positions, getattr(part, name)):
                column[pos] = value

    def to_columns(self) -> dict[str, list[Any]]:
        """The present fields under their column names (`advantages_RT` -> `advantages`)."""
        return {name.rsplit("_", 1)[0]: getattr(self, name) for name in self.present()}

    @classmethod
    def from_columns(cls, columns: dict[str, list[Any]]) -> TrainBatch:
        """From TransferQueue column names (`COLUMNS`) to fields; columns the batch has no field
        for (group_indices, ...) are left out."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{COLUMNS[c].field: v for c, v in columns.items() if COLUMNS[c].field in names})
