"""Weight push of a LoRA adapter to SGLang engines, as peft files through SGLang's LoRA API.

SGLang keeps LoRA adapters by name: `/load_lora_adapter` {lora_name, lora_path, pinned} reads one
from a directory in peft's format, `/unload_lora_adapter` {lora_name} drops it, and a generate
request uses one by naming it in `lora_path` (the rollout's router adds `lora_path: relax-policy`
to every request, `relax.engine.router.router.Router`). The engines start with `--enable-lora
--max-lora-rank R --lora-target-modules ...` (`relax.config.lora.engine_lora_options`).

`push(named_tensors, version=v)` (the adapter tensors only, Relax's names) writes them as
`<adapter_dir>/v<v>/` (`adapter_model.safetensors` + `adapter_config.json`, `relax.utils.peft_files`),
then on every engine at once: `/pause_generation`, `/unload_lora_adapter` (the previous version;
an engine that holds none yet refuses, which is expected), `/load_lora_adapter`,
`/update_weight_version` (samples are stamped with it) and `/continue_generation`. A push replaces
the adapter, so nothing accumulates. Directories older than the previous version are deleted. Same
interface as `sender.WeightSender` (`connect`, `push` -> `SyncStats`, `close`); `WeightPush` picks
it when the trainer's spec names an `adapter_dir` (`relax.backends.registry.ADAPTER_FILE_ENGINES`).

The directory must be readable by the engines: the run directory on one node, a shared filesystem
across nodes. Untested against a live SGLang here (no GPU): the requests are SGLang 0.5.23's
(`io_struct.LoadLoRAAdapterReqInput`, `UnloadLoRAAdapterReqInput`) and checked as payloads.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch

from relax.config.lora import ADAPTER_NAME
from relax.distributed.weights.endpoints import Endpoint, HTTPEndpoint
from relax.distributed.weights.protocol import SyncStats, WeightSyncError, tensor_bytes
from relax.utils.peft_files import save_adapter

logger = logging.getLogger(__name__)


class AdapterFileSender:
    """Rank 0's push of a LoRA adapter to SGLang engines through files (see the module doc)."""

    def __init__(self, engine_urls: Sequence[str | Endpoint], *, adapter_dir: str, config: dict[str, Any],
                 api_key: str | None = None, timeout_s: float = 300.0, pause_mode: str = "abort",
                 transport: Any = None, lora_name: str = ADAPTER_NAME) -> None:
        """`config`: the adapter's adapter_config.json (`relax.utils.peft_files.adapter_config`)."""
        if not engine_urls:
            raise ValueError("AdapterFileSender needs at least one engine URL")
        self.receivers: list[Endpoint] = [HTTPEndpoint(u, api_key=api_key, transport=transport)
                                          if isinstance(u, str) else u for u in engine_urls]
        self.adapter_dir, self.config, self.lora_name = Path(adapter_dir), config, lora_name
        self.timeout_s, self.pause_mode = timeout_s, pause_mode
        self.backend = "adapter-files"  # how weights travel, as `WeightPush.connect` reports it
        self.written: list[Path] = []  # this sender's version directories, oldest first
        self._lock = asyncio.Lock()

    async def connect(self) -> None:
        """Engines only (SGLang's HTTP API): there is no group to join."""
        others = [r for r in self.receivers if not isinstance(r, HTTPEndpoint)]
        if others:
            raise WeightSyncError(f"LoRA adapter files go to SGLang engines only, not to {others[0]!r}; "
                                  "use --rollout-backend hf (adapter tensors by broadcast)")
        self.adapter_dir.mkdir(parents=True, exist_ok=True)

    async def push(self, named_tensors: Iterable[tuple[str, torch.Tensor]], *, version: int) -> SyncStats:
        """Write the adapter of `version` and swap it into every engine; WeightSyncError naming the
        engine and what it answered."""
        named = dict(named_tensors)
        if not named:
            raise WeightSyncError("push() got no tensors")
        async with self._lock:
            start = time.monotonic()
            path = await asyncio.to_thread(save_adapter, self.adapter_dir / f"v{version}", named, self.config)
            deadline = start + self.timeout_s
            await asyncio.gather(*(self._swap(r, path, version, deadline) for r in self.receivers))
            self._forget_older(path)
        nbytes, seconds = sum(tensor_bytes(t) for t in named.values()), time.monotonic() - start
        logger.info("LoRA adapter v%d: %d bytes written to %s and loaded by %d engine(s) in %.3fs", version, nbytes,
                    path, len(self.receivers), seconds)
        return SyncStats(bytes=nbytes, seconds=seconds, gbps=nbytes / max(seconds, 1e-9) / 1e9, num_buckets=1,
                         version=version)

    def requests(self, path: Path, version: int) -> list[tuple[str, dict[str, Any]]]:
        """The calls of one engine's swap, in order (SGLang's endpoint and request fields)."""
        return [("/pause_generation", {"mode": self.pause_mode}),
                ("/unload_lora_adapter", {"lora_name": self.lora_name}),
                ("/load_lora_adapter", {"lora_name": self.lora_name, "lora_path": str(path), "pinned": False}),
                ("/update_weight_version", {"new_version": str(version), "abort_all_requests": False}),
                ("/continue_generation", {})]

    async def _swap(self, engine: Endpoint, path: Path, version: int, deadline: float) -> None:
        calls = dict(self.requests(path, version))
        await engine.post("/pause_generation", calls["/pause_generation"], self._remaining(deadline))
        try:
            try:
                await engine.post("/unload_lora_adapter", calls["/unload_lora_adapter"], self._remaining(deadline))
            except WeightSyncError as exc:  # a fresh (or replaced) engine holds no adapter yet
                logger.debug("unload_lora_adapter on %r: %s", engine, exc)
            try:
                await engine.post("/load_lora_adapter", calls["/load_lora_adapter"], self._remaining(deadline))
            except WeightSyncError as exc:
                raise WeightSyncError(f"{engine!r}: /load_lora_adapter {path} failed: {exc} (SGLang engines need "
                                      "--enable-lora, which Relax sets with --lora-rank, and must read the "
                                      "directory)") from exc
            await engine.post("/update_weight_version", calls["/update_weight_version"], self._remaining(deadline))
        finally:
            try:
                await engine.post("/continue_generation", {}, 30.0)
            except WeightSyncError as exc:  # best effort: the push's own error matters more
                logger.warning("continue_generation on %r failed: %s", engine, exc)

    def _remaining(self, deadline: float) -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise WeightSyncError(f"LoRA adapter push exceeded its deadline of {self.timeout_s:.0f}s")
        return remaining

    def _forget_older(self, path: Path) -> None:
        """Keep this version's directory and the one before (an engine may still be reading it)."""
        if path not in self.written:
            self.written.append(path)
        while len(self.written) > 2:
            shutil.rmtree(self.written.pop(0), ignore_errors=True)

    async def close(self) -> None:
        await asyncio.gather(*(r.close() for r in self.receivers if isinstance(r, HTTPEndpoint)))
