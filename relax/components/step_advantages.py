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

from relax.algorithms.advantages import (SEQUENCE_ESTIMATORS, AdvantageInputs, apply_opd_penalty, compute_advantages,
                                        normalize_advantages)
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


def final_rows(sample_indices_R: list[int] | None, episode_indices_R: list[int] | None) -> list[int] | None:
    """For each row, the position of its episode's scored row (Sample.prior_segments: a prior
    segment's row points at its episode's last segment; any other row at itself); None when
    every row is its own episode (no prior segments, or the columns were not read)."""
    if sample_indices_R is None or episode_indices_R is None or sample_indices_R == episode_indices_R:
        return None
    where = {int(s): i for i, s in enumerate(sample_indices_R)}
    missing = sorted({int(e) for e in episode_indices_R} - set(where))
    if missing:
        raise ValueError(f"rows of prior segments whose episode's row is not in the batch: episodes {missing[:5]}")
    return [where[int(e)] for e in episode_indices_R]


def step_advantages(spec: AdvantageSpec, rewards_R: list[float], loss_masks_RT: list[list[int]], *,
                    old_log_probs_RT: list[list[float]] | None = None,
                    ref_log_probs_RT: list[list[float]] | None = None,
                    teacher_log_probs_RT: list[list[float]] | None = None,
                    values_RT: list[list[float]] | None = None,
                    final_of_R: list[int] | None = None) -> tuple[list[list[float]], list[list[float]]]:
    """Per-row advantages and returns (response-aligned) of whole groups of rows, groups contiguous.

    `old_log_probs_RT` is the behaviour policy (needed with --kl-coef and --use-opd). `final_of_R`
    (`final_rows`): rows of prior segments take their episode's advantage, which the estimator
    computes over the scored rows alone (whole groups of N; contiguous among themselves)."""
    mask_BT = padded(loss_masks_RT)
    if final_of_R is None:
        adv_BT, returns_BT = _estimate(spec, rewards_R, mask_BT, old_log_probs_RT, ref_log_probs_RT, values_RT)
    else:
        adv_BT, returns_BT = _estimate_episodes(spec, rewards_R, loss_masks_RT, final_of_R)
    if spec.opd_coef is not None:  # the student's own (old) log-probs against the teacher's, per token
        adv_BT = apply_opd_penalty(adv_BT, padded(_required(old_log_probs_RT, "old_log_probs", "--use-opd")),
                                   padded(_required(teacher_log_probs_RT, "teacher_log_probs", "--use-opd")),
                                   mask_BT, coef=spec.opd_coef)
    if spec.normalize_advantages:
        adv_BT = normalize_advantages(adv_BT, mask_BT)
    lengths = [len(m) for m in loss_masks_RT]
    return ([adv_BT[i, :n].tolist() for i, n in enumerate(lengths)],
            [returns_BT[i, :n].tolist() for i, n in enumerate(lengths)])


def _estimate(spec: AdvantageSpec, rewards_R: list[float], mask_BT: torch.Tensor,
              old_log_probs_RT: list[list[float]] | None, ref_log_probs_RT: list[list[float]] | None,
              values_RT: list[list[float]] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The estimator (with KL reward shaping) over rows that are each their own episode."""
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
    return compute_advantages(spec.estimator, inputs)


def _estimate_episodes(spec: AdvantageSpec, rewards_R: list[float], loss_masks_RT: list[list[int]],
                       final_of_R: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """One advantage per episode from its scored row, on every row of the episode (its mask)."""
    if spec.estimator not in SEQUENCE_ESTIMATORS or spec.kl_coef != 0:
        raise ValueError(f"rows of prior segments (--agent-segments all) need an estimator with one advantage "
                         f"per sample ({', '.join(sorted(SEQUENCE_ESTIMATORS))}) and --kl-coef 0, not "
                         f"{spec.estimator!r} with --kl-coef {spec.kl_coef:g}; set --agent-segments last")
    finals = sorted(set(final_of_R))
    # One token per scored row: a sequence estimator's value per episode (its rows' masks apply below).
    scored_B1, _ = _estimate(spec, [rewards_R[i] for i in finals], torch.ones(len(finals), 1), None, None, None)
    value = {i: float(scored_B1[j, 0]) for j, i in enumerate(finals)}
    adv_BT = torch.tensor([value[f] for f in final_of_R], dtype=torch.float32)[:, None] * padded(loss_masks_RT)
    return adv_BT, adv_BT.clone()


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
