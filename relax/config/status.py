"""What each flag does in this build, in one word and a reason: the Status column of
docs/configuration.md (`scripts/tools/gen_config_docs.py`) and the walk over the seeds'
configuration reference (tests/unit/config/test_reference_flags.py).

- `acts`: read by the run (checked by the static test in tests/unit/config/checks/test_flag_declarations.py);
- `megatron`: acts under `--train-backend megatron`; the fsdp backend notes it as ignored;
- `needs`: a value needs hardware or a dependency this build excludes (the reason names it); the
  other values act;
- `no effect`: accepted, logged and shown by `--dry-run` with the reason;
- `not built`: accepted so scripts parse, an error when set.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from relax.config.checks.megatron import MEGATRON_NOT_BUILT
from relax.config.megatron_arch import MEGATRON_NO_EFFECT, MEGATRON_ONLY

Status = Literal["acts", "megatron", "needs", "no effect", "not built"]

# field -> what a value of it needs that this build excludes (the rest of its values act)
NEEDS: dict[str, str] = {
    "megatron_to_hf_mode": "bridge needs megatron-bridge, which needs transformers < 5 and Transformer Engine; this "
                           "project's pins exclude both (raw acts)",
    "record_memory_history": "the torch recorder needs a CUDA GPU (CUDA allocations; on CPU a logged note and no "
                             "snapshot); with --memory-recorder memray it acts on CPU too",
    "enable_cuda_memory_check": "needs a CUDA GPU (it logs free GPU memory before each collective; on CPU a logged "
                                "note and no effect)",
    "memory_recorder": "memray needs `pip install memray` (not a dependency of this project: an error at start when "
                       "missing); torch acts",
    "attention_backend": "fused needs Transformer Engine, which this project's pins exclude; unfused and local "
                         "(megatron-core's DotProductAttention) are not built: auto and flash act (PyTorch SDPA "
                         "attention) under the megatron backend",
    "train_memory_margin_bytes": "needs a CUDA GPU shared by the trainer and the engines (colocate): there each "
                                 "training pass leaves this much free; on CPU a plan note and no effect",
}


def flag_status(f: dataclasses.Field) -> tuple[Status, str]:
    """(status, reason) of a config field's flag."""
    meta = f.metadata
    if f.name in NEEDS:
        return "needs", NEEDS[f.name]
    if not meta.get("supported", True):
        return "not built", "an error when set"
    if meta.get("ignored") == MEGATRON_ONLY:
        if f.name in MEGATRON_NO_EFFECT:
            return "no effect", f"under both backends: {MEGATRON_NO_EFFECT[f.name]}"
        if f.name in MEGATRON_NOT_BUILT:
            return "not built", f"the megatron backend does not build it yet ({MEGATRON_NOT_BUILT[f.name][2]})"
        return "megatron", "acts with --train-backend megatron; noted as ignored under fsdp"
    if meta.get("ignored"):
        return "no effect", meta["ignored"]
    return "acts", ""


def status_text(f: dataclasses.Field) -> str:
    """The Status cell of docs/configuration.md."""
    status, reason = flag_status(f)
    return status if status == "acts" else f"{status}: {reason}"
