"""Relax: an asynchronous RL post-training engine for LLMs.

Importing this package imports nothing heavy (no torch, no ray), so `relax-train --help`
and config validation stay instant.
"""

__version__ = "0.1.0"
