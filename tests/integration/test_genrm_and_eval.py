"""GenRM and evaluation through the real graph on CPU.

GenRM: the judge is a tiny Qwen3 rigged to answer "1" to anything (a random judge's verdicts
are unparseable noise), so the plumbing is checkable exactly: the GenRM role deploys its engine,
every training and eval sample is judged through it, the verdict parses to 1.0, the rewards
reach training, and teardown leaves no judge engine. Eval: --eval-config per-dataset overrides
(samples per prompt, response length, context limit), --eval-function-path, --eval-reward-key
and --rollout-max-context-len in one short run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from run_helpers import read_metrics, run_relax, step_rows

pytestmark = pytest.mark.integration


def build_yes_judge(model_dir: Path, out_dir: Path) -> Path:
    """A copy of the tiny model whose next token is always "1": layers add nothing to the residual
    stream, embedding dim 0 is positive for every token and largest for "1", and the final norm
    keeps only dim 0, so the logits (tied embeddings) peak at "1" whatever the input."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    (one,) = tokenizer.encode("1", add_special_tokens=False)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embed = model.model.embed_tokens.weight
        embed[:, 0] = 1.0
        embed[one, 0] = 10.0
        model.model.norm.weight.zero_()
        model.model.norm.weight[0] = 1.0
    model.config.max_position_embeddings = 1024  # the judge prompt is longer than the policy's context
    model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    return out_dir


def processes_with(needle: str) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if needle in cmdline and int(proc.name) != os.getpid():
                found.append(cmdline[:200])
    return found


def common_args(root: Path, exp_dir: Path) -> list[str]:
    return ["--hf-checkpoint", str(root / "model"), "--prompt-data", str(root / "train.jsonl"),
            "--input-key", "prompt", "--label-key", "label", "--apply-chat-template",
            "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--rollout-max-response-len", "4",
            "--num-rollout", "1", "--progress-bar", "false", "--exp-dir", str(exp_dir),
            "--eval-interval", "1", "--skip-eval-before-train"]


def test_genrm_judges_training_and_eval_samples_and_leaves_no_engine(ray_cluster, tiny_setup, tmp_path):
    root = tiny_setup
    judge = build_yes_judge(root / "model", tmp_path / "judge")
    config = tmp_path / "eval.yaml"
    config.write_text(f"eval:\n  datasets:\n    - {{name: judged, path: {root / 'eval.jsonl'}, rm_type: genrm, "
                      f"max_response_len: 2}}\n")
    run_relax(common_args(root, tmp_path) + [
        "--rm-type", "genrm", "--genrm-model-path", str(judge), "--genrm-num-gpus", "1",
        "--genrm-sampling-config", '{"max_response_len": 1}', "--genrm-engine-config", '{"max_context_len": 1024}',
        "--eval-config", str(config)])
    (step,) = step_rows(tmp_path)
    assert step["rollout/reward_mean"] == 1.0 and step["reward/failures"] == 0.0
    assert step["rollout/num_samples"] == 4.0 and "train/pg_loss" in step
    evals = [r for r in read_metrics(tmp_path) if "eval/judged/reward_mean" in r]
    assert evals and evals[-1]["eval/judged/reward_mean"] == 1.0 and evals[-1]["eval/judged/num_samples"] == 8.0
    assert (tmp_path / "genrm_engine_0.log").exists()
    assert processes_with(str(judge)) == []


def test_eval_config_overrides_eval_function_reward_key_and_context(ray_cluster, tiny_setup, tmp_path):
    """Also the rollout-only run (--debug-rollout-only, two steps): the rollout and its evals run, nothing
    trains, and the engines keep their weights (one run for both; the suite's time budget)."""
    root = tiny_setup
    prompt_lens = tight_prompt_lengths(root)
    limit = max(prompt_lens) + 2  # every prompt fits, with room for 2 to ~8 response tokens
    probe = tmp_path / "probe.jsonl"
    custom = tmp_path / "custom.yaml"
    custom.write_text(f"eval_probe_path: {probe}\n")
    config = tmp_path / "eval.yaml"
    config.write_text(f"""
eval:
  defaults:
    n_samples_per_eval_prompt: 2
  datasets:
    - name: wide
      path: {root / 'eval.jsonl'}
      n_samples_per_eval_prompt: 3
      max_response_len: 3
    - name: tight
      path: {root / 'eval.jsonl'}
      max_response_len: 8
      max_context_len: {limit}
""")
    run_relax(common_args(root, tmp_path) + [
        "--custom-rm-path", "tests.integration.eval_helpers.dict_reward",
        "--reward-num-workers", "1", "--reward-key", "score",
        "--eval-reward-key", "acc", "--eval-config", str(config), "--custom-config-path", str(custom),
        "--eval-function-path", "tests.integration.eval_helpers.eval_rollout", "--rollout-max-context-len", "128",
        "--num-rollout", "2", "--debug-rollout-only"])
    rows = step_rows(tmp_path)
    assert len(rows) == 2 and all("rollout/reward_mean" in r and "train/pg_loss" not in r for r in rows)
    assert [r["rollout/weight_version_min"] for r in rows] == [0.0, 0.0]  # rollout only: engines kept their weights
    assert all(r["rollout/reward_mean"] < 1.0 for r in rows)  # the rollout uses `score`, the digit share
    evals = [r for r in read_metrics(tmp_path) if "eval/wide/reward_mean" in r]
    last = evals[-1]
    assert last["eval/wide/reward_mean"] == 1.0 and last["eval/tight/reward_mean"] == 1.0  # `acc`
    assert last["eval/wide/num_samples"] == 24.0 and last["eval/tight/num_samples"] == 16.0
    assert last["eval/wide/response_len_mean"] <= 3.0
    calls = [json.loads(line) for line in probe.read_text().splitlines()]
    assert calls == len(evals) * [
        {"evaluation": True, "n": 3, "prompts": 8, "max_response_len": 3, "max_context_len": 128},
        {"evaluation": True, "n": 2, "prompts": 8, "max_response_len": 8, "max_context_len": limit},
    ]
    cap = sum(min(8, limit - n) for n in prompt_lens) / len(prompt_lens)  # max_new_tokens cut to fit
    assert 0 < last["eval/tight/response_len_mean"] <= cap + 1e-9 < 8


def tight_prompt_lengths(root: Path) -> list[int]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(root / "model"))
    lengths = []
    for line in (root / "eval.jsonl").read_text().splitlines():
        prompt = json.loads(line)["prompt"]
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        lengths.append(len(tokenizer.encode(text, add_special_tokens=False)))
    return lengths
