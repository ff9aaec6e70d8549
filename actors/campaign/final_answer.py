"""Whether a campaign's leaderboard gives a final answer, or a provisional one.

A campaign's current top N (`search.final_contenders`, 4 by default) are the kernels a
final run would time now: the first N rows of its leaderboard by the ranking alone (the
best promoted head to head, then the others by pooled time), whatever final run was
recorded. Its answer is final when its latest final run (the one the leaderboard follows)
timed all of them together, or when it has fewer than two timed kernels (nothing to
compare). Otherwise it is provisional: the campaign was stopped before its search ended
(no final run), its final run was refused, or kernels timed after it (a resume with a
larger budget, a result that arrived late) entered its top N. The planner asks for a
final run of `contenders` (`actors/roles/planner.py`), and `kfactory best` says when
its answer is provisional.
"""

from __future__ import annotations

from dataclasses import dataclass

from actors.campaign.history import History
from actors.campaign.leaderboard import leaderboard
from actors.campaign.ranking import short_id
from eventstore.events import FinalRankingTimed


@dataclass(frozen=True)
class FinalAnswer:
    campaign_id: str
    contenders: list[str]
    """The current top N by the ranking, best first: what a final run times now."""
    final_run: FinalRankingTimed | None
    """The latest final run recorded, whose order places the leaderboard's first rows."""

    @property
    def untimed(self) -> list[str]:
        """The contenders the latest final run did not time (all of them without one)."""
        timed = {c.candidate_id for c in self.final_run.contenders} if self.final_run else set()
        return [cid for cid in self.contenders if cid not in timed]

    @property
    def final(self) -> bool:
        return len(self.contenders) < 2 or not self.untimed

    def provisional(self) -> str | None:
        """Why the answer is provisional, in one line with the command that makes it final;
        None when it is final."""
        if self.final:
            return None
        top = f"its current top {len(self.contenders)}"
        asked = f"`kfactory best {self.campaign_id} --final-run` times them together now"
        if self.final_run is None:
            return (
                f"provisional: campaign {self.campaign_id} has no final run of {top} (ranks "
                f"by head-to-head and pooled time); {asked}"
            )
        missing = ", ".join(short_id(cid) for cid in self.untimed)
        return (
            f"provisional: the final run of campaign {self.campaign_id} did not time "
            f"{missing} of {top} (ranked after its contenders by pooled time); {asked}"
        )


def current_contenders(history: History, campaign_id: str) -> list[str]:
    """The campaign's top `search.final_contenders` kernels by the ranking alone."""
    wanted = history.campaigns[campaign_id].spec.search.final_contenders
    board = leaderboard(history.campaign_candidates(campaign_id))
    return [row.candidate_id for row in board.rows[:wanted]]


def final_answer(history: History, campaign_id: str) -> FinalAnswer:
    """Whether the campaign's leaderboard answer is final, and its current top N."""
    return FinalAnswer(
        campaign_id,
        current_contenders(history, campaign_id),
        history.campaigns[campaign_id].final_ranking,
    )
