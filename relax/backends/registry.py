"""Named backends -> where they live. Resolved once (by dotted path, imported lazily) so a
component never compares backend strings, one backend never imports another, and the config
(a lower layer) checks the engines' options through the callable the entrypoint hands it
(`check_engine_options`) instead of naming a backend itself."""

from __future__ import annotations

from typing import TYPE_CHECKING, Collection

from relax.utils.plugins import import_object

if TYPE_CHECKING:
    from relax.config.schema import RelaxConfig

TRAIN_BACKENDS: dict[str, str] = {
    "fsdp": "relax.backends.fsdp.runner.FSDPRunner",
    "megatron": "relax.backends.megatron.runner.MegatronRunner",
}

INFERENCE_BACKENDS: dict[str, str] = {
    "hf": "relax.backends.hf.launcher.launch_hf_engine",
    "sglang": "relax.backends.sglang.launcher.launch_sglang_engine",
}

# Inference backends whose engines load a LoRA adapter from disk by name (SGLang's /load_lora_adapter):
# a --lora-rank run pushes the adapter as peft files and every generate request names it (`lora_path`,
# added by the rollout's router). The others (the hf engine) take adapter tensors by broadcast.
ADAPTER_FILE_ENGINES: frozenset[str] = frozenset({"sglang"})

# An inference backend's check of its engines' options, `check(cfg)`: ValueError naming the flag
# for a wrong option, ImportError when the backend's own option parser does not import here.
# A backend without one takes any option (the hf engine keeps those it knows: ENGINE_OPTIONS).
ENGINE_OPTION_CHECKS: dict[str, str] = {
    "sglang": "relax.backends.sglang.args.check_engine_options",
}

# The `--sglang-<option>` names an inference backend's engines understand (the others are logged
# and dropped); a backend not listed here gets every option.
ENGINE_OPTIONS: dict[str, str] = {
    "hf": "relax.backends.hf.launcher.ENGINE_OPTIONS",
}


def check_engine_options(backend: str, cfg: RelaxConfig) -> None:
    """Check the `--sglang-*` options as inference backend `backend` will launch its engines with
    them (`relax.config.checks.backends.EngineCheck`, passed to `parse_config` by the entrypoint)."""
    path = ENGINE_OPTION_CHECKS.get(backend)
    if path is not None:
        import_object(path, flag=f"--rollout-backend {backend}")(cfg)


def engine_options(backend: str) -> Collection[str] | None:
    """The engine options inference backend `backend` understands; None: every option."""
    path = ENGINE_OPTIONS.get(backend)
    return None if path is None else import_object(path, flag="--rollout-backend")
