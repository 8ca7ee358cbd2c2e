"""The logging hooks of the shared plugin run (tests/integration/conftest.py::plugin_run), with slime's
signatures: each call is appended to <exp-dir>/log_hooks/<kind>.jsonl, and the defaults are kept
(the run's other tests read them)."""

from __future__ import annotations

import json
import os


def _record(args, kind: str, entry: dict) -> None:
    directory = os.path.join(args.exp_dir, "log_hooks")
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, f"{kind}.jsonl"), "a") as f:
        f.write(json.dumps(entry) + "\n")


def record_rollout(rollout_id, args, samples, rollout_extra_metrics, rollout_time):
    _record(args, "rollout", {"rollout_id": rollout_id, "samples": len(samples), "time": rollout_time,
                              "extra": sorted(rollout_extra_metrics)})
    return False


def record_eval(rollout_id, args, data, extra_metrics):
    _record(args, "eval", {"rollout_id": rollout_id, "sets": {k: len(v["samples"]) for k, v in data.items()},
                           "extra": sorted(extra_metrics)})
    return False
