"""Flags -> typed groups, defaults from the seeds, and errors that name the flags."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from relax.config import ConfigError, parse_config


@pytest.fixture()
def base(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"num_hidden_layers": 2, "hidden_size": 64, "head_dim": 16}))
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "1+1", "label": "2"}\n')
    return ["--hf-checkpoint", str(model), "--prompt-data", str(data), "--rollout-batch-size", "4",
            "--n-samples-per-prompt", "2", "--num-rollout", "3", "--rollout-max-response-len", "8"]


def test_seed_defaults_are_kept(base):
    cfg = parse_config(base)
    assert cfg.optim.lr == 1e-6 and cfg.optim.clip_grad == 1.0 and cfg.optim.seed == 1234
    assert cfg.algo.eps_clip == 0.2 and cfg.algo.kl_loss_type == "k1" and cfg.algo.sapo_tau_neg == 1.05
    assert cfg.data.input_key == "input" and cfg.data.metadata_key == "metadata" and cfg.data.rollout_seed == 42
    assert cfg.rollout.update_weight_buffer_size == 512 << 20
    assert cfg.batch.global_batch_size == 8  # rollout_batch_size * n_samples_per_prompt
    assert cfg.cluster.colocate and not cfg.cluster.fully_async


def test_auto_backends_resolve_to_cpu_backends(base):
    cfg = parse_config(base)
    assert (cfg.cluster.train_backend, cfg.cluster.rollout_backend) == ("fsdp", "hf")


def test_flat_args_namespace_has_flag_names(base):
    args = parse_config(base + ["--sglang-mem-fraction-static", "0.8"]).args
    assert args.rollout_batch_size == 4 and args.hf_checkpoint and args.sglang_mem_fraction_static == "0.8"


def test_bytes_flag_accepts_suffixes(base):
    assert parse_config(base + ["--update-weight-buffer-size", "64MB"]).rollout.update_weight_buffer_size == 64 << 20


@pytest.mark.parametrize("extra, needle", [
    (["--ref-actor-config", '{"tensor_model_parallel_size": 2}'], "unknown key(s) ['tensor_model_parallel_size']"),
    (["--ref-actor-config", '{"threads": 0}'], "threads must be an integer >= 1"),
    (["--colocate", "--fully-async"], "--fully-async"),
    (["--global-batch-size", "3"], "--global-batch-size 3 must divide"),
    (["--kl-coef", "0.1", "--use-kl-loss", "--kl-loss-coef", "0.1"], "--kl-coef"),
    (["--kl-loss-coef", "0.1"], "--use-kl-loss"),
    (["--eps-clip-c", "0.5"], "--eps-clip-c"),
    (["--use-dynamic-batch-size"], "--max-tokens-per-gpu"),
    (["--resource", '{"actor": [1, 1]}'], "rollout"),
    (["--resource", '{"actor": [1, 1], "rolout": [1, 1]}'], "unknown role 'rolout'"),
    (["--resource", "{bad json"], "JSON"),
    (["--save-interval", "2"], "--save"),
    (["--num-layers", "4"], "--num-layers 4 contradicts"),
    (["--some-megatron-flag"], "--train-backend megatron"),
    (["--custom-rm-path", "no_such_module.fn"], "--custom-rm-path"),
    (["--custom-rm-path", "json.dumps"], "reward_func(args, sample"),
    (["--partial-rollout"], "--partial-rollout resumes requests that a weight update aborts"),
    (["--fully-async", "--mask-offpolicy-in-partial-rollout"], "only applies with --partial-rollout"),
    (["--fully-async", "--partial-rollout-max-aborted-count", "2"], "only applies with --partial-rollout"),
    (["--fully-async", "--partial-rollout", "--partial-rollout-max-aborted-count", "-1"], "must be >= 0"),
    (["--recompute-granularity", "selective"], "use --recompute-granularity full"),
    (["--recompute-method", "block"], "need --recompute-granularity full"),
    (["--mm-processor-pool-size", "2"], "needs --multimodal-keys"),
    (["--mm-processor-pool-size", "-1"], "must be >= 0"),
    (["--use-audio-in-video"], "--use-audio-in-video needs videos"),
])
def test_bad_combinations_fail_naming_the_flag(base, extra, needle):
    with pytest.raises((ConfigError, SystemExit)) as err:
        parse_config(base + extra)
    if err.type is ConfigError:
        assert needle in str(err.value)


def test_partial_rollout_flags_are_accepted_in_fully_async_mode(base):
    cfg = parse_config(base + ["--fully-async", "--max-staleness", "1", "--partial-rollout",
                               "--partial-rollout-max-aborted-count", "2", "--mask-offpolicy-in-partial-rollout"])
    assert cfg.rollout.partial_rollout and cfg.rollout.partial_rollout_max_aborted_count == 2
    assert cfg.args.mask_offpolicy_in_partial_rollout


def test_missing_prompt_file_is_named(base):
    args = list(base)
    args[args.index("--prompt-data") + 1] = "/nonexistent/train.jsonl"
    with pytest.raises(ConfigError, match="--prompt-data: file not found: /nonexistent/train.jsonl"):
        parse_config(args)


def test_custom_config_yaml_sets_extra_args_and_overrides_flags(base, tmp_path):
    yaml = tmp_path / "extra.yaml"
    yaml.write_text("max_turns: 5\njudge_url: http://x\nrollout_temperature: 0.7\n")
    cfg = parse_config(base + ["--custom-config-path", str(yaml)])
    assert cfg.args.max_turns == 5 and cfg.args.judge_url == "http://x"
    assert cfg.rollout.rollout_temperature == 0.7


def test_num_steps_per_rollout_sets_global_batch(base):
    assert parse_config(base + ["--num-steps-per-rollout", "2"]).batch.global_batch_size == 4


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


def test_recompute_flags_reach_the_fsdp_ranks(base):
    from relax.components.training import recompute_layers

    assert recompute_layers(parse_config(base)) is None
    assert recompute_layers(parse_config(base + ["--recompute-granularity", "full"])) == -1
    assert recompute_layers(parse_config(base + ["--recompute-granularity", "full", "--recompute-method", "uniform",
                                                 "--recompute-num-layers", "1"])) == -1
    assert recompute_layers(parse_config(base + ["--recompute-granularity", "full", "--recompute-method", "block",
                                                 "--recompute-num-layers", "3"])) == 3


@pytest.mark.parametrize("extra, needle", [
    (["--context-parallel-size", "2", "--pipeline-model-parallel-size", "2"],
     "--context-parallel-size 2 with --pipeline-model-parallel-size 2"),
    (["--advantage-estimator", "ppo", "--pipeline-model-parallel-size", "2"], "the critic (PPO) does not run with"),
    (["--overlap-grad-reduce"], "--overlap-grad-reduce True"),
    (["--megatron-to-hf-mode", "bridge"], "bridge conversion"),
    (["--attention-dropout", "0.1"], "RL training runs without dropout"),
    (["--num-layers", "4"], "--num-layers 4 contradicts"),
    (["--some-megatron-flag"], "the megatron backend does not read them"),
    (["--multimodal-keys", '{"image": "image"}'],
     "the megatron backend trains the vision-language models qwen2_5_vl, qwen3_vl"),
])
def test_megatron_backend_rejects_what_it_does_not_build(base, extra, needle):
    pytest.importorskip("megatron.core")
    with pytest.raises(ConfigError) as err:
        parse_config(base + ["--train-backend", "megatron"] + extra)
    assert needle in str(err.value)


def test_megatron_backend_acts_on_its_flags(base):
    pytest.importorskip("megatron.core")
    from relax.components.training import model_parallel_spec
    from relax.config.validate import ignored_flag_notes

    cfg = parse_config(base + ["--train-backend", "megatron", "--tensor-model-parallel-size", "2",
                               "--pipeline-model-parallel-size", "2", "--expert-model-parallel-size", "1",
                               "--recompute-granularity", "selective"])
    assert cfg.cluster.train_backend == "megatron"
    assert ignored_flag_notes(cfg) == []  # each acts or is an error
    spec = model_parallel_spec(cfg)
    assert (spec.tp, spec.pp, spec.ep, spec.recompute_granularity) == (2, 2, 1, "selective")


def test_megatron_backend_runs_fully_async(base):
    pytest.importorskip("megatron.core")
    cfg = parse_config(base + ["--train-backend", "megatron", "--fully-async", "--max-staleness", "1"])
    assert cfg.cluster.fully_async and cfg.cluster.train_backend == "megatron"


def test_megatron_only_flags_are_reported_as_ignored_under_fsdp(base):
    from relax.config.validate import ignored_flag_notes

    cfg = parse_config(base + ["--tensor-model-parallel-size", "2", "--optimizer-cpu-offload"])
    (note,) = ignored_flag_notes(cfg)
    assert note.startswith("--tensor-model-parallel-size --optimizer-cpu-offload: accepted and ignored: applies to "
                           "the megatron training backend")
    assert ignored_flag_notes(parse_config(base)) == []


@pytest.mark.parametrize("flag", [["--keep-old-actor"], ["--update-weights-interval", "2"]])
def test_unimplemented_flags_fail_instead_of_being_ignored(base, flag):
    with pytest.raises(ConfigError, match="not implemented"):
        parse_config(base + flag)


def test_true_on_policy_mode_is_accepted_with_cpu_backends(base):
    cfg = parse_config(base + ["--true-on-policy-mode", "--fully-async", "--max-staleness", "1"])
    assert cfg.cluster.true_on_policy_mode
    assert (cfg.cluster.train_backend, cfg.cluster.rollout_backend) == ("fsdp", "hf")


@pytest.mark.parametrize("extra, needle", [
    (["--train-backend", "megatron"], "--sglang-enable-deterministic-inference"),
    (["--rollout-backend", "sglang"], "--sglang-rl-on-policy-target fsdp"),
    (["--bf16"], "drop --bf16"),
    (["--engine-threads", "0"], "--engine-threads"),
    (["--ref-actor-config", '{"threads": 2}'], "--ref-actor-config threads=2"),
])
def test_true_on_policy_mode_rejects_mismatched_numerics(base, extra, needle):
    with pytest.raises(ConfigError, match="--true-on-policy-mode") as err:
        parse_config(base + ["--true-on-policy-mode"] + extra)
    assert needle in str(err.value)


def test_ppo_is_accepted_and_critic_flags_parse(base):
    cfg = parse_config(base + ["--advantage-estimator", "ppo", "--critic-lr", "1e-5", "--num-critic-only-steps", "2",
                               "--resource", '{"actor": [1, 1], "rollout": [1, 1], "critic": [1, 2]}'])
    assert cfg.algo.critic_lr == 1e-5 and cfg.algo.num_critic_only_steps == 2
    assert cfg.cluster.resource["critic"] == [1, 2]


@pytest.mark.parametrize("extra, needle", [
    (["--num-critic-only-steps", "2"], "--num-critic-only-steps configure the critic"),
    (["--critic-lr", "1e-5"], "--advantage-estimator ppo"),
    (["--resource", '{"actor": [1, 1], "rollout": [1, 1], "critic": [1, 1]}'], "--resource critic"),
    (["--advantage-estimator", "ppo", "--critic-save", "/tmp/c"], "add --save DIR"),
    (["--advantage-estimator", "ppo", "--resource", '{"actor": [1, 1], "rollout": [1, 1], "critic": [1, 3]}'],
     "divisible by the critic's 3"),
    (["--advantage-estimator", "on_policy_distillation"], "needs --use-opd"),
    (["--use-opd"], "--use-opd needs --opd-type"),
    (["--opd-type", "megatron"], "need --use-opd"),
    (["--use-opd", "--opd-type", "megatron"], "--opd-teacher-load"),
    (["--use-opd", "--opd-type", "sglang"], "--rm-url"),
    (["--use-opd", "--opd-type", "sglang", "--opd-teacher-load", "/nonexistent"], "no config.json"),
    (["--use-opd", "--opd-type", "sglang", "--opd-kl-coef", "0", "--rm-url", "http://x"], "--opd-kl-coef"),
    (["--ref-update-interval", "2"], "--use-kl-loss or --kl-coef"),
    (["--use-kl-loss", "--ref-update-interval", "0"], ">= 1"),
])
def test_algorithm_suite_flag_errors_name_the_fix(base, extra, needle):
    with pytest.raises(ConfigError, match=None) as err:
        parse_config(base + extra)
    assert needle in str(err.value)


def test_opd_teacher_as_external_engine_or_checkpoint(base, tmp_path):
    cfg = parse_config(base + ["--use-opd", "--opd-type", "sglang", "--rm-url", "http://127.0.0.1:1/generate"])
    assert cfg.algo.use_opd and cfg.algo.opd_teacher_load is None
    teacher = tmp_path / "model"  # the base fixture's model dir has a config.json
    cfg = parse_config(base + ["--use-opd", "--opd-type", "megatron", "--opd-teacher-load", str(teacher),
                               "--advantage-estimator", "on_policy_distillation"])
    assert cfg.algo.opd_type == "megatron"


@pytest.mark.parametrize("extra, needle", [
    (["--debug-rollout-only"], "drop --fully-async"),
    (["--max-staleness", "-1"], "--max-staleness must be >= 0"),
    (["--num-iters-per-train-update", "0"], "--num-iters-per-train-update must be >= 1"),
])
def test_fully_async_rejects_what_it_does_not_combine_with(base, extra, needle):
    with pytest.raises(ConfigError) as err:
        parse_config(base + ["--fully-async"] + extra)
    assert needle in str(err.value)


def test_fully_async_accepts_ref_update_interval_and_opd(base):
    cfg = parse_config(base + ["--fully-async", "--use-kl-loss", "--ref-update-interval", "2"])
    assert cfg.algo.ref_update_interval == 2
    cfg = parse_config(base + ["--fully-async", "--use-opd", "--opd-type", "sglang", "--rm-url", "http://x"])
    assert cfg.algo.use_opd and cfg.cluster.fully_async


def test_fully_async_accepts_ppo_with_a_critic(base):
    cfg = parse_config(base + ["--fully-async", "--max-staleness", "1", "--advantage-estimator", "ppo"])
    assert cfg.cluster.fully_async and not cfg.cluster.colocate


def test_auto_train_backend_picks_megatron_with_a_gpu_unless_the_run_needs_fsdp(base, monkeypatch):
    pytest.importorskip("megatron.core")
    from relax.config import plan, validate

    monkeypatch.setattr(plan, "local_gpus", lambda: 1)
    monkeypatch.setattr(validate, "sglang_installed", lambda: False)
    assert parse_config(base).cluster.train_backend == "megatron"
    assert parse_config(base + ["--fully-async"]).cluster.train_backend == "megatron"
    assert parse_config(base + ["--advantage-estimator", "ppo"]).cluster.train_backend == "megatron"
    ppo_pp = ["--advantage-estimator", "ppo", "--pipeline-model-parallel-size", "2"]
    assert parse_config(base + ppo_pp).cluster.train_backend == "fsdp"
