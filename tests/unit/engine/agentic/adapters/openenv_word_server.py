"""A small OpenEnv environment served by openenv-core's own server (`create_fastapi_app` +
uvicorn), for the adapter tests: `python openenv_word_server.py PORT [CRASH_AT_STEP]`.

The action is one text field (`message`, as echo / TextArena envs take it); each step echoes it,
rewards its length / 10 and ends the episode at step 3. With
CRASH_AT_STEP the server process dies inside that step (a server killed mid-episode)."""

from __future__ import annotations

import base64
import os
import sys
import uuid

sys.modules.setdefault("gradio", None)  # type: ignore[arg-type]  # no web UI: seconds less to start (adapter_services.py)
from openenv.core import Action, Environment, Observation, State, create_fastapi_app  # noqa: E402

PIXEL = "data:image/png;base64," + base64.b64encode(bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010802000000907753de0000000c4944415408d763f8cfc0000003"
    "010100c9fe92ef0000000049454e44ae426082")).decode()


class WordAction(Action):
    message: str


class WordObservation(Observation):
    text: str
    image: str | None = None


class WordEnv(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True
    CRASH_AT = 0  # the step at which the process dies (0: never)

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=str(uuid.uuid4()), step_count=0)

    def reset(self, seed=None, episode_id=None, **kwargs) -> WordObservation:
        self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        return WordObservation(text=f"say words (seed {seed})", image=PIXEL)

    def step(self, action: WordAction, timeout_s=None, **kwargs) -> WordObservation:
        self._state.step_count += 1
        if self._state.step_count == self.CRASH_AT:
            os._exit(3)
        done = self._state.step_count >= 3
        return WordObservation(text=f"echo {self._state.step_count}: {action.message}", done=done,
                               reward=len(action.message) / 10)

    @property
    def state(self) -> State:
        return self._state


if __name__ == "__main__":
    import uvicorn

    WordEnv.CRASH_AT = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    app = create_fastapi_app(WordEnv, WordAction, WordObservation, max_concurrent_envs=16)
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
