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
