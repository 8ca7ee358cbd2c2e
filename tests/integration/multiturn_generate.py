"""The plugin run's generate function: the built-in multi-turn rollout with the environment of
multiturn_env.py, in the seeds' copied-rollout.py form (DEFAULT_ENV_MODULE). Model turn, tool
observation (loss mask 0, log-prob 0, through the chat template's delimiters), model turn.

The run's random-init model never says <|im_end|> within --rollout-max-response-len 4, and a turn
cut by its length ends an episode; so every token id >= 10 ends a turn here (turns of a token or
two, as a trained model's end on <|im_end|>), and every episode has its two turns."""

from relax.engine.agentic import multi_turn_generate
from relax.engine.rollout.sglang_rollout import GenerateState

DEFAULT_ENV_MODULE = "tests.integration.multiturn_env"


async def generate(args, sample, sampling_params, evaluation=False):
    params = dict(sampling_params, stop_token_ids=list(range(10, len(GenerateState(args).tokenizer))))
    return await multi_turn_generate(args, sample, params, evaluation, env_path=DEFAULT_ENV_MODULE)
