"""The two errors a bad run description raises before anything starts.

`ConfigError`: a flag value or a combination of flags is wrong (raised while the flags are
parsed and checked, `relax.config.checks`, and by the input checks of `relax.config.preflight`).
`PlanError`: the flags are fine one by one but the run they describe cannot be deployed (the
run plan, `relax.config.plan`, or the cluster it joined). Both are ValueErrors whose message
names the flags and the fix; `relax-train` prints it and exits 2. In a module of their own so
every part of the config package can raise them without importing another part.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A bad flag value or combination; the message names the flags and the fix."""


class PlanError(ValueError):
    """The config asks for something this run cannot do (mode/flag combination, cluster size)."""
