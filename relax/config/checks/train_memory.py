"""The weight-copy and memory flags (`relax.config.train_memory`) and --check-weight-update-equal:
what they cannot be combined with. Runs after the backends are resolved (--rollout-backend auto
may have become sglang)."""

from __future__ import annotations

from relax.config.errors import ConfigError
from relax.config.schema import RelaxConfig


def check_train_memory(cfg: RelaxConfig) -> None:
    m = cfg.train_memory
    if m.train_memory_margin_bytes < 0:
        raise ConfigError(f"--train-memory-margin-bytes {m.train_memory_margin_bytes}: a number of bytes >= 0 "
                          "(0: no margin)")
    if m.keep_old_actor:
        _check_keep_old_actor(cfg)
    if cfg.debug.check_weight_update_equal and cfg.lora.lora_rank and cfg.cluster.rollout_backend == "sglang":
        raise ConfigError("--check-weight-update-equal with --lora-rank: SGLang engines load the adapter from files, "
                          "which its weights checker does not see; the check needs the hf engine "
                          "(--rollout-backend hf), or drop the flag")


def _check_keep_old_actor(cfg: RelaxConfig) -> None:
    if cfg.train_memory.disable_weights_backuper:
        raise ConfigError("--keep-old-actor keeps a host copy of the weights the engines were given, which "
                          "--disable-weights-backuper forbids (it saves that host memory): drop one of them")
    if cfg.algo.use_rollout_logprobs:
        raise ConfigError("--keep-old-actor with --use-rollout-logprobs: the engine's log-probs are the old policy "
                          "already, so no kept weights are scored with; drop one of them")
    if cfg.cluster.fully_async and cfg.rollout.partial_rollout:
        raise ConfigError("--keep-old-actor with --partial-rollout: a resumed sample's tokens come from several "
                          "weight versions, so no one kept copy generated it; drop one of them (--use-tis corrects "
                          "for the mismatch instead)")
