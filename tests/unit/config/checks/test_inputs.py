"""The files a run's flags name (`relax.config.checks.inputs`): the model, the prompt data, the
multimodal keys."""

from __future__ import annotations

import pytest

from relax.config import ConfigError, parse_config


@pytest.mark.parametrize("extra, needle", [
    (["--save-interval", "2"], "--save"),
    (["--mm-processor-pool-size", "2"], "needs --multimodal-keys"),
    (["--mm-processor-pool-size", "-1"], "must be >= 0"),
    (["--use-audio-in-video"], "--use-audio-in-video needs videos"),
])
def test_bad_combinations_fail_naming_the_flag(base, extra, needle):
    with pytest.raises((ConfigError, SystemExit)) as err:
        parse_config(base + extra)
    if err.type is ConfigError:
        assert needle in str(err.value)


def test_missing_prompt_file_is_named(base):
    args = list(base)
    args[args.index("--prompt-data") + 1] = "/nonexistent/train.jsonl"
    with pytest.raises(ConfigError, match="--prompt-data: file not found: /nonexistent/train.jsonl"):
        parse_config(args)


# ---- --rollout-max-response-len is optional, as in the seeds ------------------------------------


def without_response_len(base: list[str]) -> list[str]:
    i = base.index("--rollout-max-response-len")
    return base[:i] + base[i + 2:]


def model_with_context(base: list[str], tmp_path, context: int | None) -> list[str]:
    import json

    model = tmp_path / "ctx_model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"num_hidden_layers": 2, "hidden_size": 64,
                                                   **({"max_position_embeddings": context} if context else {})}))
    args = without_response_len(base)
    args[args.index("--hf-checkpoint") + 1] = str(model)
    return args


@pytest.mark.parametrize("extra, expected", [
    ([], 4096),  # the model's context
    (["--rollout-max-context-len", "1024"], 1024),
    (["--rollout-max-context-len", "1024", "--rollout-max-prompt-len", "256"], 768),
    (["--rollout-max-prompt-len", "96"], 4000),
    (["--rollout-max-response-len", "8"], 8),  # given: kept
])
def test_the_response_length_defaults_to_the_context_left_after_the_prompt(base, tmp_path, extra, expected):
    cfg = parse_config(model_with_context(base, tmp_path, 4096) + extra)
    assert cfg.rollout.rollout_max_response_len == expected


def test_without_any_context_length_the_response_length_is_asked_for(base, tmp_path):
    with pytest.raises(ConfigError, match="--rollout-max-response-len is unset and the context length is unknown"):
        parse_config(model_with_context(base, tmp_path, None))
