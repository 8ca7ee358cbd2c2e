"""Flags -> typed groups (`relax.config.parser`): defaults from the seeds, the flat `args`
namespace, `--custom-config-path` YAML coerced exactly like the command line, frozen groups,
`--help` without torch, and bad flags exiting 2 before anything starts."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time

import pytest

from relax.config import ConfigError, parse_config
from relax.config.schema import RelaxConfig


def test_seed_defaults_are_kept(base):
    cfg = parse_config(base)
    assert cfg.optim.lr == 1e-6 and cfg.optim.clip_grad == 1.0 and cfg.optim.seed == 1234
    assert cfg.algo.eps_clip == 0.2 and cfg.algo.kl_loss_type == "k1" and cfg.algo.sapo_tau_neg == 1.05
    assert cfg.data.input_key == "input" and cfg.data.metadata_key == "metadata" and cfg.data.rollout_seed == 42
    assert cfg.rollout.update_weight_buffer_size == 512 << 20
    assert cfg.batch.global_batch_size == 8  # rollout_batch_size * n_samples_per_prompt
    assert cfg.cluster.colocate and not cfg.cluster.fully_async


def test_flat_args_namespace_has_flag_names(base):
    args = parse_config(base + ["--sglang-mem-fraction-static", "0.8"]).args
    assert args.rollout_batch_size == 4 and args.hf_checkpoint and args.sglang_mem_fraction_static == "0.8"


def test_bytes_flag_accepts_suffixes(base):
    assert parse_config(base + ["--update-weight-buffer-size", "64MB"]).rollout.update_weight_buffer_size == 64 << 20


def test_custom_config_yaml_sets_extra_args_and_overrides_flags(base, tmp_path):
    yaml = tmp_path / "extra.yaml"
    yaml.write_text("max_turns: 5\njudge_url: http://x\nrollout_temperature: 0.7\n")
    cfg = parse_config(base + ["--custom-config-path", str(yaml)])
    assert cfg.args.max_turns == 5 and cfg.args.judge_url == "http://x"
    assert cfg.rollout.rollout_temperature == 0.7


# ---- YAML and the command line: one coercion ---------------------------------------------------


def write_yaml(tmp_path, text: str) -> str:
    path = tmp_path / "custom.yaml"
    path.write_text(text)
    return str(path)


def test_yaml_values_are_coerced_like_the_command_line(base, tmp_path):
    yaml = write_yaml(tmp_path, 'n_samples_per_prompt: "4"\nupdate_weight_buffer_size: 64MB\nlr: 1e-4\n'
                                'resource: {"actor": [1, 1], "rollout": [1, 2]}\nrollout_stop_token_ids: [3, "4"]\n'
                                "progress_bar: 'false'\nmy_plugin_key: 7\n")
    cfg = parse_config(base + ["--custom-config-path", yaml])
    assert cfg.rollout.n_samples_per_prompt == 4 and cfg.rollout.update_weight_buffer_size == 64 << 20
    assert cfg.optim.lr == 1e-4 and cfg.cluster.resource["rollout"] == [1, 2]
    assert cfg.rollout.rollout_stop_token_ids == [3, 4] and cfg.logging.progress_bar is False
    assert cfg.args.my_plugin_key == 7 and cfg.custom == {"my_plugin_key": 7}
    assert cfg.batch.global_batch_size == 4 * 4  # derived after the YAML, from its value


@pytest.mark.parametrize("yaml, needle", [
    ("advantage_estimator: grpoo\n", "advantage_estimator: invalid choice 'grpoo' (choose from grpo, gspo"),
    ("n_samples_per_prompt: four\n", "n_samples_per_prompt: expected an integer, got 'four'"),
    ("n_samples_per_prompt: 2.5\n", "n_samples_per_prompt: expected int, got float 2.5"),
    ("use_kl_loss: maybe\n", "use_kl_loss: expected true/false, got 'maybe'"),
    ("lr: [1]\n", "lr: expected float, got list [1]"),
    ("rollout_batch_size: null\n", None),  # None for a required flag: the validation error names it
])
def test_bad_yaml_values_name_the_key_the_file_and_what_was_expected(base, tmp_path, yaml, needle):
    path = write_yaml(tmp_path, yaml)
    with pytest.raises(ConfigError) as err:
        parse_config(base + ["--custom-config-path", path])
    if needle is None:
        assert "--rollout-batch-size is required" in str(err.value)
    else:
        assert needle in str(err.value) and path in str(err.value) and "fix the value in the file" in str(err.value)


def test_the_same_bad_value_on_the_command_line_gets_the_same_message(base, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_config(base + ["--advantage-estimator", "grpoo"])
    assert exit_info.value.code == 2
    assert "invalid choice 'grpoo' (choose from grpo, gspo" in capsys.readouterr().err


def test_yaml_that_is_not_a_mapping_or_not_yaml_is_named(base, tmp_path):
    for text, needle in (("- a\n- b\n", "expected a mapping"), ("a: [unclosed\n", "not valid YAML")):
        with pytest.raises(ConfigError, match=needle):
            parse_config(base + ["--custom-config-path", write_yaml(tmp_path, text)])


def test_config_groups_are_frozen_and_replace_returns_a_new_config():
    cfg = RelaxConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.rollout.n_samples_per_prompt = 3  # type: ignore[misc]
    other = cfg.replace(n_samples_per_prompt=3, lr=0.5)
    assert (other.rollout.n_samples_per_prompt, other.optim.lr) == (3, 0.5)
    assert (cfg.rollout.n_samples_per_prompt, cfg.optim.lr) == (1, 1e-6)
    with pytest.raises(AttributeError, match="no field 'nope'"):
        cfg.replace(nope=1)


def test_help_is_fast_and_does_not_import_torch():
    code = ("import sys, time; t=time.time(); from relax.entrypoints.train import main\n"
            "try: main(['--help'])\nexcept SystemExit: pass\n"
            "assert 'torch' not in sys.modules and 'ray' not in sys.modules, 'heavy import'\n"
            "print(time.time()-t)")
    start = time.time()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "--rollout-batch-size" in out.stdout
    assert time.time() - start < 10  # generous bound for a loaded CI box; the budget is checked in bench


def test_bad_flags_exit_2_before_anything_starts(tmp_path):
    out = subprocess.run([sys.executable, "-m", "relax.entrypoints.train", "--colocate", "--fully-async"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "relax-train: error:" in out.stderr


def test_configuration_docs_are_generated_from_the_schema():
    out = subprocess.run([sys.executable, "scripts/tools/gen_config_docs.py", "--check"], capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stdout
