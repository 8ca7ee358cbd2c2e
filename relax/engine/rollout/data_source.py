"""Where rollout gets its prompts: the dataset, walked epoch by epoch, plus a buffer of groups.

`RolloutDataSource(args)` loads the tokenizer (`--hf-checkpoint`) and the prompt dataset
(`--prompt-data`, in memory or, with `--use-streaming-dataset`, streamed) and hands out
prompts as groups: `get_samples(n)` returns `n` groups of `--n-samples-per-prompt` deep
copies of a prompt `Sample`, with `group_index` (one per group) and `index` (one per sample)
increasing over the whole run. Epoch `e` visits the prompts in file order, or with
`--rollout-shuffle` in the order seeded by `--rollout-seed + e` (slime's order); a request
that runs past the end of an epoch continues in the next one. With `--multimodal-keys` and
`--rollout-max-prompt-len`, it also builds the model's processor, so both datasets measure a
row's prompt with its media expanded to the model's media tokens (`media_length`).

`RolloutDataSourceWithBuffer` (the default `--data-source-path`) adds a buffer of groups
handed back with `add_samples` (partial rollout, over-sampling): `get_samples` serves
buffered groups first, chosen by `--buffer-filter-path` (default: oldest first), then tops
up from the dataset.

Checkpointing: `save(rollout_id)` writes the position (epoch, offset, counters) and the
buffer to `{--save}/rollout/global_dataset_state_dict_{rollout_id}.pt`; `load(rollout_id)`
restores it from `--load` (the latest file when `rollout_id` is None), so a resumed run
produces exactly the groups the uninterrupted run would have. The keys match slime's, so
slime checkpoints load too.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import pickle
import re
from typing import Any, Callable, Protocol, runtime_checkable

from relax.engine.specs import DataSpec
from relax.types import Sample
from relax.utils import checkpoints
from relax.utils.data import EpochSampler, PromptDataset, StreamingPromptDataset
from relax.utils.data.formatting import MediaLength
from relax.utils.plugins import load_plugin

logger = logging.getLogger(__name__)

STATE_SUBDIR = "rollout"
STATE_FILE_RE = re.compile(r"^global_dataset_state_dict_(\d+)\.pt$")

BufferFilter = Callable[[Any, "int | None", list[list[Sample]], int], list[list[Sample]]]
BUFFER_FILTER_SIGNATURE = "fn(args, rollout_id, buffer: list[list[Sample]], num_samples: int) -> list[list[Sample]]"


@runtime_checkable
class DataSource(Protocol):
    """What a `--data-source-path` class provides (constructed as `cls(args)`)."""

    def get_samples(self, num_samples: int) -> list[list[Sample]]: ...

    def add_samples(self, samples: list[list[Sample]]) -> None: ...

    def save(self, rollout_id: int) -> None: ...

    def load(self, rollout_id: int | None = None) -> None: ...

    def __len__(self) -> int: ...


def state_path(directory: str, rollout_id: int) -> str:
    """`{directory}/rollout/global_dataset_state_dict_{rollout_id}.pt` (a checkpoint's data part)."""
    return str(checkpoints.data_state_path(directory, rollout_id))


def latest_saved_rollout_id(directory: str) -> int | None:
    """The highest rollout id with a saved data-source state under `directory`, or None."""
    state_dir = os.path.join(directory, STATE_SUBDIR)
    if not os.path.isdir(state_dir):
        return None
    ids = [int(m.group(1)) for name in os.listdir(state_dir) if (m := STATE_FILE_RE.match(name))]
    return max(ids, default=None)


def _json_flag(value: Any, flag: str) -> dict | None:
    """A dict flag that may still be a JSON string (`--multimodal-keys '{"image": "images"}'`)."""
    if value is None or isinstance(value, dict):
        return value
    try:
        parsed = json.loads(value)
    except (TypeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{flag}: expected a JSON object, got {value!r} ({exc})") from exc
    if not isinstance(parsed, dict):
        raise ValueError(f"{flag}: expected a JSON object, got {value!r}")
    return parsed


def load_tokenizer(spec: DataSpec) -> Any:
    """`AutoTokenizer.from_pretrained(--hf-checkpoint)`, or None when no checkpoint is given."""
    if spec.hf_checkpoint is None:
        return None
    from transformers import AutoTokenizer  # slow import; only when a dataset needs it

    return AutoTokenizer.from_pretrained(spec.hf_checkpoint)


def _media_pipelines(spec: DataSpec, multimodal_keys: dict | None) -> dict | None:
    """The streaming loader's media pipelines: images only for now (resized per --image-*-token-num).

    Video and audio keep their bytes for the model's processor: their pipelines cannot decode
    mp4 / mp3 without FFmpeg (docs/multimodal.md)."""
    if not multimodal_keys or "image" not in multimodal_keys:
        return None
    from relax.utils.multimodal import build_pipelines

    return build_pipelines(spec, ["image"])


def media_length(spec: DataSpec, tokenizer: Any, multimodal_keys: dict | None) -> MediaLength | None:
    """How `--rollout-max-prompt-len` measures rows with media: only a multimodal run with that flag
    gets one (the checkpoint's processor, built here, and the media flags' pipelines), so every
    placeholder counts as the media tokens it expands to. None: text runs (the tokenizer alone)."""
    if not multimodal_keys or spec.rollout_max_prompt_len is None or spec.hf_checkpoint is None:
        return None  # no checkpoint: the dataset names --hf-checkpoint as missing
    try:
        return MediaLength.for_model(spec.hf_checkpoint, tokenizer, spec)
    except ValueError as exc:  # MediaError: a checkpoint whose model takes no media
        raise ValueError(f"--rollout-max-prompt-len with --multimodal-keys counts media tokens with the model's "
                         f"processor, which cannot be built: {exc}") from exc


def build_prompt_dataset(spec: DataSpec, tokenizer: Any) -> PromptDataset | StreamingPromptDataset:
    """The dataset `--prompt-data` and the data flags describe."""
    multimodal_keys = _json_flag(spec.multimodal_keys, "--multimodal-keys")
    common = dict(
        input_key=spec.input_key, label_key=spec.label_key, metadata_key=spec.metadata_key, tool_key=spec.tool_key,
        apply_chat_template=spec.apply_chat_template,
        apply_chat_template_kwargs=_json_flag(spec.apply_chat_template_kwargs, "--apply-chat-template-kwargs"),
        system_prompt=spec.system_prompt, max_prompt_len=spec.rollout_max_prompt_len,
        multimodal_keys=multimodal_keys,
        custom_prompt_fn=load_plugin(spec.custom_prompt_path, flag="--custom-prompt-path", positional=2,
                                     expected="fn(prompt, data: dict) -> prompt") if spec.custom_prompt_path else None,
        skip_malformed=spec.skip_malformed_rows, media_length=media_length(spec, tokenizer, multimodal_keys),
    )
    if spec.use_streaming_dataset:
        return StreamingPromptDataset(
            spec.prompt_data, tokenizer, buffer_size=spec.streaming_buffer_size, shuffle=spec.rollout_shuffle,
            seed=spec.rollout_seed, prefetch_chunk_size=spec.prefetch_chunk_size,
            prefetch_max_cached=spec.prefetch_max_cached, prefetch_num_workers=spec.prefetch_num_workers,
            media_pipelines=_media_pipelines(spec, multimodal_keys), **common)
    return PromptDataset(spec.prompt_data, tokenizer, check_media=True, **common)


class RolloutDataSource:
    """Prompt groups from the dataset, epoch by epoch; read-only (no `add_samples`).

    Constructed as `cls(args)` (the seed's data-source signature); its settings are the run's
    data flags (`DataSpec`)."""

    def __init__(self, args: Any) -> None:
        self.args = args
        self.spec = spec = DataSpec.from_args(args)
        self.n_samples_per_prompt = spec.n_samples_per_prompt
        if self.n_samples_per_prompt < 1:
            raise ValueError(f"--n-samples-per-prompt must be >= 1, got {self.n_samples_per_prompt}")
        self.sample_group_index = 0
        self.sample_index = 0
        self.metadata: dict[str, Any] = {}  # free-form, saved with the state (slime compatibility)
        self.dataset: PromptDataset | StreamingPromptDataset | None = None
        self._sampler: EpochSampler | None = None
        if spec.prompt_data is None:
            logger.warning("no --prompt-data: get_samples returns empty placeholder prompts "
                           "(for rollout functions that make their own prompts)")
            return
        self.dataset = build_prompt_dataset(spec, load_tokenizer(spec))
        if isinstance(self.dataset, PromptDataset):
            self._sampler = EpochSampler(len(self.dataset), shuffle=spec.rollout_shuffle, seed=spec.rollout_seed)

    @property
    def epoch(self) -> int:
        if self._sampler is not None:
            return self._sampler.epoch
        return self.dataset.epoch if self.dataset is not None else 0

    def __len__(self) -> int:
        """Number of prompts in the dataset (rows, for a streaming dataset); used by --num-epoch."""
        return 0 if self.dataset is None else len(self.dataset)

    def get_samples(self, num_samples: int, *, rollout_id: int | None = None) -> list[list[Sample]]:
        """`num_samples` new groups of `n_samples_per_prompt` samples each."""
        return self._groups_from_dataset(num_samples)

    def _groups_from_dataset(self, num_prompts: int) -> list[list[Sample]]:
        return [self._make_group(prompt) for prompt in self._next_prompts(num_prompts)]

    def _next_prompts(self, count: int) -> list[Sample]:
        if count <= 0:
            return []
        if self.dataset is None:
            return [Sample() for _ in range(count)]
        if self._sampler is not None:
            return [self.dataset[i] for i in self._sampler.take(count)]
        return self.dataset.take(count)

    def _make_group(self, prompt: Sample) -> list[Sample]:
        group = []
        for _ in range(self.n_samples_per_prompt):
            sample = copy.deepcopy(prompt)
            sample.group_index = self.sample_group_index
            sample.index = self.sample_index
            self.sample_index += 1
            group.append(sample)
        self.sample_group_index += 1
        return group

    def add_samples(self, samples: list[list[Sample]]) -> None:
        raise RuntimeError(f"{type(self).__name__} is read-only; use RolloutDataSourceWithBuffer "
                           "(--data-source-path relax.engine.rollout.data_source.RolloutDataSourceWithBuffer) "
                           "to hand groups back")

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly where this data source is now."""
        state: dict[str, Any] = {
            "epoch_id": self.epoch,
            "sample_offset": self._sampler.offset if self._sampler is not None else 0,
            "sample_group_index": self.sample_group_index,
            "sample_index": self.sample_index,
            "metadata": self.metadata,
            "num_prompts": len(self),
        }
        if isinstance(self.dataset, StreamingPromptDataset):
            state["streaming_state"] = self.dataset.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved_len = state.get("num_prompts")
        if saved_len is not None and saved_len != len(self):
            logger.warning("data-source state was saved with %d prompts but the dataset now has %d: the resumed "
                           "prompt order will differ from the original run", saved_len, len(self))
        self.sample_group_index = int(state.get("sample_group_index", 0))
        self.sample_index = int(state.get("sample_index", 0))
        self.metadata = dict(state.get("metadata") or {})
        if self._sampler is not None:
            self._sampler.load_state_dict({"epoch": state.get("epoch_id", 0), "offset": state.get("sample_offset", 0)})
        elif isinstance(self.dataset, StreamingPromptDataset) and state.get("streaming_state"):
            self.dataset.load_state_dict(state["streaming_state"])

    def save(self, rollout_id: int) -> None:
        """Write the state to `{--save}/rollout/global_dataset_state_dict_{rollout_id}.pt`."""
        import torch

        save_dir = self.spec.save
        if save_dir is None:
            raise ValueError("data source save: --save is not set; pass --save <dir> to checkpoint the run")
        path = state_path(save_dir, rollout_id)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp_path = f"{path}.tmp"
        torch.save(self.state_dict(), tmp_path)
        os.replace(tmp_path, path)  # a crash mid-write never leaves a truncated state file
        logger.info("saved data-source state (epoch %d, group %d) to %s", self.epoch, self.sample_group_index, path)

    def load(self, rollout_id: int | None = None) -> None:
        """Restore the state saved for `rollout_id` under `--load` (latest when None); no file -> start fresh."""
        load_dir = self.spec.load
        if load_dir is None:
            logger.info("data source: no --load; starting from the first prompt")
            return
        requested = rollout_id
        if rollout_id is None:
            rollout_id = latest_saved_rollout_id(load_dir)
        if requested is not None and requested >= 0 and not os.path.exists(state_path(load_dir, requested)):
            raise FileNotFoundError(
                f"data source: no saved data position for step {requested} ({state_path(load_dir, requested)}); "
                "resuming without it would restart the data from the first prompt. Resume from a complete "
                "checkpoint (--load-fallback takes the newest one) or drop --start-rollout-id")
        if rollout_id is None or rollout_id < 0 or not os.path.exists(state_path(load_dir, rollout_id)):
            logger.info("data source: no saved state under %s; starting from the first prompt",
                        os.path.join(load_dir, STATE_SUBDIR))
            return
        path = state_path(load_dir, rollout_id)
        self.load_state_dict(_read_state(path))
        logger.info("loaded data-source state from %s (epoch %d, group %d)", path, self.epoch,
                    self.sample_group_index)


def _read_state(path: str) -> dict[str, Any]:
    import torch

    try:
        return torch.load(path, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise ValueError(f"cannot load data-source state {path}: it holds objects other than tensors and plain "
                         f"Python values ({exc}); keep Sample.metadata / multimodal_inputs to plain types") from exc


def pop_first(args: Any, rollout_id: int | None, buffer: list[list[Sample]], num_samples: int) -> list[list[Sample]]:
    """Default buffer filter: the oldest-added `num_samples` groups, removed from the buffer."""
    taken = buffer[:num_samples]
    del buffer[:num_samples]
    return taken


class RolloutDataSourceWithBuffer(RolloutDataSource):
    """`RolloutDataSource` plus a buffer of handed-back groups that `get_samples` serves first.

    `--buffer-filter-path` names `fn(args, rollout_id, buffer, num_samples) -> groups` (slime's
    contract): it returns at most `num_samples` groups from `buffer` and removes them from it
    (as `pop_first` does with `del buffer[:n]`); returned groups still found in the buffer are
    removed here, so a filter that only selects works too. `rollout_id` is the value passed to
    `get_samples` (None when the caller gives none, as slime does).
    """

    def __init__(self, args: Any) -> None:
        super().__init__(args)
        self.buffer: list[list[Sample]] = []
        filter_path = self.spec.buffer_filter_path
        self.buffer_filter: BufferFilter = pop_first if filter_path is None else load_plugin(
            filter_path, flag="--buffer-filter-path", positional=4, expected=BUFFER_FILTER_SIGNATURE)

    def get_samples(self, num_samples: int, *, rollout_id: int | None = None) -> list[list[Sample]]:
        groups = self._groups_from_buffer(num_samples, rollout_id)
        return groups + self._groups_from_dataset(num_samples - len(groups))

    def _groups_from_buffer(self, num_samples: int, rollout_id: int | None) -> list[list[Sample]]:
        if not self.buffer or num_samples <= 0:
            return []
        groups = self.buffer_filter(self.args, rollout_id, self.buffer, num_samples)
        if not isinstance(groups, list) or not all(isinstance(g, list) for g in groups):
            raise TypeError(f"--buffer-filter-path returned {type(groups).__name__}; "
                            f"expected {BUFFER_FILTER_SIGNATURE}")
        if len(groups) > num_samples:
            raise ValueError(f"--buffer-filter-path returned {len(groups)} groups but {num_samples} were asked for")
        taken = {id(g) for g in groups}
        self.buffer[:] = [g for g in self.buffer if id(g) not in taken]
        return groups

    def add_samples(self, samples: list[list[Sample]]) -> None:
        """Append groups to the buffer; each must hold `n_samples_per_prompt` samples."""
        if not isinstance(samples, list) or not all(isinstance(g, list) for g in samples):
            raise TypeError(f"add_samples expects list[list[Sample]] (a list of groups), got {type(samples).__name__}")
        for group in samples:
            if len(group) != self.n_samples_per_prompt:
                raise ValueError(f"add_samples: a group has {len(group)} samples but --n-samples-per-prompt is "
                                 f"{self.n_samples_per_prompt}; hand back whole groups")
        self.buffer.extend(samples)

    def get_buffer_length(self) -> int:
        return len(self.buffer)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["buffer"] = [[sample.to_dict() for sample in group] for group in self.buffer]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.buffer = [[_sample_from_state(s) for s in group] for group in state.get("buffer", [])]


def _sample_from_state(data: dict[str, Any]) -> Sample:
    return Sample.from_dict(copy.deepcopy(data))
