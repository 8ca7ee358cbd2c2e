"""Step metrics helpers: the one-line console summary per step, pass@k, and a role's reporter.

Components return metrics as plain dicts; the Controller sends each step's row to the sinks
(`relax.utils.metrics_sinks`: JSONL log, TensorBoard, W&B, ClearML), in its own process or
through the metrics service (`--use-metrics-service`), which roles may also report to directly
(`MetricsReporter`).
"""

from __future__ import annotations

import logging
import os
from typing import Any

logger = logging.getLogger(__name__)

METRICS_APP_ENV = "RELAX_METRICS_APP"  # the metrics service's Serve app, for MetricsReporter

# (metric key, label, format) for the one-line step summary, in order.
SUMMARY_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("rollout/reward_mean", "reward", "{:.3f}"),
    ("rollout/response_len_mean", "resp_len", "{:.1f}"),
    ("train/kl_loss", "kl", "{:.4f}"),
    ("train/ppo_kl", "ppo_kl", "{:.4f}"),
    ("train/pg_clipfrac", "clipfrac", "{:.3f}"),
    ("train/entropy", "entropy", "{:.3f}"),
    ("train/grad_norm", "grad_norm", "{:.3f}"),
    ("time/rollout", "t_rollout", "{:.2f}s"),
    ("time/train", "t_train", "{:.2f}s"),
    ("weight_sync/seconds", "t_sync", "{:.3f}s"),
    ("weight_sync/gbps", "sync", "{:.3f}GB/s"),
    ("time/step", "t_step", "{:.2f}s"),
)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct (Chen et al. 2021, arXiv 2107.03374):
    1 - C(n - c, k) / C(n, k), computed as a stable product."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per prompt, got {n}")
    if n - c < k:
        return 1.0
    prob_all_wrong = 1.0
    for i in range(n - c + 1, n + 1):
        prob_all_wrong *= 1.0 - k / i
    return 1.0 - prob_all_wrong


def pass_rates(correct_per_prompt: list[list[bool]], prefix: str) -> dict[str, float]:
    """Mean pass@k over prompts for k = 1, 2, 4, ... up to the samples per prompt."""
    n = min(len(c) for c in correct_per_prompt)
    out = {}
    k = 1
    while k <= n:
        total = sum(pass_at_k(len(c), sum(c), k) for c in correct_per_prompt)
        out[f"{prefix}/pass@{k}"] = total / len(correct_per_prompt)
        k *= 2
    return out


def format_step_summary(step: int, total: int, metrics: dict[str, float]) -> str:
    parts = [f"step {step + 1}/{total}"]
    for key, label, fmt in SUMMARY_FIELDS:
        if key in metrics:
            parts.append(f"{label} {fmt.format(metrics[key])}")
    evals = sorted(k for k in metrics if k.startswith("eval/") and k.endswith("/reward_mean"))
    parts.extend(f"{k[5:-12]} {metrics[k]:.3f}" for k in evals)
    return " | ".join(parts)


class MetricsReporter:
    """A role's line to the metrics service (`--use-metrics-service`): `report(step, metrics)`
    sends the role's numbers for a step without waiting for an answer. The service's Serve app
    is named in $RELAX_METRICS_APP (set for every role process of a run that deploys it);
    without it, or once a report could not be sent (logged once), reports are dropped: roles
    return their step metrics to the Controller anyway."""

    def __init__(self, role: str) -> None:
        self.role = role
        self.app = os.environ.get(METRICS_APP_ENV)
        self._report: Any = None

    def report(self, step: int, metrics: dict[str, float]) -> None:
        if not self.app:
            return
        try:
            if self._report is None:
                from ray import serve

                self._report = serve.get_app_handle(self.app).options(method_name="report")
            self._report.remote(step, self.role, dict(metrics))
        except Exception as exc:  # noqa: BLE001 - a report must never stop the role
            logger.warning("%s: metrics report to %s failed, no more are sent: %s", self.role, self.app, exc)
            self.app = None
