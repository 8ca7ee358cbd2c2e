"""A verl tool recipe ported to Relax by the verl migration guide, step by step (test_verl_migration.py).

verl_tool.py is the "before": a verl `BaseTool` (create / execute / calc_reward / release, an
OpenAI function schema) written as verl writes them, with no verl import. The rest is the "after",
as the guide lays it out: base_env.py (copied from examples/deepeyes), env_gsm8k.py (the tool as a
`BaseInteractionEnv` + `build_env`), reward_gsm8k.py, rollout.py (copied from examples/deepeyes,
DEFAULT_ENV_MODULE changed) and gsm8k_config.yaml (max_turns, rollout_interaction_env_path).
"""
