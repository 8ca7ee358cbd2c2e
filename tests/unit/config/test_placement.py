"""GPU placement: shares that never overfill a GPU, colocated roles on the same GPUs, fully
async roles on their own GPUs when there are enough, consecutive GPUs per engine."""

from __future__ import annotations

import pytest

from relax.config.placement import GpuAsk, PlacementError, describe, place_gpus, share


@pytest.mark.parametrize("processes", range(1, 12))
def test_shares_of_one_gpu_never_add_up_to_more_than_it(processes):
    assert share(processes) * processes <= 1.0 and share(processes) >= 1 / processes - 0.01


def test_colocated_roles_start_on_the_same_gpus_and_ranks_bring_their_cpus():
    p = place_gpus([GpuAsk("actor", 2, 1, 1.0), GpuAsk("rollout", 1, 2)], colocate=True, cluster_gpus=8)
    assert p.bundles == 2 and p.slots == {"actor": ((0,), (1,)), "rollout": ((0, 1),)}
    assert p.fraction == 0.5 and p.bundle_cpus == (1.0, 1.0) and "GPU 0: actor+rollout" in describe(p)


def test_fully_async_roles_get_whole_gpus_of_their_own_when_the_cluster_has_them():
    p = place_gpus([GpuAsk("actor", 2), GpuAsk("rollout", 2, 2)], colocate=False, cluster_gpus=8)
    assert p.bundles == 6 and not p.shared and p.fraction == 1.0
    assert p.slots == {"actor": ((0,), (1,)), "rollout": ((2, 3), (4, 5))}


def test_an_engine_never_wraps_round_the_last_gpu_and_must_fit_the_cluster():
    p = place_gpus([GpuAsk("actor", 1), GpuAsk("rollout", 1, 2)], colocate=False, cluster_gpus=2)
    assert p.slots["rollout"] == ((0, 1),) and p.fraction == 0.5
    with pytest.raises(PlacementError, match="an engine takes 4 GPUs"):
        place_gpus([GpuAsk("rollout", 1, 4)], colocate=True, cluster_gpus=2)
