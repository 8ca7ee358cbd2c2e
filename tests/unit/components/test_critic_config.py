"""The Critic's config plumbing: its optimizer settings and checkpoint directories."""

from __future__ import annotations

from relax.components.critic import critic_dirs, critic_optim
from relax.config.schema import RelaxConfig


def test_critic_lr_defaults_to_the_actor_lr_and_has_its_own_warmup():
    cfg = RelaxConfig().replace(lr=1e-3, lr_warmup_iters=5, clip_grad=0.5)
    assert (critic_optim(cfg).lr, critic_optim(cfg).lr_warmup_iters) == (1e-3, 0)
    cfg = cfg.replace(critic_lr=2e-4, critic_lr_warmup_iters=3)
    optim = critic_optim(cfg)
    assert (optim.lr, optim.lr_warmup_iters, optim.clip_grad) == (2e-4, 3, 0.5)
    assert cfg.optim.lr == 1e-3  # the actor's settings are untouched


def test_critic_checkpoints_default_to_a_folder_under_load_and_save():
    cfg = RelaxConfig()
    assert critic_dirs(cfg) == (None, None)
    cfg = cfg.replace(load="/ck/in", save="/ck/out")
    assert critic_dirs(cfg) == ("/ck/in/critic", "/ck/out/critic")
    cfg = cfg.replace(critic_load="/c/in", critic_save="/c/out")
    assert critic_dirs(cfg) == ("/c/in", "/c/out")
