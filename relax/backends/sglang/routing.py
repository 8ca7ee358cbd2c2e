"""SGLang's routed experts for rollout routing replay (R3, docs/moe.md): which SGLang can return them.

SGLang 0.5.7 added the server flag `--enable-return-routed-experts` (`ServerArgs.
enable_return_routed_experts`) and the request field `return_routed_experts`; the reply's
`meta_info["routed_experts"]` is base64 of int32 `[seqlen - 1, num_hidden_layers, top_k]` (0.5.7:
`detokenizer_manager._extract_routed_experts`; 0.5.23: `state_capturer/routed_experts.py`, the same
encoding). SGLang 0.5.8 added `routed_experts_start_len` (the reply then starts at that position),
which the rollout sends on every request so a resumed or multi-turn sample gets only the positions
it lacks: Relax needs SGLang >= 0.5.8. `routed_experts_options` says so, naming the version
installed, before an engine is launched (`launcher.py`) and when the run's flags are checked
(`args.check_engine_options`); the version is read from the package metadata, without importing
SGLang.
"""

from __future__ import annotations

import re
from importlib import metadata
from typing import Any, Mapping

MIN_VERSION = (0, 5, 8)
OPTION = "enable_return_routed_experts"


def parse_version(text: str) -> tuple[int, ...]:
    """"0.5.8.post1" -> (0, 5, 8); the release numbers only."""
    return tuple(int(part) for part in re.findall(r"\d+", text.split("+")[0].split(".post")[0].split("rc")[0])[:3])


def installed_version() -> str | None:
    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return None


def routed_experts_options(version: str | None) -> dict[str, Any]:
    """The server options that make SGLang `version` record routed experts; ValueError naming the
    version needed when it cannot."""
    need = ".".join(map(str, MIN_VERSION))
    if version is None:
        raise ValueError(f"--use-rollout-routing-replay needs sglang >= {need} (--enable-return-routed-experts, "
                         "routed_experts_start_len); sglang is not installed")
    if parse_version(version) < MIN_VERSION:
        raise ValueError(f"--use-rollout-routing-replay needs sglang >= {need} (the routed experts of a request "
                         f"from routed_experts_start_len on); sglang {version} is installed: upgrade it "
                         f"(pip install 'sglang>={need}') or use --rollout-backend hf")
    return {OPTION: True}


def check_options(options: Mapping[str, Any], version: str | None = None) -> None:
    """Engine `options` that ask for routed experts need an SGLang that returns them."""
    if options.get(OPTION):
        routed_experts_options(version if version is not None else installed_version())
