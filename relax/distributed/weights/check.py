"""--check-weight-update-equal: after a push, every engine holds exactly what the trainer sent.

Rank 0 runs `WeightCheck` around each push to a lane (`relax.backends.trainer.weights_out`), with
what each engine offers (training ranks that take weights, `RayEndpoint`s, are not engines and are
not checked):
- the hf engine (its /server_info lists `weights_checker_by_name`): after every push,
  `/weights_checker {"action": "checksum", "names": [...]}` returns a checksum and the dtype of each
  named tensor it holds (by HF name, fused MoE experts per expert: the names a push uses). Rank 0
  hashes each tensor it sent, cast to the engine's dtype (the engine's load casts the same way), and
  any difference, or a name the engine lacks, is a `WeightMismatch` naming the tensors and the engine.
- SGLang (its `/weights_checker`, SGLang's `WeightChecker`): it holds SGLang's own tensors (fused
  qkv, tensor-parallel shards), so nothing compares by name with the trainer's HF tensors. As slime
  does, before the run's first push (version 0: a fresh run, whose weights are the checkpoint the
  engines loaded) each engine copies its weights to the host and overwrites them with random values
  (`snapshot`, `reset_tensors`); after the push `compare` checks that every tensor equals the
  snapshot again, so every tensor was pushed, converted and loaded exactly. After every push the
  engines' per-GPU `checksum`s must agree with each other (an engine that loaded less is caught).
  A resumed run (first push > 0) gets the agreement check only, which the log says.

A mismatch is a bug, not a fault: `WeightMismatch` is no `WeightSyncError`, so fault tolerance never
retries it. Cost: the engine hashes its weights (copied to the host) and rank 0 what it sent, each
push; the SGLang snapshot holds a host copy of each engine's weights until the first compare.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Sequence

import torch

from relax.distributed.weights.checksums import tensor_checksum
from relax.distributed.weights.endpoints import CHECKSUMS, RayEndpoint, receiver_features
from relax.distributed.weights.protocol import BucketRejected, EndpointMissing, parse_dtype

logger = logging.getLogger(__name__)

PATH = "/weights_checker"
SHOWN = 5  # mismatching tensors named in an error (the count says how many more)


class WeightMismatch(RuntimeError):
    """An engine does not hold what the trainer pushed (--check-weight-update-equal)."""


class _Sent:
    """Checksums of the pushed tensors, per dtype an engine holds them in (each computed once)."""

    def __init__(self, named: Sequence[tuple[str, torch.Tensor]]) -> None:
        self.tensors = dict(named)
        self._sums: dict[tuple[str, str], str] = {}

    def checksum(self, name: str, dtype: str) -> str:
        if (name, dtype) not in self._sums:
            tensor = self.tensors[name]
            held = parse_dtype(dtype)
            self._sums[name, dtype] = tensor_checksum(tensor if tensor.dtype == held else tensor.to(held))
        return self._sums[name, dtype]


class WeightCheck:
    """Rank 0's check of each push on the engines (see the module doc); `timeout_s` per request."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.kinds: dict[str, str] = {}  # receiver -> "hf" | "sglang" | "rank"
        self.snapshots: set[str] = set()  # SGLang engines whose snapshot awaits the compare
        self.first_done = False

    async def _kind(self, receiver: Any) -> str:
        key = str(receiver)
        if key not in self.kinds:
            self.kinds[key] = "rank" if isinstance(receiver, RayEndpoint) else (
                "hf" if CHECKSUMS in await receiver_features(receiver) else "sglang")
        return self.kinds[key]

    async def _engines(self, receivers: Sequence[Any], kind: str) -> list[Any]:
        return [r for r in receivers if await self._kind(r) == kind]

    async def _post(self, receiver: Any, payload: dict[str, Any]) -> dict[str, Any]:
        try:
            return await receiver.post(PATH, payload, self.timeout_s)
        except EndpointMissing as exc:
            raise WeightMismatch(f"--check-weight-update-equal: {receiver} has no {PATH} (an SGLang without its "
                                 "weights checker); use the hf engine (--rollout-backend hf) or drop the flag") from exc
        except BucketRejected as exc:  # {"success": false}: the checker's own verdict
            raise WeightMismatch(f"--check-weight-update-equal: {receiver}{PATH} {payload['action']}: {exc}") from exc

    async def before(self, receivers: Sequence[Any], version: int) -> None:
        """Before the run's first push: SGLang engines snapshot the checkpoint they loaded, then
        overwrite it, so that the compare after the push sees only what the push brought."""
        first, self.first_done = not self.first_done, True
        sglang = await self._engines(receivers, "sglang")
        if not first or not sglang:
            return
        if version != 0:
            logger.info("--check-weight-update-equal: the run resumes at weight version %d, so the SGLang engines "
                        "(which loaded the checkpoint) are only checked for agreeing with each other", version)
            return
        for action in ("snapshot", "reset_tensors"):
            await asyncio.gather(*(self._post(r, {"action": action}) for r in sglang))
        self.snapshots |= {str(r) for r in sglang}

    async def after(self, receivers: Sequence[Any], named: Sequence[tuple[str, torch.Tensor]],
                    version: int) -> dict[str, float]:
        """Check every engine among `receivers` after the push of `version`; raises WeightMismatch."""
        start = time.perf_counter()
        hf, sglang = await self._engines(receivers, "hf"), await self._engines(receivers, "sglang")
        if not hf and not sglang:
            return {}
        if hf:
            sent = _Sent(named)
            replies = await asyncio.gather(*(self._post(r, {"action": "checksum", "names": list(sent.tensors)})
                                             for r in hf))
            for receiver, reply in zip(hf, replies):
                await asyncio.to_thread(_compare, receiver, reply, sent, version)
        if sglang:
            await self._check_sglang(sglang, version)
        seconds = time.perf_counter() - start
        logger.info("weight check v%d: %d engine(s) hold what was pushed (%.2fs)", version, len(hf) + len(sglang),
                    seconds)
        return {"weight_sync/checked_engines": float(len(hf) + len(sglang)), "weight_sync/check_seconds": seconds}

    async def _check_sglang(self, engines: list[Any], version: int) -> None:
        due = [r for r in engines if str(r) in self.snapshots]
        await asyncio.gather(*(self._post(r, {"action": "compare"}) for r in due))
        self.snapshots -= {str(r) for r in due}
        replies = await asyncio.gather(*(self._post(r, {"action": "checksum"}) for r in engines))
        per_engine = {str(r): sorted(rank["per_gpu_checksum"] for rank in reply.get("ranks") or [])
                      for r, reply in zip(engines, replies)}
        if len({tuple(v) for v in per_engine.values()}) > 1:
            raise WeightMismatch(f"weight push v{version}: the SGLang engines hold different weights after it "
                                 f"(per-GPU checksums: {per_engine})")


def _compare(receiver: Any, reply: dict[str, Any], sent: _Sent, version: int) -> None:
    """An hf engine's checksums against what was sent; WeightMismatch naming the tensors that differ."""
    held, dtypes = reply.get("checksums") or {}, reply.get("dtypes") or {}
    bad = []
    for name in sent.tensors:
        if name not in held:
            bad.append(f"{name!r} is not a tensor of the engine")
        elif held[name] != (mine := sent.checksum(name, dtypes[name])):
            bad.append(f"{name!r} differs (engine {held[name]}, trainer {mine}, as {dtypes[name]})")
    if bad:
        more = f"; and {len(bad) - SHOWN} more" if len(bad) > SHOWN else ""
        raise WeightMismatch(f"weight push v{version}: engine {receiver} does not hold what the trainer sent: "
                             f"{len(bad)} of {len(sent.tensors)} tensors: " + "; ".join(bad[:SHOWN]) + more)
