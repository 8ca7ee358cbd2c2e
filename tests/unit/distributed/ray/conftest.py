"""One local Ray for the tests of relax.distributed.ray, with two logical GPUs (Ray counts them;
no test here touches a device) so the GPU bookkeeping runs on a CPU machine."""

from __future__ import annotations

import os

import pytest
import ray


@pytest.fixture(scope="session")
def ray_local():
    started_here = not ray.is_initialized()  # a one-process run of the suite has the integration cluster up
    if started_here:
        # Ray refuses logical GPUs when CUDA_VISIBLE_DEVICES lists none (tests/unit/backends/megatron/conftest.py
        # sets it empty for the whole process to hide GPUs): the count given here is the whole truth.
        hidden = os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        try:
            ray.init(num_cpus=4, num_gpus=2, include_dashboard=False, log_to_driver=False)
        finally:
            if hidden is not None:
                os.environ["CUDA_VISIBLE_DEVICES"] = hidden
    yield
    if started_here:
        ray.shutdown()
