"""The verl migration guide's tool-environment path, as written (../shared seeds: "Migrate tool
environment", "Migrate rollout"): a verl BaseTool-style gsm8k tool ported to a `BaseInteractionEnv`
with `build_env`, `base_env.py` and `rollout.py` copied from examples/deepeyes (DEFAULT_ENV_MODULE
changed), a YAML with `max_turns` and `rollout_interaction_env_path`; the recipe's flags parse and
its rollout runs against an engine. The recipe is in verl_gsm8k/."""

from __future__ import annotations

import json
from argparse import Namespace
from pathlib import Path

from agentic_helpers import run

from relax.config import parse_config
from relax.engine.rollout import sglang_rollout
from relax.engine.rollout.generator import Generator, StepState
from relax.engine.rollout.prompt_encoding import PromptEncoder
from relax.engine.specs import RewardSpec, RolloutSpec
from relax.types import Sample

HERE = Path(__file__).parent
EXAMPLE = HERE.parents[3] / "examples" / "deepeyes"


def test_the_copied_files_differ_from_the_example_only_where_the_guide_says():
    assert (HERE / "verl_gsm8k" / "base_env.py").read_text() == (EXAMPLE / "base_env.py").read_text()
    assert (HERE / "verl_gsm8k" / "rollout.py").read_text() == (EXAMPLE / "rollout.py").read_text().replace(
        '"examples.deepeyes.env_deepeyes"', '"verl_gsm8k.env_gsm8k"')


def test_the_ported_env_executes_the_verl_tool_per_tool_call():
    from verl_gsm8k import env_gsm8k

    async def episode():
        env = env_gsm8k.build_env(sample=Sample(label="72"), args=Namespace(max_turns=3))
        await env.reset()
        wrong = await env.step('<tool_call>\n{"name": "calc_gsm8k_reward", "arguments": {"answer": "70"}}\n'
                               '</tool_call>')
        right = await env.step('<tool_call>\n{"name": "calc_gsm8k_reward", "arguments": {"answer": "72"}}\n'
                               '</tool_call>')
        final = await env.step("The answer is 72.")
        live = dict(env_gsm8k.TOOL._instance_dict)
        await env.close()
        return wrong, right, final, live

    wrong, right, final, live = run(episode())
    assert wrong[0]["role"] == "tool" and "reward=0.0" in wrong[0]["obs_str"] and wrong[2]["reward"] == -0.05
    assert "reward=1.0" in right[0]["obs_str"] and right[2]["reward"] == 0.0 and right[1] is False
    assert final[1] is True and len(live) == 1 and env_gsm8k.TOOL._instance_dict == {}  # released at close


def test_the_recipe_parses_and_rolls_out_as_the_guide_configures_it(engine, text_model_dir, tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"prompt": [{"role": "user", "content": "what is 8 times 9"}], "label": "72"}) + "\n")
    cfg = parse_config([
        "--hf-checkpoint", text_model_dir, "--prompt-data", str(data), "--input-key", "prompt", "--label-key", "label",
        "--apply-chat-template", "--rollout-batch-size", "1", "--n-samples-per-prompt", "2", "--num-rollout", "1",
        "--rollout-max-response-len", "4", "--exp-dir", str(tmp_path / "run"),
        "--custom-generate-function-path", "verl_gsm8k.rollout.generate",
        "--custom-rm-path", "verl_gsm8k.reward_gsm8k.reward_func", "--reward-key", "score",
        "--custom-config-path", str(HERE / "verl_gsm8k" / "gsm8k_config.yaml")])
    assert cfg.agentic.max_turns == 3 and cfg.agentic.rollout_interaction_env_path == "verl_gsm8k.env_gsm8k"
    from relax.engine.rewards.executor import RewardExecutor

    args = cfg.args
    rewards = RewardExecutor(RewardSpec.from_config(cfg.reward), args)
    tokenizer = engine.engine.tokenizer
    gen = Generator(RolloutSpec.from_config(cfg), tokenizer=tokenizer, router_url=f"{engine.url}/generate",
                    rewards=rewards, plugin_args=args, encoder=PromptEncoder(tokenizer))
    sglang_rollout.bind(args, gen)
    group = [Sample(index=i, group_index=0, prompt=[{"role": "user", "content": "what is 8 times 9"}], label="72")
             for i in range(2)]
    try:
        done = run(gen.generate_group(StepState(), group))
    finally:
        rewards.close()
    from verl_gsm8k import env_gsm8k

    for s in done:
        assert s.metadata["termination"] in ("env_done", "max_turns", "token_budget") and s.metadata["turns"] >= 1
        assert isinstance(s.reward, dict) and "score" in s.reward
    assert env_gsm8k.TOOL._instance_dict == {}  # every episode's instance released
