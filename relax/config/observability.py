"""The logging, debug and training-profiling flag groups of `schema.RelaxConfig` (metrics sinks,
sample logs, dumps, debug modes; torch profiler traces and memory tools of the training ranks),
kept apart from schema.py for its size. `relax.config.checks.profiling` checks the profiling flags;
`relax.backends.trainer.profiling` acts on them in each training rank."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from relax.config.choices import suggest
from relax.config.fields import opt, parse_bool


@dataclass(frozen=True)
class LoggingConfig:
    use_tensorboard: bool = opt(False, "Write TensorBoard scalars.")
    tb_project_name: str | None = opt(None, "TensorBoard directory (default $TENSORBOARD_DIR, else <exp-dir>/tb); its "
                                      "last part is also the W&B / ClearML project (default relax).")
    tb_experiment_name: str | None = opt(None, "TensorBoard run (a subdirectory); also the W&B run / ClearML task name "
                                         "(default: the run directory's name).")
    use_clearml: bool = opt(False, "Log metrics to ClearML (pip install 'relax-rl[clearml]'); offline with "
                            "CLEARML_OFFLINE_MODE=1 or when no ClearML credentials are found (docs/operations.md).")
    use_wandb: bool = opt(False, "Log metrics to W&B (pip install 'relax-rl[wandb]'); offline with WANDB_MODE=offline "
                          "or when no W&B credentials are found (docs/operations.md).")
    use_metrics_service: bool = opt(False, "Run the metrics sinks in a Serve deployment of their own that every role "
                                    "reports to (without it the driver writes them; docs/operations.md).")
    timeline_dump_dir: str | None = opt(None, "Write a Chrome-trace timeline of every role's phases per step here "
                                        "(timeline.json; open in Perfetto; docs/observability.md).")
    log_passrate: bool = opt(False, "Log eval pass@k (k = 1, 2, 4, ... <= --n-samples-per-eval-prompt; "
                             "correct = reward > 0).")
    log_multi_turn: bool = opt(False, "Log multi-turn trajectories (turns, tool calls, observations, termination) "
                               "per step to <exp-dir>/multi_turn/ and a few of them as text to the metrics sinks "
                               "(docs/agentic.md).")
    log_correct_samples: bool = opt(False, "Log the correct samples (reward > 0) of each step: their text to "
                                    "<exp-dir>/correct_samples/rollout_<step>.jsonl, a few to the metrics sinks, and "
                                    "their count, share and mean length as metrics (docs/observability.md).")
    log_reward_category: str | None = opt(None, "Key of dict rewards that names each sample's category (e.g. why "
                                          "it failed): per category its count, share and mean reward as metrics "
                                          "(<prefix>/reward_category/<value>/...). Needs --reward-key.")
    notify_urls: str | None = opt(None, "Apprise URLs (comma-separated): alerts on run start, failure (with the "
                                  "error), each recovery (docs/operations.md) and finish, e.g. json://host:port/path "
                                  "or slack://... (docs/observability.md).")
    progress_bar: bool = opt(True, "Show a progress bar per rollout.", type=parse_bool)


@dataclass(frozen=True)
class DebugConfig:
    debug_rollout_only: bool = opt(False, "Rollout only: no training, engines keep their weights.")
    debug_train_only: bool = opt(False, "Training only, no engines: trains on --load-debug-rollout-data.")
    load_debug_rollout_data: str | None = opt(None, "Replay saved rollouts ({rollout_id} in the path); implies "
                                              "--debug-train-only.")
    load_debug_rollout_data_subsample: float | None = opt(None, "Keep this fraction of replayed groups (seeded).")
    save_debug_rollout_data: str | None = opt(None, "Save each step's scored groups here ({rollout_id} in the path).")
    save_debug_train_data: str | None = opt(None, "Save each step's training batch (tokens, masks, advantages, "
                                            "log-probs) as a torch file ({rollout_id} in the path).")
    dump_details: str | None = opt(None, "Directory for per-step details: rollout/<step>.jsonl (prompt, response, "
                                   "label, reward, status, versions) and train/<step>.pt (the training batch).")
    check_weight_update_equal: bool = opt(False, "After each weight push, check that the engines hold exactly what "
                                          "the trainer sent: hf engines per tensor (checksums by name; a mismatch "
                                          "names the tensor and the engine), SGLang engines by SGLang's weights "
                                          "checker (docs/weights.md).")


# --profile-target: what a torch profiler window covers on a training rank (relax.backends.trainer.profiling)
PROFILE_TARGETS = ("train_overall", "train_actor", "train_log_probs")


def parse_profile_target(text: str) -> str:
    """`type=` of each --profile-target item: one of PROFILE_TARGETS (checked when the flags are parsed)."""
    if text in PROFILE_TARGETS:
        return text
    raise ValueError(f"unknown profile target {text!r} (choose from {', '.join(PROFILE_TARGETS)})"
                     f"{suggest(text, PROFILE_TARGETS)}")


parse_profile_target.__name__ = "profile target"


@dataclass(frozen=True)
class TrainProfileConfig:
    """Torch profiler traces and memory tools of the training ranks (docs/observability.md)."""

    use_pytorch_profiler: bool = opt(False, "Record torch profiler traces (CPU ops; CUDA kernels too on a GPU) of the "
                                     "training ranks in steps --profile-step-start..--profile-step-end: one per "
                                     "role, target, rank and step in <exp-dir>/train_trace/ (Perfetto, TensorBoard; "
                                     "docs/observability.md).")
    profile_step_start: int = opt(10, "First step to profile (inclusive), counted from 0 since this launch (not the "
                                  "rollout id: a resumed run counts from 0 again).")
    profile_step_end: int = opt(12, "Last step to profile (inclusive): start 10, end 12 profiles steps 10, 11, 12.")
    profile_target: list = opt(None, "What to profile: train_overall (a role's whole step on its ranks), "
                               "train_actor (the training passes only), train_log_probs (the log-prob passes only).",
                               nargs="+", type=parse_profile_target, default_factory=lambda: ["train_overall"])
    profile_with_stack: bool = opt(False, "Record the Python call stack of each op in the traces.")
    profile_with_memory: bool = opt(False, "Record tensor allocations and frees in the traces (memory events).")
    profile_with_flops: bool = opt(False, "Estimate the FLOPs of matrix multiplies and convolutions (the summary "
                                   "table next to each trace).")
    record_memory_history: bool = opt(False, "Record every CUDA allocation and free with its stack on the training "
                                      "ranks (torch.cuda.memory._record_memory_history); dump a snapshot after "
                                      "--memory-snapshot-num-steps steps and on OOM (open it in "
                                      "pytorch.org/memory_viz). CUDA only; with --memory-recorder memray: the "
                                      "ranks' host allocations, on CPU too.")
    memory_snapshot_path: str = opt("snapshot.pickle", "Snapshot file name: each rank writes "
                                    "<dir>/<role>_rank<r>_<name> (after an OOM: <role>_rank<r>_oom_<name>).")
    memory_snapshot_dir: str | None = opt(None, "Directory of the memory snapshots (default "
                                          "<exp-dir>/memory_snapshot).")
    memory_snapshot_num_steps: int | None = opt(None, "Dump the snapshot after this many steps, counted from 0 since "
                                                "this launch (3: after step 2), and stop recording; without it only "
                                                "an OOM dumps one.")
    memory_recorder: Literal["torch", "memray"] = opt("torch", "What records: torch (CUDA allocations) or memray "
                                                      "(the rank process's host allocations with native stacks; "
                                                      "pip install memray; needs --memory-snapshot-num-steps).")
    enable_cuda_memory_check: bool = opt(False, "Log the free GPU memory before each collective of the weight sync "
                                         "and gradient paths and attach the GPU memory state to the error when one "
                                         "fails (CUDA only).")
