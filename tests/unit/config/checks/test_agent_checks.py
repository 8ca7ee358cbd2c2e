"""`--agent-function-path` and the gateway flags (`relax.config.checks.agentic.check_agent`): the agent
function is imported and its signature checked before Ray starts, it excludes the other ways of
generating, and the plan names it."""

from __future__ import annotations

import json

import pytest

from relax.config import ConfigError, parse_config
from relax.config.plan import format_plan, resolve_plan

AGENTS = """
async def run_episode(base_url, api_key, sample, **kwargs):
    return None

def sync_episode(base_url, api_key, sample, **kwargs):
    return None

async def two_args(base_url, api_key):
    return None
"""


@pytest.fixture()
def agents(tmp_path, monkeypatch, base):
    """An importable module `my_agents` (one good agent, two wrong ones); the model knows its context."""
    (tmp_path / "my_agents.py").write_text(AGENTS)
    (tmp_path / "my_env.py").write_text("def build_env(sample=None, args=None, **_):\n    return object()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    model = tmp_path / "model" / "config.json"
    model.write_text(json.dumps({**json.loads(model.read_text()), "max_position_embeddings": 512}))
    return "my_agents.run_episode"


def test_an_agent_run_parses_and_its_plan_names_the_gateway(base, agents):
    cfg = parse_config(base + ["--agent-function-path", agents, "--agent-timeout", "30", "--log-multi-turn",
                               "--agent-tools-in-prompt", "false"])
    assert (cfg.agentic.agent_function_path, cfg.agentic.agent_timeout) == (agents, 30.0)
    assert cfg.agentic.agent_tools_in_prompt is False
    assert cfg.rollout.rollout_max_context_len == 512  # the gateway knows when a conversation no longer fits
    text = format_plan(resolve_plan(cfg, gpus=1), cfg)
    assert "generation: black-box agent my_agents.run_episode via the gateway on 127.0.0.1, at most 30 s" in text
    assert "trajectories -> <outputs>/multi_turn/" in text


@pytest.mark.parametrize("extra, needle", [
    (["--agent-function-path", "my_agents.no_such"], "--agent-function-path: module 'my_agents' has no attribute"),
    (["--agent-function-path", "no_such_module.run_episode"], "--agent-function-path"),
    (["--agent-function-path", "my_agents.sync_episode"], "is not an async function; expected async def "
                                                          "run_episode(base_url, api_key, sample, **kwargs)"),
    (["--agent-function-path", "my_agents.two_args"], "cannot be called as async def run_episode"),
    (["--agent-function-path", "my_agents.run_episode", "--custom-generate-function-path",
      "relax.engine.agentic.generate"], "--agent-function-path and --custom-generate-function-path"),
    (["--agent-function-path", "my_agents.run_episode", "--rollout-interaction-env-path", "my_env"],
     "--agent-function-path and --rollout-interaction-env-path"),
    (["--agent-function-path", "my_agents.run_episode", "--max-turns", "3"], "--max-turns shape(s) the built-in"),
    (["--agent-timeout", "5"], "--agent-timeout configure(s) the black-box agent gateway"),
    (["--agent-gateway-host", "0.0.0.0"], "--agent-gateway-host configure(s)"),
    (["--agent-tools-in-prompt", "false"], "--agent-tools-in-prompt configure(s)"),
    (["--agent-function-path", "my_agents.run_episode", "--agent-timeout", "0"], "--agent-timeout"),
    (["--agent-function-path", "my_agents.run_episode", "--agent-segments", "all", "--advantage-estimator",
      "reinforce_plus_plus"], "--agent-segments all trains every segment of an episode on the episode's one advantage"),
    (["--agent-function-path", "my_agents.run_episode", "--agent-segments", "all", "--kl-coef", "0.1"],
     "and --kl-coef 0 (got grpo, --kl-coef 0.1)"),
    (["--agent-segments", "last"], "--agent-segments last says which segments of an episode train"),
])
def test_bad_agent_flags_fail_naming_the_flag(base, agents, extra, needle):
    with pytest.raises(ConfigError) as err:
        parse_config(base + extra)
    assert needle in str(err.value)


def test_agent_segments_decide_which_rows_train_and_what_advantages_read(base, agents):
    from relax.config.role_plans import advantage_inputs, trains_prior_segments
    from relax.config.roles import Role

    agent = base + ["--agent-function-path", agents]
    auto = parse_config(agent)
    assert trains_prior_segments(auto) and {"episode_indices", "episode_rows"} <= set(advantage_inputs(auto))
    assert "episode_indices" in resolve_plan(auto, gpus=1).role(Role.ACTOR).reads  # colocate: the Actor computes them
    assert not trains_prior_segments(parse_config(agent + ["--advantage-estimator", "reinforce_plus_plus"]))
    assert not trains_prior_segments(parse_config(agent + ["--agent-segments", "last"]))
    assert not trains_prior_segments(parse_config(base))  # nothing makes segments: the columns stay unread
    assert "episode_indices" not in advantage_inputs(parse_config(base))
