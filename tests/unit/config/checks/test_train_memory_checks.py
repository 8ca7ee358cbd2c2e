"""What the weight-copy and memory flags and --check-weight-update-equal cannot be combined with
(`relax.config.checks.train_memory`): each is a ConfigError naming both flags."""

from __future__ import annotations

import pytest

from relax.config import ConfigError, parse_config
from relax.config.checks.train_memory import check_train_memory
from relax.config.schema import RelaxConfig


@pytest.mark.parametrize("flags, needle", [
    (["--keep-old-actor", "--update-weights-interval", "2", "--disable-weights-backuper"],
     "--keep-old-actor keeps a host copy .* which --disable-weights-backuper forbids"),
    (["--keep-old-actor", "--disable-weights-backuper"], "--disable-weights-backuper forbids"),
    (["--keep-old-actor", "--use-rollout-logprobs"], "the engine's log-probs are the old policy already"),
    (["--keep-old-actor", "--fully-async", "--max-staleness", "1", "--partial-rollout"],
     "a resumed sample's tokens come from several weight versions"),
    (["--train-memory-margin-bytes", "-1"], "a number of bytes >= 0"),
])
def test_combinations_that_cannot_act_are_errors(base, flags, needle):
    with pytest.raises(ConfigError, match=needle):
        parse_config(base + flags)


def test_the_flags_act_together_where_they_can(base):
    cfg = parse_config(base + ["--keep-old-actor", "--update-weights-interval", "2", "--check-weight-update-equal",
                               "--train-memory-margin-bytes", "0"])
    assert cfg.train_memory.keep_old_actor and cfg.debug.check_weight_update_equal
    assert parse_config(base + ["--disable-weights-backuper"]).train_memory.disable_weights_backuper


def test_the_weight_check_of_a_lora_run_needs_the_hf_engine():
    lora = RelaxConfig().replace(check_weight_update_equal=True, lora_rank=4, rollout_backend="sglang")
    with pytest.raises(ConfigError, match="SGLang engines load the adapter from files, .* needs the hf engine"):
        check_train_memory(lora)  # (a CPU machine cannot resolve sglang: the check itself is called)
    check_train_memory(lora.replace(rollout_backend="hf"))
