"""A training role's part of each checkpoint (`relax.components.training.CheckpointPart`): written
under a temporary name and moved into place once whole. With --async-save (`background`) `save`
returns while the ranks still write, the part appears only once `finish` saw the write done, and a
failed write is raised at the next save."""

from __future__ import annotations

import asyncio

import pytest

from relax.components.training import CheckpointPart


class SlowRanks:
    """A group whose background write runs until the test lets it finish (or fail)."""

    def __init__(self) -> None:
        self.done = asyncio.Event()
        self.error: Exception | None = None
        self.saved: list[tuple[str, bool]] = []

    async def save(self, path: str, rollout_id: int, save_optim: bool, background: bool = False) -> None:
        self.saved.append((path, background))
        with open(f"{path}/meta.json", "w") as f:  # the ranks' files go to the temporary directory
            f.write("{}")

    async def wait_saved(self) -> None:
        await self.done.wait()
        if self.error is not None:
            error, self.error = self.error, None
            raise error


def test_an_async_part_returns_before_the_write_and_appears_after_it(tmp_path):
    async def scenario() -> None:
        ranks = SlowRanks()
        part = CheckpointPart(ranks, background=True)
        final = await part.save(str(tmp_path), 3, save_optim=True)
        assert final == str(tmp_path / "iter_0000003") and ranks.saved[0][1] is True
        assert not (tmp_path / "iter_0000003").exists()  # still being written: only the temporary name
        assert (tmp_path / "iter_0000003.partial" / "meta.json").exists()
        finishing = asyncio.ensure_future(part.finish())
        await asyncio.sleep(0)
        assert not finishing.done()  # waits for the write
        ranks.done.set()
        await finishing
        assert (tmp_path / "iter_0000003" / "meta.json").exists() and not (tmp_path / "iter_0000003.partial").exists()

    asyncio.run(scenario())


def test_a_failed_background_write_is_raised_at_the_next_save(tmp_path):
    async def scenario() -> None:
        ranks = SlowRanks()
        part = CheckpointPart(ranks, background=True)
        await part.save(str(tmp_path), 1, save_optim=True)
        ranks.error = OSError("No space left on device")
        ranks.done.set()
        with pytest.raises(OSError, match="No space left"):
            await part.save(str(tmp_path), 2, save_optim=True)
        assert not (tmp_path / "iter_0000001").exists()  # never published
        await part.save(str(tmp_path), 2, save_optim=True)  # the failure was reported once; saving goes on
        await part.finish()
        assert (tmp_path / "iter_0000002").exists()

    asyncio.run(scenario())


def test_without_async_save_the_part_is_in_place_when_save_returns(tmp_path):
    ranks = SlowRanks()
    part = CheckpointPart(ranks, background=False)
    asyncio.run(part.save(str(tmp_path), 0, save_optim=True))
    assert (tmp_path / "iter_0000000" / "meta.json").exists() and ranks.saved[0][1] is False
