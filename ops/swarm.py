"""Running the six roles inside this process (the laptop mode of `kfactory run`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from actors.roles import ROLES
from actors.runtime import ActorRuntime
from bus.connection import connect


@dataclass
class Swarm:
    runtimes: list[ActorRuntime]
    tasks: list[asyncio.Task[None]]

    def check(self) -> None:
        """Raise the failure of any actor that died."""
        for task in self.tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise RuntimeError(f"the {task.get_name()} actor stopped: {task.exception()!r}")


@contextlib.asynccontextmanager
async def running_swarm(
    url: str, *, verifiers: int = 1, benchmarkers: int = 1
) -> AsyncIterator[Swarm]:
    """Start every role (several verifiers/benchmarkers if asked); stop them on exit."""
    counts = {"verifier": verifiers, "benchmarker": benchmarkers}
    stop = asyncio.Event()
    runtimes: list[ActorRuntime] = []
    tasks: list[asyncio.Task[None]] = []
    try:
        for role in ROLES.values():
            for index in range(counts.get(role.name, 1)):
                nc = await connect(url, f"kf-{role.name}")
                runtime = ActorRuntime(role.create(), nc, f"{role.name}-{index}")
                runtimes.append(runtime)
                tasks.append(asyncio.create_task(runtime.run(stop), name=role.name))
        yield Swarm(runtimes, tasks)
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        for runtime in runtimes:
            with contextlib.suppress(Exception):
                await runtime.nc.close()
