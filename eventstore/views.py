"""SQL views over the `events` table, for people who do not know the payload layout.

- `candidates`: one row per candidate, through all its stages (proposal, kernel,
  compile, verdict, benchmark or rejection, duplicate);
- `leaderboard`: a campaign's timed candidates at its shape (the one most of them were
  timed at). Each kernel's figure is its own timing run's, as recorded: `median_ns`,
  `iqr_ns`, and `speedup` over the baseline timed in that run (the ratio of the means over
  the timed calls, `baseline_mean_ns` over `run_mean_ns`, which moving work between calls
  cannot lower; the medians' in events recorded before the mean was kept). The rank goes
  by `pooled_median_ns`, the median of the run times (the mean, or the median before it
  was kept) over the `runs` that timed the kernel (its own, and each head-to-head run
  that timed it as the incumbent: the challenger's time times `speedup_vs_incumbent`);
  `speedup_vs_campaign_baseline` is the campaign's baseline (the median of its candidates'
  baseline times, `campaign_baseline_ns`) over that. The figures are those of
  `actors.campaign.leaderboard` (tests/test_leaderboard.py pins them), whose order puts
  the best, promoted head to head, first. Once a campaign's final run is recorded
  (`FinalRankingTimed`; the latest, where a final answer asked for later timed another),
  both put its placed contenders first in its order (by that run's mean), with its
  figures (`final_mean_ns`, `final_median_ns`, `final_iqr_ns`, `final_rounds`), then the
  rest by pooled time; `decided_by` says which rule placed a row;
- `lessons`: every lesson with the ids of the events it cites;
- `rejections`: one row per rejected candidate (stage, reason, first message line, and
  the operator that proposed it: a variation operator, an LLM's improve or fix, or
  `sample` for a template's point);
- `lineage`: one row per candidate with how it came from its parents: the operator, its
  parameters, the parents' candidate ids, the diff against the first parent (kernels a
  variation operator wrote), its status, and its own median and speedup where the
  leaderboard has it;
- `agent_steps`: an LLM agent's trail, one row per reply, tool call (with its arguments
  and bounded result) and give-up, in the order recorded, with the candidate it varied;
- `steps`: one row per event that has a cause, with the seconds from cause to effect
  and the role that produced it (time spent per actor).

The store keeps each payload as it was recorded, so a view reads a fact that a later
schema moved (BenchmarkCompleted's timing facts, in `evidence` in schema 1) from where
either schema holds it. The same SQL serves the store's own file (`create_views`) and
any other table holding the `events` columns, such as an attached copy
(`view_statements`).
"""

from __future__ import annotations

import re

import duckdb

VIEW_NAMES = (
    "candidates",
    "leaderboard",
    "lessons",
    "rejections",
    "steps",
    "lineage",
    "agent_steps",
)

_CANDIDATES = """
SELECT
    e.campaign_id,
    e.payload->>'candidate_id' AS candidate_id,
    max(CAST(e.payload->>'generation' AS INTEGER)) AS generation,
    any_value(e.payload->>'problem') AS problem,
    any_value(e.payload->>'target') AS target,
    any_value(e.payload->>'dtype') AS dtype,
    {first}('template', 'CandidateProposed') AS template,
    arg_min(e.payload->'params', e.position)
        FILTER (WHERE e.type = 'CandidateProposed') AS params,
    {first}('operator', 'CandidateProposed') AS operator,
    min(e.ts) FILTER (WHERE e.type = 'CandidateProposed') AS proposed_at,
    {first}('source_hash', 'KernelWritten') AS source_hash,
    {first}('writer', 'KernelWritten') AS writer,
    {first}('source', 'KernelWritten') AS source,
    arg_min(e.payload->'flags', e.position) FILTER (WHERE e.type = 'KernelWritten') AS flags,
    min(e.ts) FILTER (WHERE e.type = 'KernelWritten') AS written_at,
    min(e.ts) FILTER (WHERE e.type = 'KernelCompiled') AS compiled_at,
    min(e.ts) FILTER (WHERE e.type = 'KernelVerified') AS verified_at,
    CAST({first}('max_rel_err', 'KernelVerified') AS DOUBLE) AS max_rel_err,
    min(e.ts) FILTER (WHERE e.type = 'KernelRejected') AS rejected_at,
    {first}('stage', 'KernelRejected') AS rejected_stage,
    {first}('reason', 'KernelRejected') AS rejected_reason,
    min(e.ts) FILTER (WHERE e.type = 'BenchmarkCompleted') AS benchmarked_at,
    CAST({first}('median_ns', 'BenchmarkCompleted') AS DOUBLE) AS median_ns,
    CAST({first}('iqr_ns', 'BenchmarkCompleted') AS DOUBLE) AS iqr_ns,
    {first}('baseline', 'BenchmarkCompleted') AS baseline,
    CAST({first}('baseline_ns', 'BenchmarkCompleted') AS DOUBLE) AS baseline_ns,
    CAST({first}('mean_ns', 'BenchmarkCompleted') AS DOUBLE) AS mean_ns,
    CAST({first}('baseline_mean_ns', 'BenchmarkCompleted') AS DOUBLE) AS baseline_mean_ns,
    CAST({first}('speedup', 'BenchmarkCompleted') AS DOUBLE) AS speedup,
    CAST({first}('roofline_fraction', 'BenchmarkCompleted') AS DOUBLE) AS roofline_fraction,
    CAST(arg_min({fact}('shape', '->'), e.position)
        FILTER (WHERE e.type = 'BenchmarkCompleted') AS VARCHAR) AS shape,
    {first}('device', 'BenchmarkCompleted') AS device,
    {first}('duplicate_of', 'CandidateDeduplicated') AS duplicate_of,
    CASE
        WHEN count(*) FILTER (WHERE e.type = 'BenchmarkCompleted') > 0 THEN 'benchmarked'
        WHEN count(*) FILTER (WHERE e.type = 'KernelRejected') > 0 THEN 'rejected'
        WHEN count(*) FILTER (WHERE e.type = 'CandidateDeduplicated') > 0 THEN 'duplicate'
        WHEN count(*) FILTER (WHERE e.type = 'KernelVerified') > 0 THEN 'verified'
        WHEN count(*) FILTER (WHERE e.type = 'KernelCompiled') > 0 THEN 'compiled'
        WHEN count(*) FILTER (WHERE e.type = 'KernelWritten') > 0 THEN 'written'
        ELSE 'proposed'
    END AS status
FROM {events} AS e
WHERE e.type IN ('CandidateProposed', 'KernelWritten', 'KernelCompiled', 'KernelVerified',
                 'KernelRejected', 'BenchmarkCompleted', 'CandidateDeduplicated')
GROUP BY e.campaign_id, e.payload->>'candidate_id'
"""

_LEADERBOARD = """
WITH first_timing AS (  -- each candidate's first timing, the one a History keeps
    SELECT
        e.campaign_id,
        e.payload->>'candidate_id' AS candidate_id,
        {fact}('incumbent', '->>') AS incumbent,
        TRY_CAST({fact}('speedup_vs_incumbent', '->>') AS DOUBLE) AS speedup_vs_incumbent
    FROM {events} AS e
    WHERE e.type = 'BenchmarkCompleted'
    QUALIFY row_number() OVER (
        PARTITION BY e.campaign_id, e.payload->>'candidate_id' ORDER BY e.position
    ) = 1
),
proposed AS (
    SELECT e.campaign_id, e.payload->>'candidate_id' AS candidate_id, min(e.position) AS at
    FROM {events} AS e
    WHERE e.type = 'CandidateProposed'
    GROUP BY e.campaign_id, e.payload->>'candidate_id'
),
timed AS (  -- listed as a History lists a campaign's candidates
    SELECT c.*, f.incumbent, f.speedup_vs_incumbent,
        row_number() OVER (PARTITION BY c.campaign_id ORDER BY c.generation, p.at) AS listed
    FROM {candidates} AS c
    JOIN first_timing AS f USING (campaign_id, candidate_id)
    JOIN proposed AS p USING (campaign_id, candidate_id)
    WHERE c.median_ns IS NOT NULL
),
campaign_shape AS (  -- the shape most kernels were timed at; a tie goes to the first listed
    SELECT campaign_id, shape
    FROM timed
    GROUP BY campaign_id, shape
    QUALIFY row_number() OVER (PARTITION BY campaign_id ORDER BY count(*) DESC, min(listed)) = 1
),
at_shape AS (
    SELECT t.*
    FROM timed AS t
    JOIN campaign_shape AS s
        ON t.campaign_id = s.campaign_id AND t.shape IS NOT DISTINCT FROM s.shape
),
runs AS (  -- the time of each run that timed a kernel: its own, and each as the incumbent
    SELECT campaign_id, candidate_id, coalesce(mean_ns, median_ns) AS time_ns FROM at_shape
    UNION ALL
    SELECT campaign_id, incumbent, coalesce(mean_ns, median_ns) * speedup_vs_incumbent
    FROM at_shape
    WHERE speedup_vs_incumbent IS NOT NULL
),
own AS (
    SELECT t.campaign_id, t.candidate_id, median(r.time_ns) AS median_ns, count(*) AS runs
    FROM at_shape AS t
    JOIN runs AS r USING (campaign_id, candidate_id)
    GROUP BY t.campaign_id, t.candidate_id
),
final_run AS (  -- each campaign's final run, the latest recorded (a History's final_ranking)
    SELECT e.campaign_id, e.payload AS run
    FROM {events} AS e
    WHERE e.type = 'FinalRankingTimed'
    QUALIFY row_number() OVER (PARTITION BY e.campaign_id ORDER BY e.position DESC) = 1
),
final AS (  -- its contenders with a place in its order
    SELECT
        f.campaign_id, u.c.candidate_id,
        list_position(CAST(f.run->'order' AS VARCHAR[]), u.c.candidate_id) AS place,
        u.c.mean_ns, u.c.median_ns, u.c.iqr_ns, u.c.rounds,
        'final run of ' || json_array_length(f.run->'contenders') || ' ('
            || (f.run->>'rounds') || ' rounds)' AS decided_by
    FROM final_run AS f, unnest(from_json(f.run->'contenders',
        '[{"candidate_id":"VARCHAR","mean_ns":"DOUBLE","median_ns":"DOUBLE",'
        '"iqr_ns":"DOUBLE","rounds":"BIGINT"}]')) AS u(c)
)
SELECT
    rank() OVER (
        PARTITION BY t.campaign_id ORDER BY fin.place NULLS LAST, own.median_ns
    ) AS rank,
    t.campaign_id, t.problem, t.target, t.dtype, t.shape, t.candidate_id, t.generation,
    t.template, t.params,
    t.median_ns, t.iqr_ns, t.speedup, own.median_ns AS pooled_median_ns, own.runs,
    t.mean_ns AS run_mean_ns, t.baseline, t.baseline_ns,
    median(coalesce(t.baseline_mean_ns, t.baseline_ns)) OVER (PARTITION BY t.campaign_id)
        AS campaign_baseline_ns,
    median(coalesce(t.baseline_mean_ns, t.baseline_ns)) OVER (PARTITION BY t.campaign_id)
        / own.median_ns AS speedup_vs_campaign_baseline,
    t.roofline_fraction, t.device, t.source_hash, t.flags, t.source,
    coalesce(fin.decided_by, 'pooled time over ' || own.runs || ' run'
        || CASE WHEN own.runs = 1 THEN '' ELSE 's' END) AS decided_by,
    fin.mean_ns AS final_mean_ns, fin.median_ns AS final_median_ns,
    fin.iqr_ns AS final_iqr_ns, fin.rounds AS final_rounds
FROM at_shape AS t
JOIN own USING (campaign_id, candidate_id)
LEFT JOIN final AS fin
    ON fin.campaign_id = t.campaign_id AND fin.candidate_id = t.candidate_id
    AND fin.place > 0
"""

_LESSONS = """
SELECT
    e.campaign_id,
    e.position,
    e.event_id,
    e.ts,
    CAST(e.payload->>'generation' AS INTEGER) AS generation,
    e.payload->>'kind' AS kind,
    e.payload->>'statement' AS statement,
    CAST(e.payload->'evidence_ids' AS VARCHAR[]) AS evidence_ids,
    e.payload->'data' AS data
FROM {events} AS e
WHERE e.type = 'LessonLearned'
"""

_REJECTIONS = """
SELECT
    e.campaign_id,
    e.payload->>'candidate_id' AS candidate_id,
    CAST(e.payload->>'generation' AS INTEGER) AS generation,
    e.payload->>'problem' AS problem,
    e.payload->>'target' AS target,
    e.payload->>'stage' AS stage,
    e.payload->>'reason' AS reason,
    split_part(coalesce(e.payload->'evidence'->>'message', ''), chr(10), 1) AS message,
    coalesce(e.payload->'evidence'->>'operator', p.operator) AS operator,
    e.event_id,
    e.position,
    e.ts
FROM {events} AS e
LEFT JOIN (
    SELECT campaign_id, payload->>'candidate_id' AS candidate_id,
        arg_min(payload->>'operator', position) AS operator
    FROM {events}
    WHERE type = 'CandidateProposed'
    GROUP BY campaign_id, payload->>'candidate_id'
) AS p ON p.campaign_id = e.campaign_id AND p.candidate_id = e.payload->>'candidate_id'
WHERE e.type = 'KernelRejected'
"""

_LINEAGE = """
WITH made AS (
    SELECT
        e.campaign_id,
        e.payload->>'candidate_id' AS candidate_id,
        CAST(arg_min(e.payload->'parents', e.position)
            FILTER (WHERE e.type = 'CandidateProposed') AS VARCHAR[]) AS parents,
        {first}('diff', 'KernelWritten') AS diff
    FROM {events} AS e
    WHERE e.type IN ('CandidateProposed', 'KernelWritten')
    GROUP BY e.campaign_id, e.payload->>'candidate_id'
)
SELECT
    c.campaign_id, c.candidate_id, c.generation, c.problem, c.operator, c.params,
    coalesce(m.parents, []) AS parents, coalesce(m.diff, '') AS diff, c.writer, c.status,
    c.rejected_reason, l.median_ns, l.speedup
FROM candidates AS c
JOIN made AS m USING (campaign_id, candidate_id)
LEFT JOIN leaderboard AS l USING (campaign_id, candidate_id)
"""

_STEPS = """
SELECT
    e.campaign_id,
    e.position,
    e.event_id,
    e.type,
    e.actor_role,
    e.actor_instance,
    c.type AS cause_type,
    epoch(e.ts) - epoch(c.ts) AS seconds
FROM {events} AS e
JOIN {events} AS c ON c.event_id = e.causation_id
"""

_AGENT_STEPS = """
SELECT
    e.campaign_id,
    e.payload->>'candidate_id' AS candidate_id,
    CAST(e.payload->>'generation' AS INTEGER) AS generation,
    CAST(e.payload->>'step' AS INTEGER) AS step,
    e.payload->>'kind' AS kind,
    e.payload->>'tool' AS tool,
    e.payload->>'arguments' AS arguments,
    e.payload->>'result' AS result,
    e.payload->>'content' AS content,
    CAST(e.payload->'tool_calls' AS VARCHAR[]) AS tool_calls,
    TRY_CAST(e.payload->'usage'->>'total_tokens' AS BIGINT) AS tokens,
    CAST(e.payload->>'latency_s' AS DOUBLE) AS latency_s,
    e.payload->>'model' AS model,
    e.event_id,
    e.position,
    e.ts
FROM {events} AS e
WHERE e.type = 'AgentStep'
"""

_FIRST = re.compile(r"\{first\}\('(\w+)', '(\w+)'\)")


def _first_of(match: re.Match[str]) -> str:
    """A payload field of a candidate's first event of one type."""
    field, event_type = match.groups()
    return f"arg_min(e.payload->>'{field}', e.position) FILTER (WHERE e.type = '{event_type}')"


_FACT = re.compile(r"\{fact\}\('(\w+)', '(->>?)'\)")


def _fact_of(match: re.Match[str]) -> str:
    """A BenchmarkCompleted timing fact (`->` JSON, `->>` text): a field since schema 2, in
    `evidence` before."""
    field, arrow = match.groups()
    return f"coalesce(e.payload{arrow}'{field}', e.payload->'evidence'{arrow}'{field}')"


def _expand(body: str, events: str) -> str:
    return _FACT.sub(_fact_of, _FIRST.sub(_first_of, body)).replace("{events}", events)


def view_statements(events: str = "events", temporary: bool = False) -> list[str]:
    """CREATE VIEW statements over a table (or qualified name) with the `events` columns."""
    kind = "TEMP VIEW" if temporary else "VIEW"
    bodies = {
        "candidates": _expand(_CANDIDATES, events),
        "leaderboard": _expand(_LEADERBOARD.replace("{candidates}", "candidates"), events),
        "lessons": _expand(_LESSONS, events),
        "rejections": _expand(_REJECTIONS, events),
        "steps": _expand(_STEPS, events),
        "lineage": _expand(_LINEAGE, events),
        "agent_steps": _expand(_AGENT_STEPS, events),
    }
    return [f"CREATE OR REPLACE {kind} {name} AS {body}" for name, body in bodies.items()]


def create_views(conn: duckdb.DuckDBPyConnection, events: str = "events") -> None:
    """Create (or refresh) every view on this connection's database."""
    for statement in view_statements(events):
        conn.execute(statement)
