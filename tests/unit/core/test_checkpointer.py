"""The Controller's side of checkpoints (`relax.core.checkpointer.Checkpointer`): the checkpoint is
committed (manifest, then the latest pointer) only once every role's part is written. With
--async-save the step goes on while the roles write, the pointer moves only after the write, and a
failed write is raised at the next checkpoint with the previous one still the latest."""

from __future__ import annotations

import asyncio

import pytest

from relax.config.schema import CheckpointConfig
from relax.core.checkpointer import Checkpointer
from relax.utils import checkpoints


class SlowRole:
    """A role whose parts are written in the background until the test releases them."""

    def __init__(self, root) -> None:
        self.root = root
        self.written = asyncio.Event()
        self.error: Exception | None = None

    async def save(self, step: int) -> dict[str, str]:
        part = self.root / "rollout" / f"global_dataset_state_dict_{step}.pt"
        part.parent.mkdir(parents=True, exist_ok=True)
        part.write_text("state")
        return {"rollout": str(part)}

    async def finish_save(self) -> None:
        await self.written.wait()
        self.written.clear()
        if self.error is not None:
            raise self.error


def latest(root) -> str | None:
    pointer = root / checkpoints.POINTER
    return pointer.read_text() if pointer.exists() else None


def test_async_save_moves_the_latest_pointer_only_after_the_write(tmp_path):
    async def scenario() -> None:
        role = SlowRole(tmp_path)
        ckpt = Checkpointer(CheckpointConfig(save=str(tmp_path), async_save=True), [role])
        await ckpt.save(0)  # returns with the write in flight: the step goes on
        assert latest(tmp_path) is None and ckpt.pending == (0, {"rollout": str(role.root / "rollout" /
                                                                              "global_dataset_state_dict_0.pt")})
        finishing = asyncio.ensure_future(ckpt.finish())
        await asyncio.sleep(0)
        assert not finishing.done() and latest(tmp_path) is None
        role.written.set()
        await finishing
        assert latest(tmp_path) == "0" and ckpt.pending is None

    asyncio.run(scenario())


def test_a_failed_write_is_raised_at_the_next_save_and_the_previous_stays_latest(tmp_path):
    async def scenario() -> None:
        role = SlowRole(tmp_path)
        ckpt = Checkpointer(CheckpointConfig(save=str(tmp_path), async_save=True), [role])
        await ckpt.save(0)
        role.written.set()
        await ckpt.save(1)  # the next save finishes step 0 first
        assert latest(tmp_path) == "0"
        role.error = OSError("disk full")
        role.written.set()
        with pytest.raises(RuntimeError, match="checkpoint of step 1 failed.*disk full"):
            await ckpt.save(2)
        assert latest(tmp_path) == "0" and not (tmp_path / "iter_0000001").exists()

    asyncio.run(scenario())


def test_without_async_save_a_checkpoint_is_committed_at_once(tmp_path):
    async def scenario() -> None:
        role = SlowRole(tmp_path)
        role.written.set()  # (a synchronous role's finish_save has nothing to wait for)
        await Checkpointer(CheckpointConfig(save=str(tmp_path)), [role]).save(4)
        assert latest(tmp_path) == "4"

    asyncio.run(scenario())
