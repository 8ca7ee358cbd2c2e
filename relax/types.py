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
    rollout_routed_experts: list[list[int]] | None = None
    remove_sample: bool = False
    abort_count: int = 0
    teacher_log_probs: list[float] | None = None
    status: Status = Status.PENDING
    metadata: dict[str, Any] = field(default_factory=dict)
    generate_function_path: str | None = None
    train_metadata: dict[str, Any] | None = None
    session_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly dict (status as its string value); inverse of `from_dict`."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["status"] = self.status.value
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
                raise KeyError(f"sample {self.index}: --reward-key {reward_key!r} not in reward dict {sorted(self.reward)}")
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
