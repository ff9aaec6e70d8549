"""`kfactory best CAMPAIGN --final-run`: the swarm times the campaign's current top N
together now, so that `best` answers with a final run's winner.

Every result is an event and the store has one writer, so this goes through the bus as
`kfactory run` does for a resume (`ops.run_cmd.joined_swarm`): in front of the hub
running for the run folder (`server.json`), starting here the roles a final run needs
that have no live instance (planner, benchmarker), or else with the embedded hub and
those roles in this process. It records a `CampaignResumed` with `end_search`: the
planner ends the search and asks for the final run (`actors/roles/planner.py`,
`answer_asked`), the benchmarker times it, and the planner finishes a campaign that had
not finished. It waits until the request it caused is answered (`FinalRankingTimed`, or
`FinalRunRefused` with the reason, said on stderr) and the campaign has finished, saying
on stderr when the run is asked for and when it ends; a run not answered within the
planner's patience (`FINAL_RUN_PATIENCE_S`) is said to be missing, not waited for.

A host that cannot time the campaign's target (a cuda campaign without a usable GPU)
is refused before anything starts (`refuse_untimeable`): nothing is recorded.
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import typer

from actors.campaign.campaign_file import CampaignSpec
from actors.campaign.final_answer import final_answer
from actors.campaign.history import Campaign, History
from actors.campaign.ranking import short_id
from actors.roles.planner import FINAL_RUN_PATIENCE_S
from bus.auth import AuthError
from bus.connection import INTERACTIVE_WAIT, connect, jetstream
from bus.follow import follow
from bus.subjects import campaign_filter
from eventstore.authority import CLI
from eventstore.emitter import Emitter
from eventstore.events import (
    ActorRef,
    CampaignResumed,
    FinalRankingTimed,
    FinalRunRefused,
    new_event,
)
from eventstore.queries import replay
from gpu_workers.targets import device_missing
from ops.errors import UserError
from ops.home import client_auth_for, nats_url, resolve_home
from ops.lifecycle import STOPPED, run_command
from ops.logging import quiet_logs
from ops.progress import Progress
from ops.run_cmd import Joined, Settings, diagnostics, joined_swarm

#: The roles a final run needs: the planner asks for it, a benchmarker times it.
FINAL_RUN_ROLES = ("planner", "benchmarker")
#: Beyond the planner's patience, how long to wait for its verdict on a run never answered.
GRACE_S = 30.0


def refuse_untimeable(campaign_id: str, spec: CampaignSpec) -> None:
    """UserError when this host cannot time the campaign's target."""
    why = device_missing(spec.target, "benchmarker")
    if why is not None:
        raise UserError(
            f"campaign {campaign_id} is timed on {spec.target}, and this host cannot time "
            f"{spec.target} kernels ({why}); nothing was recorded: run `kfactory best "
            f"{campaign_id} --final-run` on a host that can"
        )


def run_final(home: Path | None, campaign_id: str, spec: CampaignSpec) -> None:
    """Have the swarm time the campaign's current top N together now (see the module)."""
    refuse_untimeable(campaign_id, spec)
    folder = resolve_home(home)
    url = nats_url(None, folder)
    auth = client_auth_for(folder, "cli") if url is not None else None
    settings = Settings(folder, 1, 1, as_json=False, local_actors=True, tls_ca=None)
    quiet_logs()

    stopped = "stopped; what was recorded stays, and the same command asks again"

    async def body(stop: asyncio.Event) -> bool:
        async with joined_swarm(stop, spec.target, url, auth, settings, FINAL_RUN_ROLES) as joined:
            await _ask_and_wait(stop, campaign_id, joined)
        return stop.is_set()

    try:
        if run_command(body, stopped):
            print(f"kfactory: {stopped}", file=sys.stderr)
            raise typer.Exit(STOPPED)
    except (ConnectionError, AuthError) as exc:
        raise UserError(str(exc)) from exc


@dataclass
class _Watch:
    """What this command asked for (`asked`: its CampaignResumed's id), and what it has said."""

    asked: str
    since: float
    said_asked: bool = False
    said_answer: bool = False

    def step(self, campaign: Campaign) -> list[str]:
        """The lines to say now about the final run asked for."""
        lines = []
        requested = campaign.final_requested
        ours = requested is not None and requested.causation_id == self.asked
        if ours and requested is not None and not self.said_asked:
            self.said_asked = True
            lines.append(
                f"final run of {campaign.started.campaign_id} asked for: "
                f"{', '.join(short_id(c) for c in requested.contenders)}; timing them together"
            )
        answer = campaign.final_run if ours else None
        if answer is not None and not self.said_answer:
            self.said_answer = True
            lines.append(_answer_words(answer))
        return lines

    def done(self, campaign: Campaign, history: History) -> bool:
        """The answer is in (or none will come) and the campaign has finished."""
        if campaign.finished is None:
            return False
        if self.said_answer or campaign.final_given_up:
            return True
        return (
            self.asked in history.event_ids
            and final_answer(history, campaign.started.campaign_id).final
        )

    def overdue(self) -> bool:
        return time.monotonic() - self.since > FINAL_RUN_PATIENCE_S + GRACE_S


def _answer_words(answer: FinalRankingTimed | FinalRunRefused) -> str:
    if isinstance(answer, FinalRunRefused):
        return f"final run refused ({answer.reason}): {answer.message}"
    if not answer.order:
        return f"final run: no contender passed its judged calls in {answer.rounds} rounds"
    winner = next(c for c in answer.contenders if c.candidate_id == answer.order[0])
    return (
        f"final run done: {short_id(winner.candidate_id)} won, {winner.mean_ns / 1e6:.4f} ms "
        f"mean (IQR {winner.iqr_ns / 1e6:.4f}) over {answer.rounds} rounds"
    )


async def _ask_and_wait(stop: asyncio.Event, campaign_id: str, joined: Joined) -> None:
    console = diagnostics()
    nc = await connect(
        joined.url, "kfactory-best", wait_for_server=INTERACTIVE_WAIT, stop=stop, auth=joined.auth
    )
    try:
        history = History()
        for position, event in await replay(nc, campaign_id=campaign_id):
            history.apply(position, event)
        progress = Progress(history, campaign_id, nc)
        subscription = await follow(nc, campaign_filter(campaign_id), progress.on_message)
        asked = new_event(
            CampaignResumed,
            campaign_id=campaign_id,
            actor=ActorRef.here(CLI),
            reason="final answer asked for",
            end_search=True,
        )
        await Emitter(jetstream(nc)).emit(asked)
        watch = _Watch(asked.event_id, time.monotonic())
        campaign = history.campaigns[campaign_id]
        while not stop.is_set():
            if joined.swarm is not None:
                joined.swarm.check()
            if joined.hub_check is not None:
                joined.hub_check()
            for line in watch.step(campaign):
                console.print(line)
            if watch.done(campaign, history):
                break
            if watch.overdue():
                console.print(
                    f"no final run of {campaign_id} recorded within "
                    f"{FINAL_RUN_PATIENCE_S + GRACE_S:g} s of asking"
                )
                break
            await asyncio.sleep(0.25)
        await subscription.stop()
    finally:
        await nc.close()
