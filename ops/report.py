"""One self-contained HTML report of a campaign: plotly charts with their JavaScript
inlined (nothing is fetched when the file is opened), tables, and the winning kernel's
source highlighted by pygments.

`render_report` takes a campaign rebuilt from the store (`actors.records.story`) and the
recorded HostCalibrated events, and renders `ops/templates/report.html.j2`: the best
speedup so far over evaluations and over time, a roofline chart (achieved GFLOP/s
against operational intensity, under the ceilings of the device the kernels were timed
on), the leaderboard (`actors.campaign.leaderboard`, each row with its standing), the
lessons with the events they cite, the rejections by stage and generation, and the
winner's source. The plotly.js bundle is inlined once, with the first chart; pygments'
style sheet is inlined too.
"""

from __future__ import annotations

import html
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import jinja2
import plotly.graph_objects as go
from plotly.subplots import make_subplots
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name

from actors.campaign.history import Candidate, History
from actors.campaign.leaderboard import Leaderboard, Row, campaign_leaderboard
from actors.campaign.ranking import short_id
from actors.records.best_kernels import kernel_text
from actors.records.overview import evaluation_order
from actors.records.story import Rebuilt
from actors.search.lineage import lineage_of
from actors.search.operators.protocol import Step
from eventstore.events import Event, HostCalibrated
from gpu_workers.targets import target_of
from kernels.loading import load_problem

_TEMPLATES = jinja2.Environment(
    loader=jinja2.PackageLoader("ops", "templates"),
    autoescape=jinja2.select_autoescape(["html", "j2"]),
    undefined=jinja2.StrictUndefined,
)


def render_report(rebuilt: Rebuilt, calibrations: list[HostCalibrated]) -> str:
    history, campaign_id = rebuilt.history, rebuilt.campaign_id
    campaign = history.campaigns[campaign_id]
    board = campaign_leaderboard(history, campaign_id)
    cited = _cited_events(rebuilt, history, campaign_id)
    curve = _curve_figure(history, campaign_id, board)
    roofline, roofline_note = _roofline_figure(board.rows, calibrations)
    winner = board.rows[0].candidate if board.rows else None
    return _TEMPLATES.get_template("report.html.j2").render(
        campaign_id=campaign_id,
        spec=campaign.spec,
        finished=campaign.finished.reason if campaign.finished else None,
        generated=datetime.now(UTC).isoformat(timespec="seconds"),
        events=len(rebuilt.events),
        position=rebuilt.position,
        curve_html=curve.to_html(full_html=False, include_plotlyjs=True, div_id="curve"),
        roofline_html=roofline.to_html(full_html=False, include_plotlyjs=False, div_id="roofline"),
        roofline_note=roofline_note,
        timings_html=_timings_figure(board.rows).to_html(
            full_html=False, include_plotlyjs=False, div_id="timings"
        ),
        hosts=_hosts(calibrations, board.rows),
        board=[_board_row(row) for row in board.rows],
        baseline=board.baseline.words() if board.baseline else "none timed",
        lessons=campaign.lessons,
        cited=cited,
        rejections=_rejection_table(history.campaign_candidates(campaign_id)),
        lineage=_lineage_rows(history, campaign_id, board),
        winner=winner.candidate_id if winner else None,
        winner_html=_highlight(winner, lineage_of(history, winner)) if winner else "",
        pygments_css=HtmlFormatter(style="friendly").get_style_defs(".code"),
    )


def _curve_figure(history: History, campaign_id: str, board: Leaderboard) -> go.Figure:
    order = evaluation_order(history, campaign_id)
    start = history.campaigns[campaign_id].started.ts
    best, xs, seconds, ys = 0.0, [], [], []
    for count, c in enumerate(order, 1):
        best = max(best, board.speedup_of(c.candidate_id) or 0.0)
        verdict = c.benchmark or c.rejected or c.verified
        assert verdict is not None
        xs.append(count)
        seconds.append((verdict.ts - start).total_seconds())
        ys.append(best)
    figure = make_subplots(
        rows=1, cols=2, subplot_titles=("over evaluations", "over time (s since start)")
    )
    line = {"shape": "hv", "width": 2}
    figure.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", line=line, name="evals"), 1, 1)
    figure.add_trace(
        go.Scatter(x=seconds, y=ys, mode="lines+markers", line=line, name="time"), 1, 2
    )
    figure.update_yaxes(
        title_text="best speedup so far (x the baseline timed in its run)", row=1, col=1
    )
    figure.update_xaxes(title_text="evaluations", row=1, col=1)
    figure.update_xaxes(title_text="seconds", row=1, col=2)
    figure.update_layout(height=380, showlegend=False, margin={"t": 40, "b": 40})
    return figure


def _roofline_figure(rows: list[Row], calibrations: list[HostCalibrated]) -> tuple[go.Figure, str]:
    """Achieved GFLOP/s against operational intensity, under the host's two ceilings."""
    figure = go.Figure()
    points: dict[str, tuple[list[float], list[float], list[str]]] = {}
    devices: set[str] = set()
    for row in rows:
        timed = row.timed
        problem = load_problem(timed.problem)
        cost = problem.cost_for(dict(row.shape or problem.default_shape), timed.dtype)
        if cost.bytes_moved <= 0 or cost.flops <= 0 or row.median_ns <= 0:
            continue
        xs, ys, labels = points.setdefault(row.template, ([], [], []))
        xs.append(cost.flops / cost.bytes_moved)
        ys.append(cost.flops / row.median_ns)  # flops per ns = GFLOP/s
        labels.append(f"{row.candidate_id}<br>{row.speedup:.2f}x, {row.median_ns / 1e6:.3f} ms")
        devices.add(timed.device)
    for template, (xs, ys, labels) in points.items():
        figure.add_trace(
            go.Scatter(
                x=xs,
                y=ys,
                mode="markers",
                name=template,
                text=labels,
                hovertemplate="%{text}<extra></extra>",
                marker={"size": 9},
            )
        )
    ceilings = [h for h in calibrations if h.device in devices]
    note = ""
    if ceilings:
        host = ceilings[-1]
        xs = [x for group in points.values() for x in group[0]]
        ridge = host.peak_gflops / host.bandwidth_gbs
        low, high = min([*xs, ridge]) / 10, max([*xs, ridge]) * 10
        grid = [low * (high / low) ** (i / 60) for i in range(61)]
        figure.add_trace(
            go.Scatter(
                x=grid,
                y=[min(host.peak_gflops, host.bandwidth_gbs * x) for x in grid],
                mode="lines",
                name=f"{host.device}: {host.bandwidth_gbs:.0f} GB/s, "
                f"{host.peak_gflops:.0f} GFLOP/s",
                line={"color": "black", "width": 2},
            )
        )
        note = f"ceilings measured on {host.device} ({host.method.get('how', 'calibration')})"
    else:
        note = "no calibration of the device these kernels were timed on is recorded"
    # one labelled tick per decade, written out (plotly's default labels 200 as "2")
    figure.update_xaxes(
        type="log",
        dtick=1,
        exponentformat="none",
        title_text="operational intensity (flop / byte moved)",
    )
    figure.update_yaxes(type="log", dtick=1, exponentformat="none", title_text="GFLOP/s achieved")
    figure.update_layout(height=420, margin={"t": 20, "b": 40})
    return figure, note


def _timings_figure(rows: list[Row]) -> go.Figure:
    """Each kernel's timed calls in its own run, as recorded: the median and quartiles."""
    figure = go.Figure()
    for row in rows:
        if row.q1_ns is None or row.q3_ns is None:
            continue
        quartiles = [row.q1_ns / 1e6], [row.median_ns / 1e6], [row.q3_ns / 1e6]
        figure.add_trace(
            go.Box(
                name=f"{row.rank}. {short_id(row.candidate_id)}",
                q1=quartiles[0],
                median=quartiles[1],
                q3=quartiles[2],
                lowerfence=quartiles[0],
                upperfence=quartiles[2],
            )
        )
    figure.update_yaxes(title_text="ms per call (median and quartiles of its run)")
    figure.update_layout(height=380, showlegend=False, margin={"t": 20, "b": 40})
    return figure


def _hosts(calibrations: list[HostCalibrated], rows: list[Row]) -> list[dict[str, Any]]:
    """The devices the kernels were timed on, as their calibration recorded them."""
    timed_on = {row.timed.device for row in rows}
    latest = {h.device: h for h in calibrations if h.device in timed_on}
    return [
        {
            "device": h.device,
            "cpu": h.method.get("cpu", "not recorded"),
            "isa": h.method.get("isa", "not recorded"),
            "cores": h.method.get("cores", "not recorded"),
            "bandwidth_gbs": h.bandwidth_gbs,
            "peak_gflops": h.peak_gflops,
        }
        for h in latest.values()
    ]


def _board_row(row: Row) -> dict[str, Any]:
    return {
        "rank": row.rank,
        "candidate": row.candidate_id,
        "template": row.template,
        "params": ", ".join(f"{k}={v}" for k, v in row.params.items()),
        "median_ms": row.median_ns / 1e6,
        "iqr_ms": row.iqr_ns / 1e6,
        "speedup": row.speedup,
        "pooled_ms": row.pooled_median_ns / 1e6,
        "runs": row.runs,
        "roofline": row.roofline_fraction,
        "source": kernel_text(row.candidate),
        "event_id": row.timed.event_id,
        "standing": row.standing,
        "decided_by": row.decided_by,
        "final": ""
        if row.final is None
        else f"{row.final.mean_ns / 1e6:.4f} (IQR {row.final.iqr_ns / 1e6:.4f})",
    }


def _rejection_table(candidates: list[Candidate]) -> dict[str, Any]:
    counts: Counter[tuple[str, int]] = Counter()
    for c in candidates:
        if c.rejected:
            counts[(f"{c.rejected.stage}: {c.rejected.reason}", c.proposal.generation)] += 1
    generations = sorted({c.proposal.generation for c in candidates})
    kinds = sorted({kind for kind, _ in counts})
    return {
        "generations": generations,
        "rows": [(kind, [counts[(kind, g)] for g in generations]) for kind in kinds],
    }


def _lineage_rows(history: History, campaign_id: str, board: Leaderboard) -> list[dict[str, Any]]:
    """Every candidate made from parents (by a variation operator, or an LLM's improve,
    fix or crossover): what made it, from which parents, what came of it, its diff."""
    rows: list[dict[str, Any]] = []
    for c in history.campaign_candidates(campaign_id):
        proposal = c.proposal
        if not proposal.parents:
            continue
        if c.rejected:
            status = f"rejected at {c.rejected.stage}: {c.rejected.reason}"
        elif c.benchmark:
            status = "timed"
        elif c.duplicate:
            status = "duplicate"
        else:
            status = "in flight"
        rows.append(
            {
                "candidate": c.candidate_id,
                "generation": proposal.generation,
                "operator": proposal.operator,
                "params": ", ".join(f"{k}={v}" for k, v in proposal.params.items()),
                "parents": ", ".join(short_id(p) for p in proposal.parents),
                "status": status,
                "speedup": board.speedup_of(c.candidate_id),
                "diff": c.written.diff if c.written else "",
            }
        )
    return rows


def _cited_events(rebuilt: Rebuilt, history: History, campaign_id: str) -> list[dict[str, Any]]:
    """Every event a lesson cites, with an anchor the lesson links to."""
    wanted = {i for lesson in history.campaigns[campaign_id].lessons for i in lesson.evidence_ids}
    found: dict[str, tuple[int, Event]] = {
        e.event_id: (p, e) for p, e in rebuilt.events if e.event_id in wanted
    }
    rows: list[dict[str, Any]] = []
    for event_id in sorted(wanted, key=lambda i: found[i][0] if i in found else 0):
        position, event = found.get(event_id, (0, None))
        if event is None:
            rows.append(
                {
                    "id": event_id,
                    "position": None,
                    "type": "not in this campaign",
                    "what": "recorded by another campaign of the same problem",
                }
            )
            continue
        rows.append(
            {"id": event_id, "position": position, "type": event.type, "what": _what(event)}
        )
    return rows


def _what(event: Event) -> str:
    fields = ("candidate_id", "speedup", "median_ns", "stage", "reason")
    parts = [f"{f}={getattr(event, f)}" for f in fields if hasattr(event, f)]
    message = getattr(event, "evidence", {}).get("message")
    if message:
        parts.append(html.unescape(str(message).splitlines()[0])[:160])
    return ", ".join(parts)


def _highlight(candidate: Candidate, lineage: Sequence[Step]) -> str:
    assert candidate.written is not None
    lexer = get_lexer_by_name(target_of(candidate.written.target).source_language)
    return highlight(kernel_text(candidate, lineage), lexer, HtmlFormatter(cssclass="code"))
