"""Write docs/configuration.md from the config schema (one table per group).

Usage: python3 scripts/tools/gen_config_docs.py [--check]
--check exits 1 when the file on disk is out of date (the test suite runs this).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import typing

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from relax.config.fields import base_type, choices_of, field_default, flag_name  # noqa: E402
from relax.config.schema import GROUPS  # noqa: E402
from relax.config.status import status_text  # noqa: E402

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "configuration.md")

HEADER = """# Configuration reference

Generated from `relax/config/schema.py` by `scripts/tools/gen_config_docs.py`; do not edit by hand.

Every flag keeps the name and default of the Relax/slime configuration reference. Three kinds:
- Relax flags below. Internally each group is a typed dataclass (`cfg.rollout`, `cfg.optim`, ...);
  plugins receive the flat `args` namespace with the same names (`args.rollout_batch_size`).
- SGLang server options pass through as `--sglang-<option>` and are kept for the sglang backend; the `hf`
  engine takes the ones it has (`max_running_requests`, `context_length`, `dtype`, `random_seed`, ...) and logs
  the rest as unused.
- A flag not listed here is unknown to both training backends: it is an error at startup, naming
  the closest listed flag. The Megatron flags listed act with `--train-backend megatron`; with
  either backend the HF `config.json` is the source of truth and a contradicting architecture flag
  is an error.

Every flag acts, or says why not (the Status column, `relax/config/status.py`): *acts*; *megatron*:
acts with `--train-backend megatron` (the fsdp backend notes it as ignored); *needs*: a value needs
hardware or a dependency this build excludes (named); *no effect*: accepted, and setting it logs
the reason when the run starts (`relax-train --dry-run` prints it); *not built*: accepted so
existing launch scripts parse, but setting it fails at startup with a message. Nothing is silently
ignored; a flag that acts only with another one (`--tis-clip` without `--use-tis`) gets a note
naming it (`relax/config/inert.py`). tests/unit/config/test_reference_flags.py walks every flag of
the seeds' configuration reference against this table.
`--custom-config-path FILE.yaml` sets any flag by name (values are checked exactly as on the command
line), and any other key as an extra `args.<key>` for plugins.
"""


def type_name(hint: typing.Any, meta: dict) -> str:
    if meta.get("type") is not None:
        return meta["type"].__name__
    base = base_type(hint)
    name = "str" if choices_of(hint) else getattr(base, "__name__", str(base))
    if meta.get("nargs"):
        return f"{name} (list)"
    return "flag" if base is bool else name


def render() -> str:
    lines = [HEADER]
    for group_name, cls in GROUPS.items():
        doc = (cls.__doc__ or "").strip().split("\n")[0]
        lines += [f"\n## {group_name}\n", f"{doc}\n" if doc and not doc.startswith(cls.__name__) else "",
                  "| Flag | Type | Default | Status | Description |", "|---|---|---|---|---|"]
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            meta = dict(f.metadata)
            default = field_default(f)
            desc = meta.get("help", "")
            if choices_of(hints[f.name]):
                desc += f" Choices: {', '.join(map(str, choices_of(hints[f.name])))}."
            lines.append(f"| `{flag_name(f)}` | {type_name(hints[f.name], meta)} | `{default!r}` | {status_text(f)} | "
                         f"{desc} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    text = render()
    if "--check" in sys.argv:
        current = open(OUT).read() if os.path.exists(OUT) else ""
        if current != text:
            print("docs/configuration.md is out of date: run python3 scripts/tools/gen_config_docs.py")
            return 1
        return 0
    with open(OUT, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
