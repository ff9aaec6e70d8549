"""What `kfactory run` and `kfactory events` show: progress lines without a terminal, the
warning and event when a role the campaign needs has no live instance, the roles it
lacks in front of a running server, and the stored events read with no server."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from actors.campaign.campaign_file import Budget, CampaignSpec, validate
from actors.runtime import ActorRuntime
from bus.connection import connect, jetstream
from eventstore.emitter import Emitter
from ops import progress, run_cmd
from ops.cli import app
from ops.hub import running_hub
from ops.run_cmd import Settings, follow_campaign
from ops.swarm import needed_roles
from tests.conftest import started
from tests.echo_actor import EchoActor


def _spec(name: str) -> CampaignSpec:
    return validate(CampaignSpec(problem="softmax", name=name, budget=Budget(candidates=2)))


def _console() -> tuple[Console, io.StringIO]:
    text = io.StringIO()
    return Console(file=text, soft_wrap=True, markup=False, highlight=False), text


@pytest.mark.asyncio
async def test_without_live_actors_run_says_so_and_records_a_stall(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(progress, "LIVE_FOR", 1.0)
    monkeypatch.setattr(run_cmd, "LINE_EVERY", 0.5)
    console, text = _console()
    spec = _spec("lonely")
    async with running_hub(tmp_path / "home") as hub:
        stop = asyncio.Event()
        following = asyncio.create_task(
            follow_campaign(spec, hub.url, hub.auth("cli"), None, stop, console, hub.check)
        )
        roles = [role for role, _ in needed_roles("cpu")]
        rows: list[list[object]] = []
        for _ in range(300):
            rows = hub.store.query(
                "SELECT payload->>'role', payload->>'kind' FROM events "
                "WHERE type = 'CampaignStalled' AND campaign_id = 'lonely'"
            ).rows
            if len(rows) == len(roles):
                break
            await asyncio.sleep(0.1)
        stop.set()
        assert await asyncio.wait_for(following, 30) is None
    assert sorted(rows) == sorted([role, "no_live_actor"] for role in roles)
    shown = text.getvalue()
    assert "campaign lonely: softmax (fp32) on cpu" in shown
    assert (
        "campaign lonely: generation 0, settled 0 of 0 proposed (budget 2), verified 0, "
        "benchmarking 0, best -, elapsed " in shown
    )
    for role in roles:
        assert f"warning: no live {role} for cpu for 1 s" in shown


@pytest.mark.asyncio
async def test_in_front_of_a_server_run_names_the_missing_roles(tmp_path: Path) -> None:
    home = tmp_path / "home"
    async with running_hub(home) as hub:
        nc = await connect(hub.url, "planner", auth=hub.auth("planner"))
        stop = asyncio.Event()
        planner = asyncio.create_task(ActorRuntime(EchoActor(), nc).run(stop))
        console, text = _console()
        monkey = pytest.MonkeyPatch()
        monkey.setattr(run_cmd, "diagnostics", lambda: console)
        try:
            settings = Settings(home, 1, 1, False, False, None)
            async with run_cmd.joined_swarm(
                stop, "cpu", hub.url, hub.auth("cli"), settings
            ) as joined:
                result = await run_cmd.follow_campaign(
                    _spec("fronted"), joined.url, joined.auth, joined.swarm, stop, console
                )
        finally:
            monkey.undo()
            stop.set()
            await asyncio.wait_for(planner, 30)
            await nc.close()
    # The echo "planner" finished the campaign at once: the others were never needed.
    assert result is not None and result["finished"] == "echo of fronted"
    missing = [role for role, _ in needed_roles("cpu") if role != "planner"]
    assert (
        f"the swarm at {hub.url} has no live {', '.join(missing)} (--no-local-actors)"
        in text.getvalue()
    )


def test_events_show_and_tail_read_the_file_with_no_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KF_NATS_URL", raising=False)
    home = tmp_path / "home"
    asyncio.run(_record(home, ["one", "two", "three"]))
    runner = CliRunner()
    shown = runner.invoke(app, ["events", "show", "--home", str(home), "--json"])
    assert shown.exit_code == 0, shown.output
    assert [json.loads(line)["campaign_id"] for line in shown.stdout.splitlines()] == [
        "one",
        "two",
        "three",
    ]
    only = runner.invoke(app, ["events", "show", "--home", str(home), "--campaign", "two"])
    (line,) = only.stdout.splitlines()
    assert "two" in line and "CampaignStarted" in line and "cli/cli-1" in line
    tail = runner.invoke(app, ["events", "tail", "--home", str(home), "--limit", "2"])
    assert tail.exit_code == 0, tail.output
    assert ["two" in tail.stdout.splitlines()[0], "three" in tail.stdout.splitlines()[1]] == [
        True,
        True,
    ]
    empty = runner.invoke(app, ["events", "show", "--home", str(tmp_path / "nothing")])
    assert empty.exit_code != 0 and "no event store at" in str(empty.exception or empty.output)


async def _record(home: Path, campaigns: list[str]) -> None:
    async with running_hub(home) as hub:
        cli = await connect(hub.url, "cli", auth=hub.auth("cli"))
        try:
            for campaign in campaigns:
                await asyncio.wait_for(Emitter(jetstream(cli)).emit(started(campaign)), 30)
        finally:
            await cli.close()
        await hub.wait_for_position(len(campaigns), timeout=30)
