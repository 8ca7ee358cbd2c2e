"""Which GPU every training rank and inference engine of a run sits on, and what share of it.

A run on GPUs holds one Ray placement group with one bundle per GPU it uses; every process
that needs a GPU (a training rank, one GPU of an engine) is put on a bundle and reserves the
same fraction of it. `place_gpus` decides this from what each role asks for, purely:

- colocate: the roles take turns on the same GPUs (rollout, then scoring and training), so
  every role starts at bundle 0 and the run needs as many GPUs as its largest role;
- fully async, when the cluster has a GPU for every process: each role gets GPUs of its own,
  in deploy order, whole;
- on fewer GPUs than that (either mode): the processes are laid round the GPUs there are and
  hold their share of a GPU at once (a one-GPU run still runs, each process with less memory).
  An engine's GPUs (tensor parallelism) are always consecutive GPUs of its own.

The fraction is 1 / (most processes on one GPU), so Ray's accounting matches what shares a
GPU. No Ray import: the plan prints before Ray starts.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuAsk:
    """One role's GPU needs: `workers` processes (ranks) or engines of `gpus_each` GPUs."""

    role: str
    workers: int
    gpus_each: int = 1
    cpus_each: float = 0.0  # CPUs each worker holds (training ranks 1; engines' GPU slots 0)

    @property
    def gpus(self) -> int:
        return self.workers * self.gpus_each


@dataclass(frozen=True)
class GpuPlacement:
    bundles: int  # GPUs of the run's placement group, one bundle each
    fraction: float  # of a GPU that each process reserves
    shared: bool  # roles share GPUs (colocate, or fully async on fewer GPUs than processes)
    slots: dict[str, tuple[tuple[int, ...], ...]]  # role -> per worker, the bundles it runs on
    bundle_cpus: tuple[float, ...]  # CPUs each bundle holds for the processes placed on it

    def role_slots(self, role: str) -> tuple[tuple[int, ...], ...]:
        return self.slots.get(role, ())

    def sharing(self) -> dict[int, list[str]]:
        """Bundle -> the roles with a process on it (for the plan's printout)."""
        out: dict[int, list[str]] = {}
        for role, per_worker in self.slots.items():
            for bundle in sorted({b for worker in per_worker for b in worker}):
                out.setdefault(bundle, []).append(role)
        return dict(sorted(out.items()))


class PlacementError(ValueError):
    """The roles cannot be placed on the GPUs there are."""


def share(processes: int) -> float:
    """The GPU fraction each of `processes` processes on one GPU reserves (2 decimals, rounded
    down, so that their sum never exceeds the bundle's one GPU)."""
    return 1.0 if processes <= 1 else int(100 / processes) / 100


def place_gpus(asks: list[GpuAsk], *, colocate: bool, cluster_gpus: int) -> GpuPlacement:
    """Bundles for every process of `asks` (see the module doc)."""
    asks = [a for a in asks if a.gpus > 0]
    if not asks:
        return GpuPlacement(0, 1.0, False, {}, ())
    widest = max(a.gpus_each for a in asks)
    needed = max(a.gpus for a in asks) if colocate else sum(a.gpus for a in asks)
    bundles = min(needed, cluster_gpus)
    shared = colocate or needed > cluster_gpus
    if widest > bundles:
        raise PlacementError(f"an engine takes {widest} GPUs (--rollout-num-gpus-per-engine) but the Ray cluster "
                             f"has {cluster_gpus}; lower it")
    slots: dict[str, tuple[tuple[int, ...], ...]] = {}
    load, cpus = [0] * bundles, [0.0] * bundles
    offset = 0
    for ask in asks:
        start = 0 if colocate else offset
        per_worker = []
        for w in range(ask.workers):
            first = (start + w * ask.gpus_each) % bundles
            if first + ask.gpus_each > bundles:  # an engine's GPUs are consecutive: do not wrap one
                first = 0
            gpus = tuple(range(first, first + ask.gpus_each))
            for b in gpus:
                load[b] += 1
            cpus[first] += ask.cpus_each
            per_worker.append(gpus)
        slots[ask.role] = tuple(per_worker)
        offset = (start + ask.gpus) % bundles
    return GpuPlacement(bundles, share(max(load)), shared or max(load) > 1, slots, tuple(cpus))


def describe(placement: GpuPlacement) -> str:
    """One line for the plan: which roles share which GPU and with what fraction."""
    if not placement.bundles:
        return "no GPU process"
    if not placement.shared:
        return f"{placement.bundles} GPU(s), one process per GPU (whole GPUs)"
    groups = ", ".join(f"GPU {b}: {'+'.join(roles)}" for b, roles in placement.sharing().items())
    return f"{placement.bundles} GPU(s) shared, {placement.fraction:g} of a GPU per process ({groups})"
