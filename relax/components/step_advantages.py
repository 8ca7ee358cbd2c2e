"""A step's advantages from its rows: the glue between per-row lists and `relax.algorithms`.

One function for both modes, so the numbers cannot drift apart: the colocate Actor calls it on
the whole step, the fully-async Advantages role on each complete group (or the whole step for
the batch-whitening estimators). Order: the estimator (`--advantage-estimator`; GAE on the
critic's values for ppo; `--kl-coef` shapes the reward with k1 KL of the behaviour policy to
the reference), then the OPD penalty against the teacher (`--use-opd`), then
`--normalize-advantages` (slime's order: whiten the final advantage).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from relax.algorithms.advantages import AdvantageInputs, apply_opd_penalty, compute_advantages, normalize_advantages
from relax.algorithms.kl import approx_kl
from relax.config.schema import RelaxConfig


@dataclass(frozen=True)
class AdvantageSpec:
    """The advantage settings of a run, from its flags."""

    estimator: str
    n_samples_per_prompt: int
    kl_coef: float = 0.0
    gamma: float = 1.0
    lambd: float = 1.0
    std_normalization: bool = True
    normalize_rewards: bool = True
    normalize_advantages: bool = False
    opd_coef: float | None = None  # None: no OPD penalty

    @classmethod
    def from_config(cls, cfg: RelaxConfig) -> AdvantageSpec:
        a = cfg.algo
        return cls(estimator=a.advantage_estimator, n_samples_per_prompt=cfg.rollout.n_samples_per_prompt,
                   kl_coef=a.kl_coef, gamma=a.gamma, lambd=a.lambd,
                   std_normalization=not a.disable_grpo_std_normalization,
                   # A custom reward post-process has already shaped the rewards: use them as they are.
                   normalize_rewards=not (a.disable_rewards_normalization
                                          or cfg.reward.custom_reward_post_process_path),
                   normalize_advantages=a.normalize_advantages, opd_coef=a.opd_kl_coef if a.use_opd else None)


def jagged(rows: list[list[float]]) -> torch.Tensor:
    """Per-row float lists -> a jagged nested tensor column for TransferQueue."""
    return torch.nested.nested_tensor([torch.tensor(r, dtype=torch.float32) for r in rows], layout=torch.jagged)


def padded(rows: list[list[float]]) -> torch.Tensor:
    """Per-row response-aligned lists -> right-padded `[B, T]` float tensor."""
    return torch.nn.utils.rnn.pad_sequence([torch.tensor(r, dtype=torch.float32) for r in rows], batch_first=True)


def step_advantages(spec: AdvantageSpec, rewards_R: list[float], loss_masks_RT: list[list[int]], *,
                    old_log_probs_RT: list[list[float]] | None = None,
                    ref_log_probs_RT: list[list[float]] | None = None,
                    teacher_log_probs_RT: list[list[float]] | None = None,
                    values_RT: list[list[float]] | None = None) -> tuple[list[list[float]], list[list[float]]]:
    """Per-row advantages and returns (response-aligned) of whole groups of rows, groups contiguous.

    `old_log_probs_RT` is the behaviour policy (needed with --kl-coef and --use-opd)."""
    mask_BT = padded(loss_masks_RT)
    kl_BT = None
    if spec.kl_coef != 0:  # reward shaping: k1 KL of the behaviour policy to the reference
        kl_BT = approx_kl(padded(_required(old_log_probs_RT, "old_log_probs", "--kl-coef")),
                          padded(_required(ref_log_probs_RT, "ref_log_probs", "--kl-coef")), "k1") * mask_BT
    inputs = AdvantageInputs(
        rewards_B=torch.tensor(rewards_R, dtype=torch.float32), n_samples_per_prompt=spec.n_samples_per_prompt,
        mask_BT=mask_BT, kl_BT=kl_BT, kl_coef=spec.kl_coef, gamma=spec.gamma, lambd=spec.lambd,
        std_normalization=spec.std_normalization, normalize_rewards=spec.normalize_rewards,
        values_BT=padded(values_RT) if values_RT is not None else None,
    )
    adv_BT, returns_BT = compute_advantages(spec.estimator, inputs)
    if spec.opd_coef is not None:  # the student's own (old) log-probs against the teacher's, per token
        adv_BT = apply_opd_penalty(adv_BT, padded(_required(old_log_probs_RT, "old_log_probs", "--use-opd")),
                                   padded(_required(teacher_log_probs_RT, "teacher_log_probs", "--use-opd")),
                                   mask_BT, coef=spec.opd_coef)
    if spec.normalize_advantages:
        adv_BT = normalize_advantages(adv_BT, mask_BT)
    lengths = [len(m) for m in loss_masks_RT]
    return ([adv_BT[i, :n].tolist() for i, n in enumerate(lengths)],
            [returns_BT[i, :n].tolist() for i, n in enumerate(lengths)])


def _required(value: list | None, column: str, flag: str) -> list:
    if value is None:
        raise ValueError(f"{flag} needs the {column!r} column on every row, and this batch has none")
    return value


def opd_metrics(student_RT: list[list[float]], teacher_RT: list[list[float]],
                loss_masks_RT: list[list[int]]) -> dict[str, float]:
    """The student's KL to the teacher: token mean of logp_student - logp_teacher on the student's
    own samples (a k1 estimate of KL(student || teacher) per token)."""
    student_BT, teacher_BT, mask_BT = padded(student_RT), padded(teacher_RT), padded(loss_masks_RT)
    tokens = mask_BT.sum().clamp(min=1)
    return {"opd/kl_to_teacher": float(((student_BT - teacher_BT) * mask_BT).sum() / tokens),
            "opd/teacher_log_prob_mean": float((teacher_BT * mask_BT).sum() / tokens)}
