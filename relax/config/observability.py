"""The logging and debug flag groups of `schema.RelaxConfig` (metrics sinks, sample logs, dumps,
debug modes), kept apart from schema.py for its size."""

from __future__ import annotations

from dataclasses import dataclass

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
    check_weight_update_equal: bool = opt(False, "Verify engine weights after sync.", supported=False)
    use_pytorch_profiler: bool = opt(False, "Torch profiler.", supported=False)
