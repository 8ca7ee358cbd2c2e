"""`relax-train` / `python3 relax/entrypoints/train.py`: parse and validate the flags, then
start the run. Heavy imports (torch, ray) happen only after validation passed, so `--help`
and flag errors are instant and nothing is started for a bad command line."""

from __future__ import annotations

import logging
import os
import sys

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def main(argv: list[str] | None = None) -> int:
    from relax.config import ConfigError, parse_config

    try:
        cfg = parse_config(argv)
    except ConfigError as err:
        print(f"relax-train: error: {err}", file=sys.stderr)
        return 2
    from relax.config.validate import ignored_backend_flags
    from relax.utils.logging import setup_logging

    setup_logging()
    ignored = ignored_backend_flags(cfg)
    if ignored:
        logging.getLogger("relax").warning(
            "%s only apply to the megatron/sglang backends; the %s/%s backends ignore them",
            " ".join(ignored), cfg.cluster.train_backend, cfg.cluster.rollout_backend)
    from relax.core.controller import run

    try:
        return run(cfg)
    except KeyboardInterrupt:
        print("relax-train: interrupted; all run processes were stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
