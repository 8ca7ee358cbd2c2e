"""Where a run's results go: the run directory (made absolute, default ./outputs/<timestamp>),
the notification URLs and the metrics sinks (their packages are installed).
"""

from __future__ import annotations

import os
import time

from relax.config.errors import ConfigError
from relax.config.schema import RelaxConfig


def check_exp_dir(cfg: RelaxConfig) -> RelaxConfig:
    """The run directory as an absolute path (default ./outputs/<timestamp>); created when the run starts."""
    default = os.path.join("outputs", time.strftime("%Y%m%d-%H%M%S"))
    return cfg.replace(exp_dir=os.path.abspath(cfg.misc.exp_dir or default))


def check_notify(cfg: RelaxConfig) -> None:
    """--notify-urls: every URL one Apprise knows (relax.utils.notify)."""
    from relax.utils.notify import check_urls

    try:
        check_urls(cfg.logging.notify_urls)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def check_metrics_sinks(cfg: RelaxConfig) -> None:
    """--use-wandb / --use-clearml: their package is installed (relax.utils.metrics_sinks)."""
    from relax.utils.metrics_sinks import enabled_sinks, missing_packages

    missing = missing_packages(enabled_sinks(cfg.logging))
    if missing:
        raise ConfigError("; ".join(missing))
