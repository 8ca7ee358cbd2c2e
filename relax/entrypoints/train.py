"""`relax-train` / `python3 relax/entrypoints/train.py`: parse and validate the flags (the
`--sglang-*` options by the inference backend's own check, `relax.backends.registry`), resolve
the run plan (for this machine, or with `--cluster` for a cluster described on the command line,
node by node: relax.config.nodes), check the inputs (data rows, --save, --load:
relax.config.preflight), then start the run (`--dry-run`: print the plan and stop). Heavy imports
(torch, ray) happen only after validation passed, so `--help`, `--dry-run` and input errors come
in about a second and nothing is started for a bad command line."""

from __future__ import annotations

import os
import sys

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def main(argv: list[str] | None = None) -> int:
    from relax.backends.registry import check_engine_options
    from relax.config import ConfigError, PlanError, parse_config
    from relax.config.machine import local_gpus
    from relax.config.nodes import format_nodes, parse_cluster, plan_on_nodes
    from relax.config.plan import format_plan, resolve_plan
    from relax.config.preflight import check_inputs
    from relax.utils.logging import setup_logging

    setup_logging()
    try:
        # The inference backends check their own options (config imports no backend).
        cfg = parse_config(argv, engine_check=check_engine_options)
        nodes = parse_cluster(cfg.cluster.cluster) if cfg.cluster.cluster else None  # --cluster (with --dry-run)
        plan = resolve_plan(cfg, sum(n.gpus for n in nodes) if nodes else local_gpus())  # before Ray starts
        placed = plan_on_nodes(plan, nodes) if nodes else None  # the same fit checks as a run, per node
        check_inputs(cfg)  # data rows, --save, --load: read before anything starts
    except (ConfigError, PlanError) as err:
        print(f"relax-train: error: {err}", file=sys.stderr)
        return 2
    if cfg.misc.dry_run:
        print("\n".join([format_plan(plan, cfg)] + (format_nodes(placed) if placed else [])))
        return 0
    from relax.core.controller import run
    from relax.core.service import Terminated
    from relax.distributed.ray.nodes import NodeLost

    try:
        return run(cfg)
    except PlanError as err:  # the plan does not fit the cluster it joined (checked once Ray is up)
        print(f"relax-train: error: {err}", file=sys.stderr)
        return 2
    except NodeLost as err:  # a node left the cluster mid-run (and --use-health-check did not recover)
        print(f"relax-train: error: {err}", file=sys.stderr)
        return 1
    except Terminated:  # SIGTERM (a scheduler's stop, `kill`): the same teardown as Ctrl-C
        print("relax-train: terminated (SIGTERM); all run processes were stopped", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print("relax-train: interrupted; all run processes were stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
