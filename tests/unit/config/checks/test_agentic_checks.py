"""Multi-turn flags (`relax.config.checks.agentic`): the seeds' YAML keys set them, the environment
module is checked before Ray starts, and episode flags without a multi-turn rollout are errors."""

from __future__ import annotations

import json

import pytest

from relax.config import ConfigError, parse_config


@pytest.fixture()
def env_module(tmp_path, monkeypatch, base):
    """An importable environment module `my_env` (build_env(sample=, args=)) and `bad_env` (no args=)."""
    (tmp_path / "my_env.py").write_text("def build_env(sample=None, args=None, **_):\n    return object()\n")
    (tmp_path / "bad_env.py").write_text("def build_env(sample):\n    return object()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    model = tmp_path / "model" / "config.json"
    model.write_text(json.dumps({**json.loads(model.read_text()), "max_position_embeddings": 512}))
    return "my_env"


def test_the_seeds_yaml_keys_set_the_multi_turn_flags(base, env_module, tmp_path):
    yaml = tmp_path / "agent.yaml"
    yaml.write_text(f"max_turns: 3\nrollout_interaction_env_path: {env_module}\nmy_tool_budget: 7\n")
    cfg = parse_config(base + ["--custom-config-path", str(yaml), "--log-multi-turn", "--env-timeout", "5"])
    assert (cfg.agentic.max_turns, cfg.agentic.rollout_interaction_env_path, cfg.agentic.env_timeout) == (3, "my_env",
                                                                                                        5.0)
    args = cfg.args
    assert (args.max_turns, args.rollout_interaction_env_path, args.my_tool_budget) == (3, "my_env", 7)
    # the episode needs the engines' context: the model's own limit unless set
    assert cfg.rollout.rollout_max_context_len == 512
    assert parse_config(base + ["--rollout-interaction-env-path", "my_env", "--rollout-max-context-len", "128"]
                        ).rollout.rollout_max_context_len == 128


@pytest.mark.parametrize("extra, needle", [
    (["--max-turns", "3"], "--max-turns shape(s) multi-turn rollouts"),
    (["--log-multi-turn"], "--log-multi-turn shape(s) multi-turn rollouts"),
    (["--rollout-interaction-env-path", "no_such_env_module"], "--rollout-interaction-env-path"),
    (["--rollout-interaction-env-path", "bad_env"], "build_env(sample=..., args=...)"),
    (["--rollout-interaction-env-path", "my_env", "--max-turns", "0"], "--max-turns"),
    (["--rollout-interaction-env-path", "my_env", "--turn-reward", "mean"], "--turn-reward"),
    (["--multi-turn-constrain-tool-calls", "true"], "--multi-turn-constrain-tool-calls shape(s) multi-turn"),
    (["--rollout-interaction-env-path", "my_env", "--multi-turn-constrain-tool-calls", "true",
      "--true-on-policy-mode"], "cannot reproduce under --true-on-policy-mode"),
])
def test_bad_multi_turn_flags_fail_naming_the_flag(base, env_module, extra, needle):
    with pytest.raises((ConfigError, SystemExit)) as err:
        parse_config(base + extra)
    if err.type is ConfigError:
        assert needle in str(err.value)


def test_a_custom_generate_function_takes_the_episode_flags_without_an_env(base, env_module):
    cfg = parse_config(base + ["--custom-generate-function-path", "relax.engine.agentic.generate",
                               "--max-turns", "2", "--multi-turn-stop", "</answer>", "--log-multi-turn"])
    assert cfg.agentic.max_turns == 2 and cfg.agentic.multi_turn_stop == ["</answer>"]
    assert cfg.rollout.rollout_max_context_len is None  # no environment configured here: nothing derived
