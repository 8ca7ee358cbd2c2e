"""The pure decisions of the scaling operations (no I/O, tested directly).

- `PARTIAL_SUCCESS` (`--scale-out-partial-success-policy`): given which new engines came up and which
  failed, the ones a scale-out keeps: `rollback_all` keeps none unless all came up, `keep_partial`
  keeps those that came up.
- `pick_victims`: which engines a scale-in drains: the newest unprotected active ones, never the last
  engine taking requests; or the ones the request names, refused when protected or unknown.
- `scale_in_count` / `scale_out_count`: a request's `num_engines` / `target_engines` as a count.
"""

from __future__ import annotations

from typing import Any, Callable

from relax.engine.elastic.operations import ScalingError

KeepRule = Callable[[list[str], list[str]], list[str]]


def rollback_all(up: list[str], failed: list[str]) -> list[str]:
    """Keep the new engines only when every one came up."""
    return [] if failed else list(up)


def keep_partial(up: list[str], failed: list[str]) -> list[str]:
    """Keep every new engine that came up."""
    return list(up)


PARTIAL_SUCCESS: dict[str, KeepRule] = {"rollback_all": rollback_all, "keep_partial": keep_partial}


def active(engines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in engines if e["state"] == "active"]


def scale_out_count(request: dict[str, Any], engines: list[dict[str, Any]]) -> int:
    """How many engines a ray_native scale-out adds (`num_engines`, or up to `target_engines`)."""
    if "target_engines" in request:
        return max(0, request["target_engines"] - len([e for e in engines if e["state"] != "draining"]))
    return int(request["num_engines"])


def scale_in_count(request: dict[str, Any], engines: list[dict[str, Any]]) -> int:
    """How many engines a scale-in removes (`num_engines`, or down to `target_engines`)."""
    if "target_engines" in request:
        return max(0, len(active(engines)) - request["target_engines"])
    return int(request["num_engines"])


def pick_victims(engines: list[dict[str, Any]], count: int = 0, named: list[str] | None = None) -> list[dict]:
    """The engines a scale-in drains (module doc); ScalingError naming the problem and the fix."""
    serving = active(engines)
    if named:
        by_name = {e["id"]: e for e in engines} | {e["address"]: e for e in engines}
        unknown = [n for n in named if n not in by_name]
        if unknown:
            raise ScalingError(404, f"engines: no engine {unknown}; engines are {[e['id'] for e in engines]} "
                               "(GET /fleet)")
        chosen = list({by_name[n]["address"]: by_name[n] for n in named}.values())
        protected = [e["id"] for e in chosen if e["protected"]]
        if protected:
            raise ScalingError(409, f"engines {protected} are protected (the run started with them); only engines "
                               "added by scaling can be scaled in")
        idle = [e["id"] for e in chosen if e["state"] != "active"]
        if idle:
            raise ScalingError(409, f"engines {idle} are not active (joining or already draining)")
    else:
        removable = [e for e in serving if not e["protected"]]
        if count > len(removable):
            raise ScalingError(409, f"num_engines {count}: only {len(removable)} engine(s) can be scaled in "
                               f"({len(serving) - len(removable)} of the {len(serving)} active ones are protected: "
                               "the run started with them)")
        chosen = removable[::-1][:count]  # the newest first
    if len(chosen) >= len(serving):
        raise ScalingError(409, f"scaling in {len(chosen)} engine(s) would leave none of the {len(serving)} active "
                           "ones taking requests; keep at least one")
    return chosen
