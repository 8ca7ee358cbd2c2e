"""The LoRA flags (`LoraConfig`, one config group of `schema.RelaxConfig`, kept apart from schema.py for
its size), their checks, and what the other layers derive from them.

LoRA (Hu et al. 2021, arXiv 2106.09685): every targeted linear layer keeps its weight W0 [out, in]
frozen and learns y = W0 x + (alpha / r) * B A dropout(x), with A [r, in] (random) and B [out, r]
(zeros, so a run starts from the base model). Only A and B train, only A and B are pushed to the
engines and checkpointed, and the Reference is W0 alone (the adapter switched off in the actor's own
ranks, no second copy of the weights). docs/lora.md has the whole story.

The flags are named as the `peft` package and the peers (verl, TRL) name them: `--lora-rank`
(peft's `r`; 0 = off), `--lora-alpha`, `--lora-target-modules` (a comma list of module names, each
matching a module whose dotted name ends with it, or `all-linear`: every linear layer but the output
layer), `--lora-dropout`. The seeds' configuration reference names none of them; defaults follow verl
(alpha 16, all-linear) and peft (dropout 0). No torch import (config is a leaf).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from relax.config.fields import opt

ALL_LINEAR = "all-linear"  # peft's spelling: every nn.Linear but the output layer
ADAPTER_NAME = "relax-policy"  # the adapter's name on engines that keep named adapters (SGLang)


@dataclass(frozen=True)
class LoraConfig:
    """LoRA adapters: the actor trains low-rank adapters on a frozen base model (docs/lora.md)."""

    lora_rank: int = opt(0, "LoRA rank r (peft's `r`); 0 = off (full fine-tuning). > 0: the actor trains only "
                         "low-rank adapters on the frozen base model, checkpoints and pushes only them, and the "
                         "Reference is the base model with the adapter off (docs/lora.md). fsdp backend only.")
    lora_alpha: int = opt(16, "LoRA scaling numerator: the adapter's output is scaled by alpha / r.")
    lora_target_modules: str = opt(ALL_LINEAR, "Modules that get adapters, as peft takes them: a comma list of "
                                   "names (q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj; a name matches "
                                   "every module whose dotted name ends with it) or all-linear (every linear layer "
                                   "but the output layer).")
    lora_dropout: float = opt(0.0, "Dropout on the adapter's input during training (peft's lora_dropout). "
                              "Non-zero makes the training forward differ from the old-policy forward, so the "
                              "first step's PPO ratio is no longer exactly 1.")


@dataclass(frozen=True)
class LoraSpec:
    """What a model needs to carry adapters (the trainer's and the engine's): rank, alpha, the target
    module names (`(ALL_LINEAR,)` for all of them) and the training dropout."""

    rank: int
    alpha: float
    targets: tuple[str, ...] = (ALL_LINEAR,)
    dropout: float = 0.0

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    def as_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "alpha": self.alpha, "targets": list(self.targets), "dropout": self.dropout}


def parse_targets(text: str) -> tuple[str, ...]:
    """`--lora-target-modules` -> module names: "q_proj, v_proj" -> ("q_proj", "v_proj"); "all-linear"
    -> ("all-linear",). ValueError for an empty list or all-linear mixed with names."""
    names = tuple(n for n in re.split(r"[,\s]+", text.strip()) if n)
    if not names:
        raise ValueError("--lora-target-modules is empty: give module names (q_proj,v_proj) or all-linear")
    if ALL_LINEAR in names and len(names) > 1:
        raise ValueError(f"--lora-target-modules {text!r}: all-linear already takes every linear layer; "
                         "give it alone or list the names")
    bad = [n for n in names if not re.fullmatch(r"[A-Za-z_][\w.]*", n) and n != ALL_LINEAR]
    if bad:
        raise ValueError(f"--lora-target-modules: {bad[0]!r} is not a module name (letters, digits, _ and .)")
    return names


def lora_spec(cfg: Any) -> LoraSpec | None:
    """The run's adapters (None: --lora-rank 0, full fine-tuning)."""
    lora: LoraConfig = cfg.lora
    if lora.lora_rank <= 0:
        return None
    return LoraSpec(lora.lora_rank, float(lora.lora_alpha), parse_targets(lora.lora_target_modules),
                    lora.lora_dropout)


def check_lora_values(lora: LoraConfig) -> None:
    """Ranges of the LoRA flags; ValueError naming the flag."""
    if lora.lora_rank < 0:
        raise ValueError(f"--lora-rank must be >= 0 (0 = off), got {lora.lora_rank}")
    if lora.lora_alpha <= 0:
        raise ValueError(f"--lora-alpha must be > 0, got {lora.lora_alpha}")
    if not 0.0 <= lora.lora_dropout < 1.0:
        raise ValueError(f"--lora-dropout must be in [0, 1), got {lora.lora_dropout}")
    parse_targets(lora.lora_target_modules)


def lora_conflicts(cfg: Any) -> list[str]:
    """What a LoRA run (--lora-rank > 0) cannot be combined with, each naming the flags and the fix."""
    a, c = cfg.algo, cfg.cluster
    kl, sglang = a.use_kl_loss or a.kl_coef != 0, c.rollout_backend == "sglang"
    found = [why for why, on in (
        ("--ref-update-interval: with --lora-rank the Reference is the frozen base model (the adapter off); "
         "drop --ref-update-interval", a.ref_update_interval is not None),
        ("--resource reference: with --lora-rank the actor's own ranks score the Reference (its base model "
         "with the adapter off, no second copy of the weights); drop the entry", "reference" in (c.resource or {})),
        ("--fully-async with --use-kl-loss / --kl-coef: the LoRA Reference is scored by the colocate Actor; "
         "use --colocate or drop the KL", c.fully_async and kl),
        ("--fully-async with --rollout-backend sglang: SGLang swaps the adapter by unload and load, which in-flight "
         "requests would block; use --colocate or --rollout-backend hf", c.fully_async and sglang),
        ("--only-train-params-name-list / --freeze-params-name-list: with --lora-rank only the adapters train; "
         "drop them", bool(cfg.optim.only_train_params_name_list or cfg.optim.freeze_params_name_list)),
        ("--sglang-router-ip with --rollout-backend sglang: every request must name the adapter (lora_path), which "
         "Relax's built-in router adds; drop --sglang-router-ip / --sglang-router-port",
         sglang and cfg.rollout.sglang_router_ip is not None),
        ("--debug-rollout-only: the engines' adapters start at zero and are never trained; drop --lora-rank",
         cfg.debug.debug_rollout_only)) if on]
    return found


def engine_lora_options(cfg: Any, *, alpha: bool) -> dict[str, Any]:
    """The rollout engines' LoRA launch options in SGLang's `ServerArgs` names (`--enable-lora`,
    `--max-lora-rank`, `--lora-target-modules`); `alpha`: also `lora_alpha` (the hf engine's option:
    SGLang reads alpha from each adapter's adapter_config.json). {} without LoRA."""
    spec = lora_spec(cfg)
    if spec is None:
        return {}
    options: dict[str, Any] = {"enable_lora": True, "max_lora_rank": spec.rank,
                               "lora_target_modules": list(spec.targets)}
    if alpha:
        options["lora_alpha"] = spec.alpha
    return options


def lora_summary(cfg: Any) -> list[str]:
    """The plan's line about the adapters ([] without LoRA)."""
    spec = lora_spec(cfg)
    if spec is None:
        return []
    return [f"lora: rank {spec.rank}, alpha {spec.alpha:g}, targets {','.join(spec.targets)}; the actor trains and "
            "pushes the adapter only" + ("; reference = the base model (adapter off), scored by the actor"
                                        if cfg.algo.use_kl_loss or cfg.algo.kl_coef != 0 else "")]
