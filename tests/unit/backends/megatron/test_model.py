"""--custom-model-provider-path (`relax.backends.megatron.model.provided_model`): the provider is
called with keywords as slime calls it, plus the optional ones it names (`vp_stage`, `config`,
`default_provider`); what it returns must be a module. (A provider wrapping the default model trains
as the default one does: test_parity.py's bshd case.)"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("megatron.core")

from relax.backends.megatron.model import provided_model  # noqa: E402
from relax.utils.plugins import PluginError  # noqa: E402

CALLS: list[dict] = []


def seed_provider(pre_process=True, post_process=True, vp_stage=None):
    CALLS.append({"pre_process": pre_process, "post_process": post_process, "vp_stage": vp_stage})
    return torch.nn.Linear(2, 2)


def wrapping_provider(pre_process, post_process, default_provider, config):
    CALLS.append({"config": config})
    return default_provider(pre_process=pre_process, post_process=post_process)


def not_a_model(pre_process, post_process):
    return "a model"


def default(pre_process: bool = True, post_process: bool = True) -> torch.nn.Module:
    return torch.nn.Identity()


def test_the_provider_gets_the_keywords_it_names():
    CALLS.clear()
    model = provided_model(f"{__name__}.seed_provider", default, config="cfg", pre_process=True, post_process=False)
    assert isinstance(model, torch.nn.Linear)
    assert CALLS == [{"pre_process": True, "post_process": False, "vp_stage": None}]
    assert isinstance(provided_model(f"{__name__}.wrapping_provider", default, config="cfg", pre_process=False,
                                     post_process=True), torch.nn.Identity)
    assert CALLS[-1] == {"config": "cfg"}


def test_a_provider_must_return_a_module():
    with pytest.raises(PluginError, match="--custom-model-provider-path: .*not_a_model returned str, not a "
                                          r"torch.nn.Module; expected model_provider\(pre_process, post_process"):
        provided_model(f"{__name__}.not_a_model", default, config=None, pre_process=True, post_process=True)
