"""One Ray cluster for the whole integration session, and a tiny model + task built once.

The model is a random-init tiny Qwen3 with its own BPE tokenizer (no hub); the data are
prompts of the quickstart task. Everything lives in a session temp dir.
"""

from __future__ import annotations

import json
import os
import random

import pytest


@pytest.fixture(scope="session")
def ray_cluster():
    import ray
    from ray import serve
    from run_helpers import start_session_cluster

    from relax.distributed import transfer_queue as tq

    start_session_cluster(os.getcwd())
    yield
    tq.close_data_system()
    serve.shutdown()
    ray.shutdown()


@pytest.fixture(scope="session")
def tiny_setup(tmp_path_factory):
    from examples.tiny_math.task import make_row, sample_numbers, tokenizer_corpus
    from relax.utils.tiny_model import build_tiny_qwen3, save_tiny_model, train_chatml_tokenizer

    root = tmp_path_factory.mktemp("tiny")
    tokenizer = train_chatml_tokenizer(tokenizer_corpus(), vocab_size=300)
    save_tiny_model(build_tiny_qwen3(tokenizer), tokenizer, str(root / "model"))
    rng = random.Random(0)
    for name, n in (("train", 64), ("eval", 8)):
        with open(root / f"{name}.jsonl", "w") as f:
            for _ in range(n):
                f.write(json.dumps(make_row(sample_numbers(rng))) + "\n")
    return root


@pytest.fixture(scope="session")
def reference_run(ray_cluster, tiny_setup, tmp_path_factory):
    """One 4-step colocate GRPO run that several tests read: checkpoints every 2 steps and saved
    rollouts (a resumed run replays them), per-step details and training batches (debug dumps), a reference
    refreshed every 2 steps, and the colocate side of staleness 0 == colocate. Returns its
    directory (the run itself in `run/`)."""
    from run_helpers import reference_args, run_relax

    exp = tmp_path_factory.mktemp("reference_run")
    run_relax(reference_args(tiny_setup, exp / "run") + [
        "--save", str(exp / "ckpt"), "--save-interval", "2",
        "--save-debug-rollout-data", str(exp / "rollouts" / "step_{rollout_id}.pt"),
        "--dump-details", str(exp / "details"), "--save-debug-train-data", str(exp / "train_{rollout_id}.pt")])
    return exp


@pytest.fixture(scope="session")
def plugin_run(ray_cluster, tiny_setup, tmp_path_factory):
    """One colocate run through the plugins: a two-turn custom generate function (observation tokens
    masked), a dynamic-sampling filter over a reward that makes some groups constant, over-sampling,
    an eval with pass@k through the same generate function, a custom train-data conversion (the
    first response token masked), two passes over each step (--num-iters-per-train-update, PPO
    epochs in colocate mode), REINFORCE++ advantages; slime's logging hooks and --log-correct-samples
    (test_rollout_logs). Returns its directory."""
    from run_helpers import run_relax

    root, exp = tiny_setup, tmp_path_factory.mktemp("plugins")
    run_relax([
        "--hf-checkpoint", str(root / "model"), "--prompt-data", str(root / "train.jsonl"),
        "--input-key", "prompt", "--label-key", "label", "--apply-chat-template",
        "--custom-rm-path", "tests.integration.digit_reward.parity_reward", "--reward-num-workers", "1",
        "--custom-generate-function-path", "tests.integration.multiturn_generate.generate",
        "--dynamic-sampling-filter-path", "relax.engine.filters.dynamic_sampling_filters.check_reward_nonzero_std",
        "--over-sampling-batch-size", "12", "--rollout-batch-size", "8", "--n-samples-per-prompt", "4",
        "--rollout-max-response-len", "4", "--num-rollout", "3", "--lr", "1e-2", "--progress-bar", "false",
        "--exp-dir", str(exp), "--resource", '{"actor": [1, 1], "rollout": [1, 1]}',
        "--eval-interval", "3", "--eval-prompt-data", "tiny", str(root / "eval.jsonl"),
        "--n-samples-per-eval-prompt", "4", "--log-passrate", "--skip-eval-before-train",
        "--num-iters-per-train-update", "2", "--advantage-estimator", "reinforce_plus_plus",  # test_estimators
        "--custom-convert-samples-to-train-data-path", "tests.integration.train_data_plugins.mask_first_token",
        "--save-debug-rollout-data", str(exp / "rollouts" / "step_{rollout_id}.pt"),
        "--save-debug-train-data", str(exp / "train_{rollout_id}.pt"),
        # test_rollout_logs: slime's logging hooks and the correct samples
        "--custom-rollout-log-function-path", "tests.integration.run_log_hooks.record_rollout",
        "--custom-eval-rollout-log-function-path", "tests.integration.run_log_hooks.record_eval",
        "--log-correct-samples",
    ])
    return exp


# The colocate Ctrl-C run doubles as the true on-policy run: both need a colocate run of a few steps.
TRUE_ON_POLICY = ("--true-on-policy-mode", "--rollout-temperature", "0.8", "--lr", "1e-2",
                  "--custom-rm-path", "tests.integration.digit_reward.reward_func", "--reward-num-workers", "1")


@pytest.fixture(scope="session")
def interrupted_run(tiny_setup, tmp_path_factory):
    """A colocate `relax-train` subprocess (its own Ray) in --true-on-policy-mode, started as a job
    scheduler's script starts one (a script in its own session that runs it in the background of
    its non-interactive shell through scripts/entrypoint/local.sh: SIGINT ignored) and stopped with
    SIGTERM once two steps are done (`Run.stop`: what ran at the signal, what was left 10 s after).
    Before the signal it records what the running run exposes: every listening socket of its
    processes (`run.sockets`), its token, and the files of the run directory and of its Ray session
    that hold the token (`run.token_files_during`). Returns the `Run` (marker, exit code, run
    directory)."""
    import signal

    from subprocess_runs import Run, files_containing, listening_sockets, marked_processes, ray_session_dirs

    run = Run(tiny_setup, tmp_path_factory.mktemp("interrupted"), 1000, TRUE_ON_POLICY, launch="setsid")
    try:
        assert run.wait_for("step 2/1000"), run.output()[-5000:]  # training is really under way
        pids = marked_processes(run.marker)
        run.sockets = listening_sockets(pids)
        run.session_dirs = ray_session_dirs(pids)
        token_files = list((run.exp_dir / ".relax").glob("run_token-*"))
        run.token_file = token_files[0] if token_files else None
        run.token = run.token_file.read_bytes() if run.token_file else None
        run.token_modes = (run.token_file.stat().st_mode & 0o777, run.token_file.parent.stat().st_mode & 0o777) \
            if run.token_file else None
        run.token_files_during = [p for root in [run.exp_dir, *run.session_dirs]
                                  for p in files_containing(root, run.token)] if run.token else []
        run.stop(signal.SIGTERM)
    finally:
        run.kill_if_running()
    return run


@pytest.fixture(scope="session")
def fully_async_interrupted_run(tiny_setup, tmp_path_factory):
    """A fully-async PPO `relax-train` subprocess (its own Ray) at --max-staleness 2 with every
    streaming role (Rollout, Reference, ActorFwd, Critic, Advantages), interrupted with Ctrl-C
    (SIGINT) once four steps are done, while the roles' loops are in flight. Returns the `Run`."""
    import signal

    from subprocess_runs import Run, marked_processes

    root = tiny_setup
    args = ["--hf-checkpoint", str(root / "model"), "--prompt-data", str(root / "train.jsonl"),
            "--input-key", "prompt", "--label-key", "label", "--apply-chat-template",
            "--custom-rm-path", "tests.integration.digit_reward.reward_func",
            "--reward-num-workers", "1", "--rollout-shuffle",
            "--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--rollout-max-response-len", "6",
            "--lr", "1e-2", "--progress-bar", "false", "--num-rollout", "1000",
            "--use-kl-loss", "--kl-loss-coef", "0.05", "--kl-loss-type", "low_var_kl",
            "--fully-async", "--max-staleness", "2", "--advantage-estimator", "ppo", "--gamma", "1.0",
            "--lambd", "0.95", "--resource", '{"actor": [1, 1], "rollout": [1, 1], "reference": [1, 1], '
                                             '"actor_fwd": [1, 1], "advantages": [1, 0], "critic": [1, 1]}']
    out = tmp_path_factory.mktemp("fully_async_interrupted")
    args += ["--timeline-dump-dir", str(out / "timeline")]
    run = Run(root, out, 0, args=args)
    try:
        assert run.wait_for("step 4/1000"), run.output()[-5000:]
        run.processes_before_signal = len(marked_processes(run.marker))
        run.proc.send_signal(signal.SIGINT)
        run.proc.wait(timeout=120)
    finally:
        if run.proc.poll() is None:
            run.proc.kill()
    return run
