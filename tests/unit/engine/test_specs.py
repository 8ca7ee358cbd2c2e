"""The rollout's per-request settings from the run's flags (`relax.engine.specs`), as the engine
reads them."""

from __future__ import annotations

from relax.backends.hf.sampling import parse_sampling_params
from relax.config.schema import RelaxConfig
from relax.engine.specs import RolloutSpec


def engine_sampling(cfg: RelaxConfig):
    """The sampling settings the hf engine parses from a training rollout's request."""
    return parse_sampling_params(RolloutSpec.from_config(cfg).sampling.params())


def test_rollout_skip_special_tokens_reaches_the_engine_s_decoding():
    assert not engine_sampling(RelaxConfig()).skip_special_tokens  # the engine's own default (True) is overridden
    assert engine_sampling(RelaxConfig().replace(rollout_skip_special_tokens=True)).skip_special_tokens
