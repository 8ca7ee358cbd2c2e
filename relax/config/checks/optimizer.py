"""The optimizer-placement and overlap flags: what each combination means, for both backends.

`check_optimizer` (after the backends are resolved) rejects what would not act:
- `--use-precision-aware-optimizer` keeps Adam's moments in bfloat16: adam/adamw only (megatron's
  rule too; SGD's momentum has no precision-aware form here);
- `--overlap-param-gather` needs `--overlap-grad-reduce` (the seeds' reference and megatron), and
  under megatron `--use-distributed-optimizer` (what it overlaps is ZeRO-1's parameter broadcast).

Megatron also makes `--optimizer-cpu-offload` require its precision-aware optimizer and that one
the distributed optimizer; here neither is required: the offloaded optimizer (any of adam, adamw,
sgd, bfloat16 moments or not) works over whole or sharded state, and the seeds' launch scripts
pass the offload flags without `--use-distributed-optimizer`. Without it each data-parallel rank
keeps a whole copy on its host, which `optimizer_notes` says.

`optimizer_notes` (plan notes, printed by `--dry-run` and logged at start): what these flags do on
this run where it is less than their name says (a CPU run's copies, fsdp's built-in overlap).
"""

from __future__ import annotations

from relax.config.errors import ConfigError
from relax.config.schema import RelaxConfig


def check_optimizer(cfg: RelaxConfig) -> None:
    o = cfg.optim
    if o.use_precision_aware_optimizer and o.optimizer not in ("adam", "adamw"):
        raise ConfigError(f"--use-precision-aware-optimizer keeps Adam's moments in bfloat16; --optimizer "
                          f"{o.optimizer} has none: use --optimizer adam (or adamw), or drop the flag")
    if o.overlap_param_gather and not o.overlap_grad_reduce:
        raise ConfigError("--overlap-param-gather requires --overlap-grad-reduce (as in Megatron): add it, or drop "
                          "--overlap-param-gather")
    if cfg.cluster.train_backend == "megatron" and o.overlap_param_gather and not o.use_distributed_optimizer:
        raise ConfigError("--overlap-param-gather overlaps the distributed optimizer's parameter broadcast with the "
                          "next forward: add --use-distributed-optimizer, or drop --overlap-param-gather")


def optimizer_notes(cfg: RelaxConfig, device: str) -> list[str]:
    """Plan notes for the optimizer flags where this run does less than the flag's name says."""
    o, notes = cfg.optim, []
    if o.optimizer_cpu_offload and device == "cpu":
        notes.append("--optimizer-cpu-offload" + (" --overlap-cpu-optimizer-d2h-h2d" if o.overlap_cpu_optimizer_d2h_h2d
                                                  else "") + ": on CPU the optimizer state is on the host already; "
                     "its device<->host copies are plain copies (no pinned memory, no CUDA streams), the chunked "
                     "step schedule still runs")
    if o.optimizer_cpu_offload and not o.use_distributed_optimizer and cfg.cluster.train_backend == "megatron":
        notes.append("--optimizer-cpu-offload without --use-distributed-optimizer: every data-parallel rank keeps the "
                     "whole optimizer state on its host (Megatron requires the distributed optimizer here; this "
                     "build does not); add --use-distributed-optimizer to keep one shard per rank")
    fsdp_overlap = [flag for flag, on in (("--overlap-grad-reduce", o.overlap_grad_reduce),
                                          ("--overlap-param-gather", o.overlap_param_gather)) if on]
    if fsdp_overlap and cfg.cluster.train_backend == "fsdp":
        notes.append(f"{' '.join(fsdp_overlap)}: fsdp overlaps always: FSDP2 reduce-scatters each layer's gradients "
                     "while backward goes on and prefetches the next layer's parameter all-gather; nothing to switch")
    return notes
