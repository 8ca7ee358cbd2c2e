"""The example's multi-turn rollout: Relax's built-in one (relax.engine.agentic) with this example's
environment. `--custom-generate-function-path examples.deepeyes.rollout.generate`.

The verl migration guide's "Migrate rollout" step copies this file into a new example and changes
DEFAULT_ENV_MODULE; `rollout_interaction_env_path` in the --custom-config-path YAML (or the flag)
overrides it. Turn control (`max_turns`, budgets, stop strings) comes from the same config.
"""

from relax.engine.agentic import multi_turn_generate

DEFAULT_ENV_MODULE = "verl_gsm8k.env_gsm8k"


async def generate(args, sample, sampling_params, evaluation=False):
    return await multi_turn_generate(args, sample, sampling_params, evaluation, env_path=DEFAULT_ENV_MODULE)
