"""--eval-config: the file format, the resolution order (dataset > defaults > --eval-* > rollout
flags), and start-up errors that name the key; plus the GenRM and context-length checks."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from relax.components.rollout import Rollout
from relax.config import ConfigError, parse_config
from relax.config.eval_config import eval_datasets
from relax.engine.specs import RolloutSpec


@pytest.fixture()
def base(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"num_hidden_layers": 2, "max_position_embeddings": 256}))
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "1+1", "label": "2"}\n')
    return ["--hf-checkpoint", str(model), "--prompt-data", str(data), "--rollout-batch-size", "4",
            "--n-samples-per-prompt", "2", "--num-rollout", "3", "--rollout-max-response-len", "8"]


def write(tmp_path, text, name="eval.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_dataset_values_win_over_defaults_then_eval_flags_then_rollout_flags(base, tmp_path):
    data = tmp_path / "train.jsonl"
    config = write(tmp_path, f"""
eval:
  defaults:
    n_samples_per_eval_prompt: 4
    temperature: 0.6
    metadata_overrides: {{split: test, source: defaults}}
  datasets:
    - name: a
      path: {data}
      temperature: 0.2
      prompt_key: question
      rm_type: f1
      metadata_overrides: {{source: a}}
    - name: b
      path: {data}
""")
    cfg = parse_config(base + ["--eval-config", config, "--eval-top-p", "0.9", "--rollout-top-k", "5",
                               "--eval-max-response-len", "6", "--reward-key", "score"])
    a, b = eval_datasets(cfg.args)
    assert (a.name, a.temperature, a.n_samples_per_eval_prompt, a.input_key, a.rm_type) == \
        ("a", 0.2, 4, "question", "f1")
    assert a.metadata_overrides == {"split": "test", "source": "a"}
    assert (b.temperature, b.top_p, b.top_k, b.max_response_len, b.input_key) == (0.6, 0.9, 5, 6, "input")
    assert b.reward_key == "score" and b.rm_type is None and b.label_key is None


def test_eval_flags_fall_back_to_rollout_flags_and_eval_reward_key_wins(base, tmp_path):
    data = str(tmp_path / "train.jsonl")
    cfg = parse_config(base + ["--eval-prompt-data", "x", data, "--rollout-temperature", "0.3",
                               "--rollout-max-context-len", "64", "--reward-key", "score",
                               "--eval-reward-key", "acc", "--label-key", "label"])
    (x,) = eval_datasets(cfg.args)
    assert (x.temperature, x.max_response_len, x.max_context_len, x.reward_key, x.label_key) == (0.3, 8, 64, "acc",
                                                                                                  "label")


def test_eval_config_replaces_eval_prompt_data(base, tmp_path):
    data = tmp_path / "train.jsonl"
    config = write(tmp_path, f"eval:\n  datasets:\n    only: {{path: {data}}}\n")
    cfg = parse_config(base + ["--eval-config", config, "--eval-prompt-data", "other", str(data)])
    assert [d.name for d in eval_datasets(cfg.args)] == ["only"]


@pytest.mark.parametrize("body, needle", [
    ("eval:\n  datasets:\n    - {name: a, path: DATA, temprature: 0.1}\n", "unknown key 'temprature'"),
    ("eval:\n  datasets: []\n", "non-empty list"),
    ("datasets:\n  - {name: a, path: DATA}\n", "top-level 'eval:'"),
    ("eval:\n  datasets:\n    - {name: a, path: DATA}\n    - {name: a, path: DATA}\n", "duplicate dataset name"),
    ("eval:\n  datasets:\n    - {name: a, path: /no/such.jsonl}\n", "file not found"),
    ("eval:\n  datasets:\n    - {path: DATA}\n", "'name'"),
    ("eval:\n  datasets:\n    - {name: a, path: DATA, n_samples_per_eval_prompt: 0}\n", "n_samples_per_eval_prompt"),
    ("eval:\n  defaults: {path: DATA}\n  datasets:\n    - {name: a, path: DATA}\n", "cannot set 'path'"),
    ("eval:\n  datasets:\n    - {name: a, path: DATA, metadata_overrides: 3}\n", "metadata_overrides"),
    ("eval:\n  datasets:\n    - {name: a, path: DATA, custom_generate_function_path: no.such.fn}\n",
     "custom_generate_function_path"),
])
def test_bad_eval_config_fails_at_startup_naming_the_problem(base, tmp_path, body, needle):
    config = write(tmp_path, body.replace("DATA", str(tmp_path / "train.jsonl")))
    with pytest.raises(ConfigError, match=needle):
        parse_config(base + ["--eval-config", config])


def test_missing_eval_config_file_is_named(base, tmp_path):
    with pytest.raises(ConfigError, match="--eval-config: file not found"):
        parse_config(base + ["--eval-config", str(tmp_path / "nope.yaml")])


def test_eval_function_path_signature_is_checked(base):
    with pytest.raises(ConfigError, match="--eval-function-path"):
        parse_config(base + ["--eval-function-path", "relax.no_such_module.fn"])


@pytest.mark.parametrize("extra, needle", [
    (["--rollout-max-context-len", "512"], "exceeds the model's max_position_embeddings 256"),
    (["--eval-max-context-len", "1"], "--eval-max-context-len must be >= 2"),
])
def test_context_limits_must_fit_the_model(base, extra, needle):
    with pytest.raises(ConfigError, match=needle):
        parse_config(base + extra)


def test_context_flags_are_implemented(base):
    cfg = parse_config(base + ["--rollout-max-context-len", "128", "--eval-max-context-len", "64"])
    assert (cfg.rollout.rollout_max_context_len, cfg.eval.eval_max_context_len) == (128, 64)


@pytest.mark.parametrize("extra, needle", [
    (["--rm-type", "genrm"], "--rm-type genrm needs a judge model: set --genrm-model-path"),
    (["--genrm-model-path", "/no/such/dir"], "no config.json"),
    (["--genrm-model-path", "MODEL", "--genrm-num-gpus", "3", "--genrm-num-gpus-per-engine", "2"],
     "must be a positive multiple"),
    (["--genrm-model-path", "MODEL", "--genrm-sampling-config", '{"temp": 1}'], "unknown key.*'temp'"),
    (["--genrm-model-path", "MODEL", "--genrm-engine-config", "[1]"], "--genrm-engine-config must be a JSON object"),
])
def test_genrm_flags_are_checked_at_startup(base, tmp_path, extra, needle):
    extra = [str(tmp_path / "model") if x == "MODEL" else x for x in extra]
    with pytest.raises(ConfigError, match=needle):
        parse_config(base + extra)


def test_genrm_flags_parse(base, tmp_path):
    cfg = parse_config(base + ["--rm-type", "genrm", "--genrm-model-path", str(tmp_path / "model"),
                               "--genrm-num-gpus", "2", "--genrm-sampling-config", '{"max_response_len": 16}'])
    assert cfg.reward.genrm_sampling_config == {"max_response_len": 16} and cfg.reward.genrm_num_gpus == 2


def test_a_dataset_s_rm_type_is_checked_like_the_flag(base, tmp_path):
    data = tmp_path / "train.jsonl"
    config = write(tmp_path, f"eval:\n  datasets:\n    - name: a\n      path: {data}\n      rm_type: maths\n")
    with pytest.raises(ConfigError, match=r"\(a\): rm_type: unknown reward type 'maths'.*did you mean math\?"):
        parse_config(base + ["--eval-config", config])


def eval_sampling_params(cfg) -> dict:
    """The SGLang sampling params of the run's one eval set."""
    (dataset,) = eval_datasets(cfg.args)
    return RolloutSpec.from_config(cfg).for_eval(dataset, num_prompts=1).sampling.params()


def test_eval_top_k_and_eval_min_new_tokens_reach_the_eval_sampling_params(base, tmp_path):
    data = str(tmp_path / "train.jsonl")
    unset = eval_sampling_params(parse_config(base + ["--eval-prompt-data", "x", data, "--rollout-top-k", "5"]))
    assert unset["top_k"] == 5 and "min_new_tokens" not in unset  # --rollout-top-k; no minimum
    cfg = parse_config(base + ["--eval-prompt-data", "x", data, "--rollout-top-k", "5", "--eval-top-k", "7",
                               "--eval-min-new-tokens", "3"])
    params = eval_sampling_params(cfg)
    assert params["top_k"] == 7 and params["min_new_tokens"] == 3
    assert RolloutSpec.from_config(cfg).sampling.params()["top_k"] == 5  # training rollouts keep --rollout-top-k


class WordTokenizer:
    """One token per word."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(range(len(text.split())))


def load_eval_rows(cfg) -> list:
    """The eval set's prompts as the Rollout loads them (`Rollout._load_eval_sets`)."""
    rollout = SimpleNamespace(cfg=cfg, generator=SimpleNamespace(processor=None, pipelines=None))
    (_, samples), = Rollout._load_eval_sets(rollout, WordTokenizer()).values()
    return samples


def test_eval_input_label_and_tool_keys_pick_the_eval_rows_columns(base, tmp_path):
    data = tmp_path / "eval.jsonl"
    data.write_text(json.dumps({"input": "train-style", "question": "what is 2+2", "label": "x", "answer": "4",
                                "tools": [{"name": "a"}], "funcs": [{"name": "calc"}]}) + "\n")
    default, = load_eval_rows(parse_config(base + ["--eval-prompt-data", "x", str(data), "--label-key", "label"]))
    assert (default.prompt, default.label, default.metadata["tools"]) == ("train-style", "x", [{"name": "a"}])
    keyed, = load_eval_rows(parse_config(base + ["--eval-prompt-data", "x", str(data), "--label-key", "label",
                                                 "--eval-input-key", "question", "--eval-label-key", "answer",
                                                 "--eval-tool-key", "funcs"]))
    assert (keyed.prompt, keyed.label, keyed.metadata["tools"]) == ("what is 2+2", "4", [{"name": "calc"}])


def test_eval_max_prompt_len_drops_the_longer_eval_prompts(base, tmp_path):
    data = tmp_path / "eval.jsonl"
    data.write_text("".join(json.dumps({"input": text}) + "\n" for text in ("a b", "a b c d", "a")))
    every = load_eval_rows(parse_config(base + ["--eval-prompt-data", "x", str(data)]))
    assert [s.prompt for s in every] == ["a b", "a b c d", "a"]
    short = load_eval_rows(parse_config(base + ["--eval-prompt-data", "x", str(data), "--eval-max-prompt-len", "2"]))
    assert [s.prompt for s in short] == ["a b", "a"]  # 4 words > 2 tokens
