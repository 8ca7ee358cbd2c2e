"""The LoRA flags (`relax.config.lora`): ranges, and what a LoRA run cannot be combined with. Runs
after the backends are resolved (`--rollout-backend auto` may have become sglang; `--train-backend
auto` picks fsdp for LoRA, and an explicit megatron fails in `checks.megatron`)."""

from __future__ import annotations

from relax.config.errors import ConfigError
from relax.config.lora import check_lora_values, lora_conflicts
from relax.config.schema import RelaxConfig


def check_lora(cfg: RelaxConfig) -> None:
    try:
        check_lora_values(cfg.lora)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if cfg.lora.lora_rank == 0:
        return
    conflicts = lora_conflicts(cfg)
    if conflicts:
        raise ConfigError(f"--lora-rank {cfg.lora.lora_rank}: {conflicts[0]}")
