"""Run a whole training job in-process on the session's Ray cluster, and read its metrics."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from relax.config import parse_config
from relax.core.controller import _run
from relax.core.service import Runtime


def run_relax(args: list[str]) -> dict:
    """Parse, validate and run `args` like `relax-train` does; returns the eval summary."""
    cfg = parse_config(args)
    with Runtime(cfg) as runtime:
        return asyncio.run(_run(cfg, runtime))


def read_metrics(exp_dir: Path) -> list[dict]:
    with open(Path(exp_dir) / "metrics.jsonl") as f:
        return [json.loads(line) for line in f]


def step_rows(exp_dir: Path) -> list[dict]:
    """One row per training step (eval-only rows left out)."""
    return [r for r in read_metrics(exp_dir) if "time/step" in r]
