"""Numeric flags in their ranges: a negative `--lr` or a `--gamma` above 1 fails before Ray
starts, with the range and what the number means, not as a NaN mid-run.

`RANGES` lists each flag once with its bounds; a flag whose meaning depends on another flag
(e.g. `--partial-rollout-max-aborted-count`) is checked where that combination is.
"""

from __future__ import annotations

from relax.config.errors import ConfigError
from relax.config.fields import flag_for
from relax.config.schema import FIELD_GROUP, RelaxConfig


# Numeric flags and the range a value must lie in: (low, high, what it means), bounds inclusive
# unless marked open by a tuple `(bound, "open")`; None: unbounded. Unset (None) values pass.
RANGES: dict[str, tuple[object, object, str]] = {
    "lr": ((0, "open"), None, "a learning rate"), "min_lr": (0, None, "a learning rate"),
    "critic_lr": ((0, "open"), None, "a learning rate"), "weight_decay": (0, None, "a decay factor"),
    "adam_beta1": (0, (1, "open"), "a moment decay"), "adam_beta2": (0, (1, "open"), "a moment decay"),
    "adam_eps": ((0, "open"), None, "a denominator epsilon"), "clip_grad": (0, None, "a gradient norm (0 = off)"),
    "lr_warmup_iters": (0, None, "a step count"), "lr_decay_iters": (1, None, "a step count"),
    "eps_clip": ((0, "open"), None, "a ratio clip"), "eps_clip_high": ((0, "open"), None, "a ratio clip"),
    "kl_coef": (0, None, "a coefficient"), "kl_loss_coef": (0, None, "a coefficient"),
    "gamma": (0, 1, "a discount"), "lambd": (0, 1, "a GAE lambda"), "tis_clip": ((0, "open"), None, "a clip"),
    "tis_clip_low": (0, None, "a clip"), "rollout_temperature": (0, None, "a temperature"),
    "eval_temperature": (0, None, "a temperature"), "rollout_top_p": ((0, "open"), 1, "a probability mass"),
    "eval_top_p": ((0, "open"), 1, "a probability mass"), "num_rollout": (1, None, "a step count"),
    "num_epoch": (1, None, "an epoch count"), "rollout_batch_size": (1, None, "a prompt count"),
    "global_batch_size": (1, None, "a sample count"), "rollout_max_response_len": (1, None, "a token count"),
    "eval_max_response_len": (1, None, "a token count"), "save_interval": (1, None, "a step interval"),
    "eval_interval": (1, None, "a step interval"), "max_actor_ckpt_to_keep": (1, None, "a checkpoint count"),
    "n_samples_per_eval_prompt": (1, None, "a sample count"), "reward_timeout": ((0, "open"), None, "seconds"),
    "http_timeout": ((0, "open"), None, "seconds"), "weight_sync_timeout": ((0, "open"), None, "seconds"),
    "engine_startup_timeout": ((0, "open"), None, "seconds"), "update_weight_buffer_size": (1, None, "bytes"),
    "reward_num_workers": (1, None, "a process count"), "reward_max_concurrency": (1, None, "a call count"),
    "engine_threads": (0, None, "a thread count, 0 = split the cores"),
    "num_data_storage_units": (1, None, "a unit count"),
    "distributed_timeout_minutes": (1, None, "minutes"),
    "make_vocab_size_divisible_by": (1, None, "a row multiple"),
    "max_turns": (1, None, "a turn count"), "env_timeout": ((0, "open"), None, "seconds"),
    "multi_turn_max_tokens": (1, None, "a token count"), "agent_timeout": ((0, "open"), None, "seconds"),
}


def _bound(bound: object) -> tuple[float | None, bool]:
    return (bound[0], True) if isinstance(bound, tuple) else (bound, False)  # (value, open)


def check_ranges(cfg: RelaxConfig) -> None:
    """Every numeric flag of RANGES lies in its range (a negative --lr fails here, not mid-run)."""
    for name, (low, high, meaning) in RANGES.items():
        value = getattr(getattr(cfg, FIELD_GROUP[name]), name)
        if value is None:
            continue
        (lo, lo_open), (hi, hi_open) = _bound(low), _bound(high)
        too_low = lo is not None and (value <= lo if lo_open else value < lo)
        too_high = hi is not None and (value >= hi if hi_open else value > hi)
        if too_low or too_high:
            lower = "" if lo is None else f"{'>' if lo_open else '>='} {lo}"
            upper = "" if hi is None else f"{'<' if hi_open else '<='} {hi}"
            allowed = " and ".join(x for x in (lower, upper) if x)
            raise ConfigError(f"{flag_for(name)} must be {allowed} ({meaning}), got {value}")
