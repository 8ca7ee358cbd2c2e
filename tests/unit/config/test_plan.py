"""The run plan: roles, resources and placement, column producers and consumers, the partition's
clearer, weight receivers; `--resource` entries for roles not deployed; the cluster check;
`--dry-run`. (Flags a mode cannot use: checks/test_modes.py.)"""

from __future__ import annotations

import subprocess
import sys

import pytest

from relax.algorithms.advantages import BATCH_ESTIMATORS
from relax.config import PlanError, parse_config
from relax.config.plan import BATCH_ESTIMATORS as PLAN_BATCH_ESTIMATORS
from relax.config.plan import check_cluster, format_plan, resolve_plan
from relax.config.role_plans import StepPart
from relax.types import COLUMNS

FULLY_ASYNC = ["--fully-async", "--resource", '{"actor": [1, 1], "rollout": [1, 1], "actor_fwd": [1, 1], '
               '"reference": [1, 1], "advantages": [1, 0]}', "--use-kl-loss", "--kl-loss-coef", "0.1"]


def plan_of(args: list[str], gpus: float = 0):
    return resolve_plan(parse_config(args), gpus)


def flows(plan) -> dict[str, tuple[str, tuple[str, ...]]]:
    return {f.name: (f.producer, f.consumers) for f in plan.columns}


def test_colocate_plan_runs_every_per_step_computation_in_the_actor(base):
    plan = plan_of(base + ["--use-kl-loss", "--kl-loss-coef", "0.1", "--num-steps-per-rollout", "2"])
    assert plan.mode == "colocate" and [r.name for r in plan.roles] == ["actor", "rollout", "reference", "dcs"]
    assert plan.actor.loader == "whole_step" and plan.actor.computes == ("old_log_probs", "advantages")
    assert plan.actor.old_policy == "old_log_probs"
    assert plan.clearer == "actor" and plan.actor.clears and plan.weight_receivers == ("rollout",)
    assert flows(plan)["ref_log_probs"] == ("reference", ("actor",))
    assert "old_log_probs" not in flows(plan) and "advantages" not in flows(plan)  # computed in the Actor
    assert plan.role("reference").parts == StepPart.SCORES
    assert plan.roles_with(StepPart.SCORES) == (plan.role("reference"),)
    assert plan.rollout.release_memory and not plan.rollout.stream_groups


@pytest.mark.parametrize("extra, reuses", [
    ([], True),  # one optimizer step, one pass, on-policy: the training forward's log-probs are the old ones
    (["--num-steps-per-rollout", "2"], False), (["--num-iters-per-train-update", "2"], False),
    (["--kl-coef", "0.1"], False), (["--use-rollout-logprobs"], False),
    (FULLY_ASYNC, False),
])
def test_one_on_policy_pass_skips_the_old_log_prob_forward(base, extra, reuses):
    plan = plan_of(base + extra)
    assert (plan.actor.old_policy == "training_log_probs") == reuses
    assert ("old_log_probs" in plan.actor.computes) == (not reuses and plan.mode == "colocate"
                                                        and plan.actor.old_policy == "old_log_probs")


def test_fully_async_plan_streams_and_the_actor_computes_nothing(base):
    plan = plan_of(base + FULLY_ASYNC)
    assert [r.name for r in plan.roles] == ["actor", "rollout", "reference", "actor_fwd", "advantages", "dcs"]
    assert plan.actor.loader == "streaming" and plan.actor.computes == () and plan.actor.overlap_weight_push
    assert {r.name for r in plan.roles_with(StepPart.STREAMS)} == {"rollout", "reference", "actor_fwd", "advantages"}
    f = flows(plan)
    assert f["old_log_probs"] == ("actor_fwd", ("actor",)) and f["advantages"] == ("advantages", ("actor",))
    assert f["rewards"][1] == ("actor", "advantages") and "sample_indices" in plan.role("actor_fwd").reads
    assert plan.weight_receivers == ("rollout", "actor_fwd") and plan.rollout.stream_groups


def test_ppo_leaves_the_partition_to_the_critic_which_trains_after_the_actor(base):
    colocate = plan_of(base + ["--advantage-estimator", "ppo"])
    assert colocate.clearer == "critic" and not colocate.actor.clears
    assert colocate.actor.writes == ("returns",) and flows(colocate)["returns"] == ("actor", ("critic",))
    assert flows(colocate)["values"] == ("critic", ("actor", "critic"))
    critic = colocate.role("critic").parts
    assert StepPart.TRAINS_AFTER_ACTOR in critic and StepPart.CHECKPOINTS in critic
    assert [r.name for r in colocate.roles_with(StepPart.CHECKPOINTS)] == ["actor", "rollout", "critic"]
    fully_async = plan_of(base + FULLY_ASYNC + ["--advantage-estimator", "ppo", "--resource",
                                               '{"actor": [1, 1], "rollout": [1, 1], "critic": [1, 1]}'])
    assert flows(fully_async)["returns"] == ("advantages", ("critic",)) and fully_async.actor.writes == ()


def test_rollout_logprobs_drop_actor_fwd_and_are_the_old_policy(base):
    plan = plan_of(base + ["--fully-async", "--use-rollout-logprobs"])
    assert not plan.has("actor_fwd") and plan.actor.old_policy == "rollout_log_probs"
    assert plan_of(base + ["--use-rollout-logprobs"]).actor.computes == ("advantages",)


def test_every_column_in_the_plan_is_declared_once(base):
    for args in (base, base + FULLY_ASYNC, base + ["--advantage-estimator", "ppo", "--use-opd", "--opd-type",
                                                    "sglang", "--rm-url", "http://t:1/generate"]):
        plan = plan_of(args)
        assert all(f.name in COLUMNS for f in plan.columns)
        read = {c for r in plan.roles for c in r.reads}
        assert read <= {f.name for f in plan.columns}, "a role reads a column nobody writes"


def test_the_plan_and_the_algorithms_agree_on_batch_estimators():
    assert set(PLAN_BATCH_ESTIMATORS) == set(BATCH_ESTIMATORS)


@pytest.mark.parametrize("extra, needle", [
    (["--resource", '{"actor": [1, 1], "rollout": [1, 1], "actor_fwd": [1, 1]}'], "--resource actor_fwd: ActorFwd"),
    (["--resource", '{"actor": [1, 1], "rollout": [1, 1], "advantages": [1, 0]}'], "--resource advantages"),
    (["--resource", '{"actor": [1, 1], "rollout": [1, 1], "reference": [1, 1]}'], "--use-kl-loss"),
    (["--resource", '{"actor": [1, 1], "rollout": [1, 1], "genrm": [1, 1]}'], "--genrm-num-gpus"),
])
def test_resource_entries_for_roles_the_run_does_not_deploy_fail(base, extra, needle):
    with pytest.raises(PlanError, match=needle):
        plan_of(base + extra)


def test_offload_train_is_noted_on_cpu_and_acts_on_shared_gpus(base):
    cfg = parse_config(base + ["--offload-train"])
    assert any(n.startswith("--offload/--offload-train: on CPU") for n in resolve_plan(cfg, 0).notes)
    assert resolve_plan(cfg, 1).offload_train and resolve_plan(parse_config(base), 1).offload_train  # colocate default
    kept = parse_config(base + ["--no-offload-train", "--no-offload-rollout"])
    assert not resolve_plan(kept, 1).offload_train and not resolve_plan(kept, 1).rollout.release_memory
    assert resolve_plan(parse_config(base), 1).rollout.release_memory


def test_num_iters_per_train_update_acts_in_colocate_mode_too(base):
    assert plan_of(base + ["--num-iters-per-train-update", "3"]).actor.passes == 3


def test_colocate_shares_each_gpu_between_a_rank_and_an_engine(base):
    plan = plan_of(base + ["--resource", '{"actor": [1, 2], "rollout": [1, 2]}'], gpus=8)
    assert plan.gpus == 2 and plan.placement.shared and plan.placement.fraction == 0.5
    assert plan.role("actor").slots == ((0,), (1,)) and plan.role("rollout").slots == ((0,), (1,))
    assert plan.role("actor").gpus == 1 and plan.placement.bundle_cpus == (1.0, 1.0)
    assert "GPU 0: actor+rollout" in format_plan(plan)
    cpu = plan_of(base + ["--resource", '{"actor": [1, 2], "rollout": [1, 3]}'])
    assert cpu.gpus == 0 and cpu.placement is None and cpu.role("actor").cpus == pytest.approx(2.1)


def test_tensor_parallel_engines_take_consecutive_gpus(base):
    def tp_plan(resource: str, gpus: int, backend: str = "sglang"):
        cfg = parse_config(base + ["--resource", resource, "--rollout-num-gpus-per-engine", "2"])
        return resolve_plan(cfg.replace(rollout_backend=backend), gpus)  # (sglang itself needs a GPU to validate)

    plan = tp_plan('{"actor": [1, 4], "rollout": [1, 4]}', 4)
    assert plan.role("rollout").workers == 2 and plan.role("rollout").slots == ((0, 1), (2, 3))
    assert "(tp 2)" in format_plan(plan)
    with pytest.raises(PlanError, match="not a multiple of --rollout-num-gpus-per-engine 2"):
        tp_plan('{"actor": [1, 2], "rollout": [1, 3]}', 4)
    with pytest.raises(PlanError, match="an hf engine runs on one GPU"):
        tp_plan('{"actor": [1, 4], "rollout": [1, 4]}', 4, backend="hf")
    with pytest.raises(PlanError, match="an engine takes 2 GPUs .* the Ray cluster has 1"):
        tp_plan('{"actor": [1, 2], "rollout": [1, 2]}', 1)


def test_fully_async_gives_roles_their_own_gpus_when_there_are_enough_else_shares(base):
    own = plan_of(base + FULLY_ASYNC, gpus=8)
    assert own.gpus == 4 and not own.placement.shared and own.placement.fraction == 1.0
    assert [own.role(r).slots for r in ("actor", "rollout", "reference", "actor_fwd")] == [((0,),), ((1,),),
                                                                                          ((2,),), ((3,),)]
    one = plan_of(base + FULLY_ASYNC, gpus=1)
    assert one.gpus == 1 and one.placement.shared and one.placement.fraction == 0.25 and not one.offload_train
    two = plan_of(base + FULLY_ASYNC, gpus=2)  # laid round two GPUs: two processes on each
    assert two.placement.fraction == 0.5 and two.placement.sharing() == {0: ["actor", "reference"],
                                                                          1: ["rollout", "actor_fwd"]}


def test_a_plan_larger_than_the_cluster_fails_naming_what_is_missing(base):
    with pytest.raises(PlanError, match=r"needs 2 GPUs \(actor 1 rank on 1 GPU, rollout 2 engines on 2 GPUs, "
                                        r"reference 1 rank on 1 GPU\) but the Ray cluster has 1"):
        check_cluster(plan_of(base + ["--use-kl-loss", "--kl-loss-coef", "0.1", "--resource",
                                      '{"actor": [1, 1], "rollout": [1, 2], "reference": [1, 1]}'], gpus=2),
                      {"CPU": 16, "GPU": 1})
    packed = plan_of(base + ["--resource", '{"actor": [1, 1], "rollout": [1, 2]}'], gpus=1)  # laid round one GPU
    assert packed.gpus == 1 and packed.role("rollout").slots == ((0,), (0,)) and packed.placement.fraction == 0.33
    with pytest.raises(PlanError, match="Ray CPUs .* the Ray cluster has 2"):
        check_cluster(plan_of(base), {"CPU": 2})
    check_cluster(plan_of(base), {"CPU": 8})


def test_dry_run_prints_the_plan_quickly_without_torch_or_ray(base):
    code = ("import sys, time; t = time.time(); from relax.entrypoints.train import main\n"
            f"rc = main({base + FULLY_ASYNC + ['--dry-run']!r})\n"
            "assert 'torch' not in sys.modules and 'ray' not in sys.modules, 'heavy import'\n"
            "print('elapsed', time.time() - t); sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    for needle in ("mode: fully_async", "actor_fwd", "old_log_probs", "streaming loader", "partition cleared by: actor",
                   "rollout, actor_fwd through the DCS coordinator", "staleness: rollout runs at most 0"):
        assert needle in out.stdout


def test_format_plan_lists_every_role_and_column(base):
    plan = plan_of(base + FULLY_ASYNC)
    text = format_plan(plan)
    assert all(r.name in text for r in plan.roles) and all(f.name in text for f in plan.columns)


def test_num_data_storage_units_reserves_a_cpu_per_storage_unit(base):
    one, three = plan_of(base), plan_of(base + ["--num-data-storage-units", "3"])
    assert (one.data_plane_cpus, three.data_plane_cpus) == (2.0, 4.0)  # the controller, then one per unit
