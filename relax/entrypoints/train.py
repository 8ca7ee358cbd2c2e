"""`relax-train` / `python3 relax/entrypoints/train.py`: parse and validate the flags (the
`--sglang-*` options by the inference backend's own check, `relax.backends.registry`), resolve
the run plan, check the inputs (data rows, --save, --load: relax.config.preflight), then start
the run (`--dry-run`: print the plan and stop). Heavy imports (torch, ray) happen only after
validation passed, so `--help`, `--dry-run` and input errors come in about a second and nothing
is started for a bad command line."""

from __future__ import annotations

import os
import sys

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def main(argv: list[str] | None = None) -> int:
    from relax.backends.registry import check_engine_options
    from relax.config import ConfigError, PlanError, parse_config
    from relax.config.machine import local_gpus
    from relax.config.plan import format_plan, resolve_plan
    from relax.config.preflight import check_inputs
    from relax.utils.logging import setup_logging

    setup_logging()
    try:
        # The inference backends check their own options (config imports no backend).
        cfg = parse_config(argv, engine_check=check_engine_options)
        plan = resolve_plan(cfg, local_gpus())  # rejects what the mode cannot use, before Ray starts
        check_inputs(cfg)  # data rows, --save, --load: read before anything starts
    except (ConfigError, PlanError) as err:
        print(f"relax-train: error: {err}", file=sys.stderr)
        return 2
    if cfg.misc.dry_run:
        print(format_plan(plan, cfg))
        return 0
    from relax.core.controller import run
    from relax.core.service import Terminated

    try:
        return run(cfg)
    except PlanError as err:  # the plan does not fit the cluster it joined (checked once Ray is up)
        print(f"relax-train: error: {err}", file=sys.stderr)
        return 2
    except Terminated:  # SIGTERM (a scheduler's stop, `kill`): the same teardown as Ctrl-C
        print("relax-train: terminated (SIGTERM); all run processes were stopped", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print("relax-train: interrupted; all run processes were stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
