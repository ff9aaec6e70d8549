"""Running every role inside this process (the laptop mode of `kfactory run`).

`running_swarm` starts one runtime per role that serves the target, and as many
verifiers and benchmarkers as asked (`run --verifiers`, `--benchmarkers`), each on a
connection of its own with its role's credentials, all on this process's one event loop.
Without the target's device here (no usable GPU for cuda) the verifier and benchmarker
are left to hosts that have it, and `Swarm.device_missing` says why. `only` starts just
the roles named: what `kfactory run --nats` starts here for the roles the swarm it joins
has no live instance of (`needed_roles`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Collection
from dataclasses import dataclass

from actors.roles.registry import ROLES, Role
from actors.runtime import Actor, ActorRuntime
from bus.auth import ClientAuth
from bus.connection import connect
from gpu_workers.targets import device_missing, target_of

RUN_ON_THE_DEVICE = ("verifier", "benchmarker")


def create_actor(role: Role, target: str) -> Actor:
    actor = role.create(target)
    if role.name in RUN_ON_THE_DEVICE:
        actor.device = target_of(target).device_label()  # for its heartbeat
    return actor


@dataclass
class Swarm:
    runtimes: list[ActorRuntime]
    tasks: list[asyncio.Task[None]]
    device_missing: str | None = None
    """Why the device's own roles are not running here (None: they are)."""

    def check(self) -> None:
        """Raise the failure of any actor that died."""
        for task in self.tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise RuntimeError(f"the {task.get_name()} actor stopped: {task.exception()!r}")


def needed_roles(target: str) -> list[tuple[str, str | None]]:
    """(role, target) of every role a campaign on `target` needs (target None: any)."""
    return [
        (role.name, target if role.targets is not None else None)
        for role in ROLES.values()
        if role.targets is None or target in role.targets
    ]


@contextlib.asynccontextmanager
async def running_swarm(
    url: str,
    *,
    target: str = "cpu",
    verifiers: int = 1,
    benchmarkers: int = 1,
    auth: Callable[[str], ClientAuth] | None = None,
    only: Collection[str] | None = None,
) -> AsyncIterator[Swarm]:
    """Start every role for `target` (several verifiers/benchmarkers if asked), or `only`
    those named; stop them on exit. Without the device, the roles that run kernels are
    left to hosts that have it. `auth` gives each role's credentials (by role name)."""
    counts = {"verifier": verifiers, "benchmarker": benchmarkers}
    missing = device_missing(target)
    stop = asyncio.Event()
    runtimes: list[ActorRuntime] = []
    tasks: list[asyncio.Task[None]] = []
    try:
        for role in ROLES.values():
            if role.targets is not None and target not in role.targets:
                continue
            if only is not None and role.name not in only:
                continue
            if role.name in RUN_ON_THE_DEVICE and device_missing(target, role.name) is not None:
                continue
            for index in range(counts.get(role.name, 1)):
                credentials = auth(role.name) if auth is not None else None
                nc = await connect(url, f"kf-{role.name}", auth=credentials)
                runtime = ActorRuntime(create_actor(role, target), nc, f"{role.name}-{index}")
                runtimes.append(runtime)
                tasks.append(asyncio.create_task(runtime.run(stop), name=role.name))
        yield Swarm(runtimes, tasks, missing)
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        for runtime in runtimes:
            with contextlib.suppress(Exception):
                await runtime.nc.close()
