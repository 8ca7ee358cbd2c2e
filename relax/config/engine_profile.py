"""The engine-profiling flags (`EngineProfileConfig`, one config group of `schema.RelaxConfig`, kept
apart from schema.py for its size) and their checks.

`--sglang-profile` profiles the inference engines during selected rollout steps, as the seeds
describe: at the start of each selected step the Rollout asks every engine to start SGLang's torch
profiler (`POST /start_profile` with SGLang's `ProfileReq` fields: `output_dir`, `num_steps`,
`activities`, `profile_by_stage`, `with_stack`, `record_shapes`, `profile_prefix`), and at the end it
stops it (`POST /stop_profile`) unless `--sglang-profile-num-steps` made the engine stop on its own.
Traces land in `<output dir>/rollout_<step>/`. The sglang backend is SGLang's own profiler; the hf
engine answers the same two endpoints with torch.profiler over its decode steps
(`relax.backends.hf.profiler`). `relax.engine.rollout.profiling` turns these flags into requests.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from relax.config.fields import opt

# ProfileReq.activities SGLang 0.5.23 knows, and the ones the hf engine records (GPU only on a GPU).
SGLANG_ACTIVITIES = ("CPU", "GPU", "MEM", "RPD", "CUDA_PROFILER")
HF_ACTIVITIES = ("CPU", "GPU", "MEM")


@dataclass(frozen=True)
class EngineProfileConfig:
    """Torch profiler traces of the inference engines per selected rollout step (docs/observability.md)."""

    sglang_profile: bool = opt(False, "Enable torch profiling on the inference engines during rollout (SGLang's "
                               "/start_profile and /stop_profile; the hf engine records the same). Profile traces "
                               "are saved per rollout step, in <--sglang-profile-output-dir>/rollout_<step>/.")
    sglang_profile_steps: list | None = opt(
        None, "Absolute rollout step IDs (0-indexed) to profile, e.g. 3 10 50. Takes precedence over "
        "--sglang-profile-step-start/end; with none of the three every step is profiled.", nargs="+", type=int)
    sglang_profile_step_start: int | None = opt(None, "First rollout step to profile (inclusive, 0-indexed); "
                                                "ignored when --sglang-profile-steps is set.")
    sglang_profile_step_end: int | None = opt(None, "Last rollout step to profile (inclusive, 0-indexed): start=2, "
                                              "end=4 profiles steps 2, 3, 4; ignored when --sglang-profile-steps "
                                              "is set.")
    sglang_profile_output_dir: str | None = opt(None, "Directory of the engine traces (default "
                                                "traces/<--tb-experiment-name or the run directory's name>/"
                                                "sglang_trace, from the launch directory).")
    sglang_profile_num_steps: int = opt(3, "Forward steps each engine profiles per selected rollout step, then it "
                                        "stops on its own; -1 profiles the whole rollout step (stopped at its end).")
    sglang_profile_activities: list = opt(None, "Activities to record: CPU, GPU, MEM (memory), and on SGLang also "
                                          "RPD, CUDA_PROFILER.", nargs="+", default_factory=lambda: ["CPU", "GPU"])
    sglang_profile_by_stage: bool = opt(False, "Profile prefill and decode separately (SGLang only: the hf engine "
                                        "runs prefill inside its continuously batched steps).")
    sglang_profile_with_stack: bool = opt(False, "Record the Python call stack of each op in the traces.")
    sglang_profile_record_shapes: bool = opt(False, "Record the input shapes of each op in the traces.")


def default_output_dir(values: EngineProfileConfig, experiment: str | None, exp_dir: str | None) -> str:
    """Where the traces go: the flag, else traces/<experiment name>/sglang_trace; absolute (the engines
    and the Rollout do not share the launch directory)."""
    name = experiment or os.path.basename(os.path.normpath(exp_dir or "run"))
    return os.path.abspath(values.sglang_profile_output_dir or os.path.join("traces", name, "sglang_trace"))


def check_engine_profile_values(values: EngineProfileConfig, backend: str) -> None:
    """Ranges and choices, for the resolved `--rollout-backend`; ValueError naming the flag and the fix."""
    if any(s < 0 for s in values.sglang_profile_steps or ()):
        raise ValueError(f"--sglang-profile-steps are rollout step IDs (>= 0), got {values.sglang_profile_steps}")
    start, end = values.sglang_profile_step_start, values.sglang_profile_step_end
    if (start is not None and start < 0) or (end is not None and end < 0):
        raise ValueError(f"--sglang-profile-step-start/end are rollout step IDs (>= 0), got {start}, {end}")
    if start is not None and end is not None and start > end:
        raise ValueError(f"--sglang-profile-step-start {start} is after --sglang-profile-step-end {end} (both "
                         "inclusive): no step would be profiled")
    if values.sglang_profile_num_steps == 0 or values.sglang_profile_num_steps < -1:
        raise ValueError(f"--sglang-profile-num-steps must be >= 1 (forward steps) or -1 (the whole rollout step), "
                         f"got {values.sglang_profile_num_steps}")
    known = SGLANG_ACTIVITIES if backend == "sglang" else HF_ACTIVITIES
    unknown = [a for a in values.sglang_profile_activities or () if a not in known]
    if unknown or not values.sglang_profile_activities:
        raise ValueError(f"--sglang-profile-activities {' '.join(unknown) or '(empty)'}: the {backend} engine records "
                         f"{', '.join(known)}")
    if values.sglang_profile_by_stage and backend != "sglang":
        raise ValueError(f"--sglang-profile-by-stage: the {backend} engine runs prefill inside its continuously "
                         "batched decode steps, so it records one trace per step, not one per stage; drop the flag "
                         "(or use --rollout-backend sglang)")


def profile_request(values: Any) -> dict[str, Any]:
    """The fields of every /start_profile request of a run (SGLang's ProfileReq names); per step and
    engine the Rollout adds `output_dir` and `profile_prefix`. `num_steps` None: until /stop_profile."""
    num_steps = values.sglang_profile_num_steps
    return {"num_steps": None if num_steps == -1 else num_steps,
            "activities": list(values.sglang_profile_activities), "profile_by_stage": values.sglang_profile_by_stage,
            "with_stack": values.sglang_profile_with_stack, "record_shapes": values.sglang_profile_record_shapes}
