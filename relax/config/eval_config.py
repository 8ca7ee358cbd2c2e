"""Evaluation datasets: `--eval-config` (OmegaConf YAML/JSON) or `--eval-prompt-data` pairs.

Both become a list of fully resolved `EvalDataset`s, so the Rollout never re-derives a default.
The file format is slime's:

    eval:
      defaults:                    # optional, applies to every dataset
        n_samples_per_eval_prompt: 4
        temperature: 0.6
      datasets:                    # a list of {name, path, ...} (or a mapping name -> {...})
        - name: aime
          path: /data/aime.jsonl
          rm_type: math
          input_key: problem       # `prompt_key` is accepted as slime's spelling
          label_key: answer
          max_response_len: 1024
          metadata_overrides: {split: test}

Each field resolves, first set wins: the dataset entry, `eval.defaults`, the `--eval-*` flag,
the rollout/data flag (e.g. temperature: entry, defaults, `--eval-temperature`,
`--rollout-temperature`). `--eval-config` replaces `--eval-prompt-data` when both are given.
No torch/ray import: the file is checked with the other flags, before anything starts.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from relax.config.choices import parse_rm_type


@dataclass(frozen=True)
class EvalDataset:
    """One eval set with every generation/reward setting resolved (None = not limited / unset)."""

    name: str
    path: str
    input_key: str = "input"
    label_key: str | None = None
    tool_key: str | None = "tools"
    metadata_key: str | None = "metadata"
    n_samples_per_eval_prompt: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_response_len: int | None = None
    min_new_tokens: int | None = None
    max_prompt_len: int | None = None
    max_context_len: int | None = None
    stop: list | None = None
    stop_token_ids: list | None = None
    rm_type: str | None = None
    reward_key: str | None = None
    custom_generate_function_path: str | None = None
    metadata_overrides: dict = field(default_factory=dict)


FIELDS = tuple(f.name for f in dataclasses.fields(EvalDataset))
ALIASES = {"prompt_key": "input_key"}  # slime's EvalDatasetConfig spelling


def _fallbacks(args: Any) -> dict[str, Any]:
    """Per field: the value from the flags (`--eval-*`, then the rollout/data flag)."""
    def first(*values: Any) -> Any:
        return next((v for v in values if v is not None), None)

    return {
        "input_key": first(args.eval_input_key, args.input_key),
        "label_key": first(args.eval_label_key, args.label_key),
        "tool_key": first(args.eval_tool_key, args.tool_key),
        "metadata_key": args.metadata_key,
        "n_samples_per_eval_prompt": args.n_samples_per_eval_prompt,
        "temperature": first(args.eval_temperature, args.rollout_temperature),
        "top_p": first(args.eval_top_p, args.rollout_top_p),
        "top_k": first(args.eval_top_k, args.rollout_top_k),
        "max_response_len": first(args.eval_max_response_len, args.rollout_max_response_len),
        "min_new_tokens": args.eval_min_new_tokens,
        "max_prompt_len": args.eval_max_prompt_len,
        "max_context_len": first(args.eval_max_context_len, args.rollout_max_context_len),
        "stop": args.rollout_stop,
        "stop_token_ids": args.rollout_stop_token_ids,
        "rm_type": None,  # None: the run's reward (--custom-rm-path / --rm-type / row metadata)
        "reward_key": first(args.eval_reward_key, args.reward_key),
        "custom_generate_function_path": args.custom_generate_function_path,
    }


def _normalize_entry(entry: Any, where: str) -> dict[str, Any]:
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: expected a mapping of dataset settings, got {type(entry).__name__} {entry!r}")
    out = {}
    for key, value in entry.items():
        key = ALIASES.get(str(key), str(key))
        if key not in FIELDS:
            raise ValueError(f"{where}: unknown key {key!r}; known keys: {', '.join(FIELDS)} "
                             f"(and {', '.join(ALIASES)} as an alias)")
        if key == "metadata_overrides" and value is not None and not isinstance(value, dict):
            raise ValueError(f"{where}: metadata_overrides must be a mapping of metadata key: value, got {value!r}")
        out[key] = value
    return out


def _dataset_entries(datasets: Any, path: str) -> list[dict[str, Any]]:
    if isinstance(datasets, dict):  # name -> settings
        return [{"name": name, **_normalize_entry(entry or {}, f"{path}: eval.datasets.{name}")}
                for name, entry in datasets.items()]
    if not isinstance(datasets, list) or not datasets:
        raise ValueError(f"--eval-config {path}: eval.datasets must be a non-empty list of {{name, path, ...}}")
    return [_normalize_entry(entry, f"--eval-config {path}: eval.datasets[{i}]") for i, entry in enumerate(datasets)]


def read_eval_config(path: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(defaults, dataset entries) of an eval config file, keys checked; ValueError naming the problem."""
    from omegaconf import OmegaConf

    try:
        loaded = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    except FileNotFoundError as exc:
        raise ValueError(f"--eval-config: file not found: {path}") from exc
    if not isinstance(loaded, dict) or not isinstance(loaded.get("eval"), dict):
        raise ValueError(f"--eval-config {path}: expected a top-level 'eval:' mapping with 'datasets:' "
                         "(see docs/rollout.md, Evaluation)")
    section = loaded["eval"]
    unknown = sorted(set(section) - {"defaults", "datasets"})
    if unknown:
        raise ValueError(f"--eval-config {path}: unknown key(s) {unknown} under 'eval:'; use 'defaults' and 'datasets'")
    defaults = _normalize_entry(section.get("defaults") or {}, f"--eval-config {path}: eval.defaults")
    for key in ("name", "path"):
        if key in defaults:
            raise ValueError(f"--eval-config {path}: eval.defaults cannot set {key!r}; set it per dataset")
    return defaults, _dataset_entries(section.get("datasets"), path)


def _check(dataset: EvalDataset, where: str) -> EvalDataset:
    if int(dataset.n_samples_per_eval_prompt) < 1:
        raise ValueError(f"{where} ({dataset.name}): n_samples_per_eval_prompt must be >= 1, "
                         f"got {dataset.n_samples_per_eval_prompt}")
    for key in ("max_response_len", "max_context_len", "max_prompt_len"):
        value = getattr(dataset, key)
        if value is not None and int(value) < 1:
            raise ValueError(f"{where} ({dataset.name}): {key} must be >= 1, got {value}")
    if dataset.rm_type is not None:  # the same names as --rm-type, checked before anything starts
        try:
            parse_rm_type(dataset.rm_type)
        except ValueError as exc:
            raise ValueError(f"{where} ({dataset.name}): rm_type: {exc}") from None
    return dataset


def eval_datasets(args: Any) -> list[EvalDataset]:
    """The run's eval sets, resolved (empty when neither --eval-config nor --eval-prompt-data is set).

    `args` is anything with the flat flag attributes (`RelaxConfig.args`)."""
    fallbacks = _fallbacks(args)
    if args.eval_config:
        defaults, entries = read_eval_config(args.eval_config)
        where = f"--eval-config {args.eval_config}"
    else:
        pairs = list(args.eval_prompt_data or [])
        if len(pairs) % 2:
            raise ValueError(f"--eval-prompt-data takes pairs 'name path [name path ...]', got {pairs}")
        defaults, entries = {}, [{"name": n, "path": p} for n, p in zip(pairs[::2], pairs[1::2])]
        where = "--eval-prompt-data"
    out = []
    for entry in entries:
        if not entry.get("name") or not entry.get("path"):
            raise ValueError(f"{where}: every dataset needs a 'name' and a 'path', got {entry}")
        merged = {**fallbacks, **{k: v for k, v in defaults.items() if v is not None},
                  **{k: v for k, v in entry.items() if v is not None}}
        merged["metadata_overrides"] = {**(defaults.get("metadata_overrides") or {}),
                                        **(entry.get("metadata_overrides") or {})}
        out.append(_check(EvalDataset(**merged), where))
    names = [d.name for d in out]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"{where}: duplicate dataset name(s) {duplicates}; names key the eval/<name>/ metrics")
    return out
