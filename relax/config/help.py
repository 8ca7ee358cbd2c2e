"""`relax-train --help`: short and grouped.

`--help` prints one screen: what the groups are, each with a title and its best-known flags;
`--help GROUP` prints one group's flags with their help; `--help-all` prints every flag. The
titles are written here (`GROUP_TITLES`) rather than taken from the config classes, whose
undocumented dataclasses would print their generated signatures.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import shutil
import sys

from relax.config.choices import suggest
from relax.config.fields import field_default, flag_name
from relax.config.schema import GROUPS

# group -> (title, a few of its flags shown on the overview screen)
GROUP_TITLES: dict[str, tuple[str, tuple[str, ...]]] = {
    "cluster": ("Mode, resources and backends", ("--resource", "--colocate", "--fully-async", "--max-staleness",
                                                 "--train-backend", "--rollout-backend")),
    "ckpt": ("Model and checkpoints", ("--hf-checkpoint", "--load", "--save", "--save-interval")),
    "data": ("Prompt data and media", ("--prompt-data", "--input-key", "--label-key", "--apply-chat-template")),
    "rollout": ("Rollout, sampling and weight sync", ("--rollout-batch-size", "--n-samples-per-prompt",
                                                      "--num-rollout", "--rollout-max-response-len")),
    "agentic": ("Multi-turn environments and black-box agents", ("--rollout-interaction-env-path",
                                                                 "--agent-function-path", "--max-turns")),
    "batch": ("Batches and micro-batches", ("--global-batch-size", "--use-dynamic-batch-size",
                                            "--max-tokens-per-gpu", "--balance-data")),
    "parallel": ("Model parallelism and recomputation", ("--tensor-model-parallel-size",
                                                         "--recompute-granularity")),
    "optim": ("Optimizer and learning rate", ("--optimizer", "--lr", "--weight-decay", "--clip-grad", "--bf16")),
    "algo": ("Algorithm: advantages, losses, KL, OPD, critic", ("--advantage-estimator", "--use-kl-loss",
                                                                "--eps-clip", "--use-tis")),
    "eval": ("Evaluation", ("--eval-interval", "--eval-prompt-data", "--eval-config")),
    "reward": ("Rewards and GenRM judges", ("--rm-type", "--custom-rm-path", "--genrm-model-path")),
    "logging": ("Metrics and logging", ("--use-tensorboard", "--use-wandb", "--notify-urls")),
    "debug": ("Debugging and dumps", ("--debug-rollout-only", "--save-debug-rollout-data", "--dump-details")),
    "fault": ("Health checks and recovery", ("--use-fault-tolerance", "--use-health-check")),
    "elastic": ("Elastic scaling of the rollout engines", ("--autoscaler-config", "--scale-api")),
    "misc": ("Run directory, dry run, plugins", ("--exp-dir", "--dry-run", "--custom-config-path")),
    "megatron": ("Megatron architecture flags (checked against the HF config)", ("--num-layers", "--hidden-size")),
    "router": ("Rollout HTTP: the SlimeRouter and its middlewares, proxies", ("--use-slime-router",
                                                                            "--slime-router-middleware-paths")),
    "engine_profile": ("Profiling the inference engines per rollout step", ("--sglang-profile",
                                                                           "--sglang-profile-steps")),
    # (its flags in the title: one line on the overview screen)
    "train_profile": ("Training ranks' profiler and memory tools: --use-pytorch-profiler, --record-memory-history",
                      ()),
    "lora": ("LoRA adapters (docs/lora.md)", ("--lora-rank", "--lora-alpha", "--lora-target-modules")),
    "train_memory": ("Training ranks' weight copies and memory: --keep-old-actor, --train-memory-margin-bytes", ()),
}

USAGE = "relax-train [--flag VALUE ...]"
FOOTER = ("Booleans take --flag, --flag true or --flag false. SGLang server options pass through as "
          "--sglang-<option>.\ndocs/configuration.md lists every flag with its type, default and status.")


def group_title(name: str) -> str:
    return GROUP_TITLES.get(name, (name, ()))[0]


def overview(description: str) -> str:
    """The one-screen `--help`: every group with its title, size and best-known flags."""
    lines = [f"usage: {USAGE}", "", description, "",
             "flag groups (relax-train --help GROUP shows one; --help-all shows every flag):"]
    for name, cls in GROUPS.items():
        title, known = GROUP_TITLES.get(name, (name, ()))
        lines.append(f"  {name:<9} {title} ({len(dataclasses.fields(cls))} flags)")
        if known:
            lines.append(f"  {'':<9}   {' '.join(known)}")
    return "\n".join(lines + ["", FOOTER]) + "\n"


def _first_sentence(text: str) -> str:
    head = re.split(r"\.\s+(?=[A-Z])", text, maxsplit=1)[0].strip()
    return head if head.endswith(".") else head + "."


def group_help(name: str, width: int | None = None) -> str:
    """`--help GROUP`: one line per flag (its first sentence and default), one screen; the full
    text of each is in `--help-all` and docs/configuration.md."""
    width = width or max(100, shutil.get_terminal_size((100, 40)).columns)
    fields = dataclasses.fields(GROUPS[name])
    pad = min(40, max(len(flag_name(f)) for f in fields) + 2)
    lines = [f"usage: {USAGE}", "", f"{name}: {group_title(name)}"]
    for f in fields:
        default = field_default(f)
        shown = "" if default in (None, False, "", {}, []) else f" [{default!r}]"
        line = f"  {flag_name(f):<{pad}} {_first_sentence(f.metadata.get('help', ''))}{shown}"
        lines.append(line if len(line) <= width else line[: width - 3] + "...")
    return "\n".join(lines + ["", "relax-train --help-all shows each flag's full help.", FOOTER]) + "\n"


def unknown_group(name: str) -> str:
    return (f"--help {name}: no such flag group (groups: {', '.join(GROUPS)}){suggest(name, GROUPS)}; "
            "relax-train --help-all lists every flag")


class HelpAction(argparse.Action):
    """`--help` (overview) or `--help GROUP` (one group); exits 0, or 2 for an unknown group."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs="?", default=argparse.SUPPRESS, metavar="GROUP",
                         help="show the flag groups, or one group's flags")

    def __call__(self, parser, namespace, values, option_string=None):
        if values is not None and values not in GROUPS:
            parser.exit(2, f"{parser.prog}: error: {unknown_group(values)}\n")
        sys.stdout.write(overview(parser.description or "") if values is None else group_help(values))
        parser.exit(0)


class HelpAllAction(argparse.Action):
    """`--help-all`: every flag of every group."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help="show every flag")

    def __call__(self, parser, namespace, values, option_string=None):
        parser.print_help(sys.stdout)
        parser.exit(0)


def group_flags(name: str) -> list[str]:
    """The flags of group `name` (for tests and the docs)."""
    return [flag_name(f) for f in dataclasses.fields(GROUPS[name])]
