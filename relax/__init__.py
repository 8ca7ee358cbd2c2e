"""Relax: an asynchronous RL post-training engine for LLMs.

Importing this package imports nothing heavy (no torch, no ray), so `relax-train --help`
and config validation stay instant. In the processes a run starts (RELAX_STARTUP_GC=1, from
configs/env.yaml) it holds back Python's full garbage collections until their start-up ends
(`relax.utils.startup_gc`).
"""

__version__ = "0.1.0"

from relax.utils import startup_gc as _startup_gc

_startup_gc.defer()  # RELAX_STARTUP_GC=1 (configs/env.yaml, a run's processes): see relax/utils/startup_gc.py
