"""Campaign files and flags: validated at load with one-line errors; flags override."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from actors.campaign.campaign_file import (
    Agent,
    CampaignError,
    CampaignSpec,
    Writer,
    load_campaign,
    parse_shapes,
    with_overrides,
)

DEMO = Path(__file__).parent.parent / "campaigns" / "demo.toml"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("shapes = [[-4, 0]]", "shapes: [-4, 0] is not a shape"),
        ("shapes = [[]]", "shapes: [] is not a shape"),
        ('shapes = [[4, "a"]]', "Expected `int`, got `str` - at `$.shapes[0][1]`"),
        ("[budget]\ncandidates = 0", "budget.candidates = 0: must be at least 1"),
        ('[budget]\nwall_time = "0s"', "budget.wall_time '0s' must be longer than 0 s"),
        ('[budget]\nwall_time = "soon"', "is not a duration like 90s, 30m or 2h"),
        ("[budget]\nstop_at_roofline = 2.0", "stop_at_roofline = 2.0: must be in (0, 1.5]"),
        ("[search]\nper_generation = -1", "search.per_generation = -1: must be at least 1"),
        ("[writer]\nattempts = 0", "writer: timeout_s must be > 0, attempts >= 1"),
        ('[writer]\nkind = "genetic"', "Invalid enum value 'genetic' - at `$.writer.kind`"),
        ("[writer.agent]\nmax_steps = 0", "writer.agent: max_steps and max_tokens must be at"),
        ("[writer.agent]\nmax_tokens = -5", "writer.agent: max_steps and max_tokens must be at"),
        ('[writer.agent]\nwall_time = "later"', "writer.agent.wall_time 'later' is not a dura"),
        ('[writer.agent]\nwall_time = "0m"', "writer.agent.wall_time '0m' must be longer"),
        (
            "[writer.agent]\nsteps = 3",
            "Object contains unknown field `steps` - at `$.writer.agent`",
        ),
    ],
)
def test_a_bad_field_is_refused_at_load_in_one_line(
    tmp_path: Path, body: str, message: str
) -> None:
    path = tmp_path / "c.toml"
    path.write_text(f'problem = "softmax"\n{body}\n')
    with pytest.raises(CampaignError) as caught:
        load_campaign(path)
    assert message in str(caught.value) and str(path) in str(caught.value)
    assert "\n" not in str(caught.value)


def test_the_agents_bounds_have_defaults_and_are_read_from_writer_agent(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('problem = "softmax"\n')
    default = load_campaign(path).writer
    assert not default.has_endpoint
    assert (default.agent.max_steps, default.agent.wall_seconds()) == (12, 600)
    path.write_text(
        'problem = "softmax"\n[writer]\nkind = "evolve"\nbase_url = "http://127.0.0.1:8000/v1"\n'
        'model = "m"\n[writer.agent]\nmax_steps = 5\nmax_tokens = 9000\nwall_time = "90s"\n'
    )
    writer = load_campaign(path).writer
    assert writer.has_endpoint
    assert (writer.agent.max_steps, writer.agent.max_tokens, writer.agent.wall_seconds()) == (
        5,
        9000,
        90,
    )


def test_flags_override_the_file() -> None:
    spec = load_campaign(DEMO)
    changed = with_overrides(spec, budget=3, wall_time="20s", shapes="64x64,8x8", name="mine")
    assert changed.budget.candidates == 3 and changed.budget.wall_seconds() == 20
    assert changed.shapes == [[64, 64], [8, 8]] and changed.campaign_id == "mine"
    assert changed.search == spec.search and changed.budget.stop_at_roofline == (
        spec.budget.stop_at_roofline
    )
    assert with_overrides(spec) == spec
    with pytest.raises(CampaignError, match="extents joined by x"):
        parse_shapes("64 by 64")
    with pytest.raises(CampaignError, match=r"shapes: \[0, 64\] is not a shape"):
        with_overrides(spec, shapes="0x64")


def test_the_command_line_refuses_bad_flags_and_files_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('problem = "softmax"\nshapes = [[-4, 0]]\n')
    for args, message in [
        ([str(bad)], f"{bad}: shapes: [-4, 0] is not a shape"),
        ([str(DEMO), "--wall-time", "0s"], "budget.wall_time '0s' must be longer than 0 s"),
        ([str(DEMO), "--shapes", "2048x2048x2"], "shapes: [2048, 2048, 2] does not give"),
        ([str(DEMO), "--name", "no spaces"], "campaign name"),
    ]:
        done = subprocess.run(
            [sys.executable, "-m", "ops.cli", "run", *args, "--home", str(tmp_path / "h")],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2, (args, done.stderr)
        assert message in done.stderr, (args, done.stderr)
        assert done.stderr.strip().count("\n") == 0, done.stderr


def test_a_request_without_writer_agent_keeps_the_id_it_had_before_the_table() -> None:
    # the ids these requests were given before `[writer.agent]` existed: run again, they resume
    assert CampaignSpec(problem="softmax").campaign_id == "softmax-cpu-94cc0d14"
    endpoint = Writer(kind="evolve", base_url="http://x/v1", model="m")
    spec = CampaignSpec(problem="rmsnorm", shapes=[[64, 128]], writer=endpoint)
    assert spec.campaign_id == "rmsnorm-cpu-7b393927"
    bounded = msgspec.structs.replace(endpoint, agent=Agent(max_steps=3))
    assert msgspec.structs.replace(spec, writer=bounded).campaign_id != spec.campaign_id
