"""Workers for the Ray executor tests: a mining worker with a noisy drafter, and workers whose
actor process dies (as a lost node would) once, mid-run.

Ray actors import these classes by name, so they live in an importable module; `dying`
builds its subclass inside a function, which Ray's pickler then ships by value (with the
marker path and the call number it closes over).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from specagent.data.stage import MineWorker
from specagent.engines.scripted import ScriptedEngine
from specagent.envs.store import StoreEnv
from tests.helpers.mining import noisy_expert


class NoisyMineWorker(MineWorker):
    """`MineWorker` whose drafter is the noisy expert: labels that mix valid and invalid."""

    def __init__(self, cfg, trajectories) -> None:
        super().__init__(cfg, trajectories)
        self.drafter = ScriptedEngine(noisy_expert(StoreEnv()), "noisy-expert")


class SlowNoisyMineWorker(NoisyMineWorker):
    """A noisy worker that takes a while per group, so that a driver can be killed mid-run."""

    def mine(self, trajectory_ids):
        time.sleep(0.4)
        return super().mine(trajectory_ids)


def dying(base: type, marker: Path, method: str, at_call: int) -> type:
    """A subclass of ``base`` whose process exits on its ``at_call``-th call of ``method``,
    with that item running: in one actor of the pool, once (the first to create ``marker``).
    The marker holds the pid that died."""

    class Dying(base):
        def __init__(self, *args) -> None:
            super().__init__(*args)
            self._calls = 0

        def _maybe_die(self) -> None:
            self._calls += 1
            if self._calls != at_call:
                return
            try:
                fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                return  # another actor died already
            os.write(fd, str(os.getpid()).encode())
            os.close(fd)
            os._exit(1)

    def call(self, item):
        self._maybe_die()
        return getattr(base, method)(self, item)

    setattr(Dying, method, call)
    Dying.__name__ = Dying.__qualname__ = f"Dying{base.__name__}"
    return Dying


def drive_slow_mine(config_json: str) -> None:
    """A mining driver for a test to kill: the mine config (JSON) on Ray, slow noisy workers."""
    from specagent.config import MineConfig
    from specagent.data.stage import mine_from_config

    mine_from_config(MineConfig.model_validate_json(Path(config_json).read_text()), worker=SlowNoisyMineWorker)
