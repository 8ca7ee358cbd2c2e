"""Where step metrics go: one console summary line per step, TensorBoard scalars, a JSONL log.

Components return metrics as plain dicts; the Controller hands them here, the only place
that talks to trackers.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

logger = logging.getLogger(__name__)

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


class MetricsTracker:
    def __init__(self, exp_dir: str, *, use_tensorboard: bool = False, tb_dir: str | None = None,
                 tb_name: str | None = None) -> None:
        os.makedirs(exp_dir, exist_ok=True)
        self.jsonl = open(os.path.join(exp_dir, "metrics.jsonl"), "a")
        self.writer = None
        if use_tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            log_dir = os.path.join(tb_dir or os.environ.get("TENSORBOARD_DIR") or os.path.join(exp_dir, "tb"),
                                   tb_name or "")
            self.writer = SummaryWriter(log_dir=log_dir)
            logger.info("TensorBoard scalars -> %s", log_dir)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        scalars = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}
        self.jsonl.write(json.dumps({"step": step, **scalars}) + "\n")
        self.jsonl.flush()
        if self.writer is not None:
            for key, value in scalars.items():
                self.writer.add_scalar(key, value, step)
            self.writer.flush()

    def close(self) -> None:
        self.jsonl.close()
        if self.writer is not None:
            self.writer.close()
