"""Design spaces from the user's files, resolved without running a campaign: declarations,
restrictions, rendering, the generic space, the resolution the planner and
`problems show` share, and the files `kfactory new problem` writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from actors.campaign.campaign_file import CampaignSpec, load_campaign
from actors.campaign.history import Candidate
from actors.search.llm import prompts
from actors.search.spaces import (
    design_spaces,
    kernel_templates,
    seed_points,
    starting_points,
    template_named,
)
from actors.search.template_strategy import TemplateStrategy
from actors.search.variation import archive_of, blank_page, source_traits, variations
from eventstore.events import (
    ActorRef,
    BenchmarkCompleted,
    CandidateProposed,
    KernelWritten,
    new_event,
)
from kernels.loading import load_problem
from kernels.user_spaces import (
    GenericSpace,
    JinjaTemplate,
    KernelSpace,
    MacroTemplate,
    SpaceError,
    build_space,
    generic_space,
    with_openmp_clauses,
)
from ops import new_cmd, problems_cmd
from tests.test_user_spaces import MACRO, PROBLEM, SEED, _write_problem


@pytest.fixture
def cli() -> tuple[CliRunner, typer.Typer]:
    app = typer.Typer()

    @app.callback()
    def root() -> None:
        """Root."""

    problems_cmd.register(app)
    new_cmd.register(app)
    return CliRunner(), app


def test_a_macro_kernel_takes_its_values_as_defines_and_keeps_its_source(
    tmp_path: Path,
) -> None:
    (tmp_path / "k.c").write_text(MACRO)
    space = build_space(
        KernelSpace("k.c", {"BLOCK": [2, 4, 8], "UNROLL": [1, 2]}, ["BLOCK * UNROLL <= 8"]),
        tmp_path,
        "p.py:P",
    )
    assert isinstance(space, MacroTemplate)
    points = list(space.valid_points())
    assert {"BLOCK": 8, "UNROLL": 2} not in points and {"BLOCK": 8, "UNROLL": 1} in points
    rendered = space.render({"BLOCK": 4, "UNROLL": 2})
    assert rendered.source == MACRO
    assert rendered.flags == ("-O3", "-march=native", "-DBLOCK=4", "-DUNROLL=2")


@pytest.mark.parametrize(
    ("restriction", "message"),
    [
        ("BLOCK <=", "is not an expression"),
        ("BLOCKS <= 4", r"unknown parameters \['BLOCKS'\]"),
        ("BLOCK > 99", "no point satisfies every restriction"),
        (
            "[x.__class__ for x in (BLOCK,)] and BLOCK",
            "may not use comprehensions or lambdas",
        ),
        ("BLOCK.__class__ is int", r"unknown parameters \['__class__'\]"),
    ],
)
def test_a_bad_restriction_is_refused_naming_the_file(
    tmp_path: Path, restriction: str, message: str
) -> None:
    (tmp_path / "k.c").write_text(MACRO)
    with pytest.raises(SpaceError, match=message) as caught:
        build_space(KernelSpace("k.c", {"BLOCK": [2, 4]}, [restriction]), tmp_path, "p.py:P")
    assert str(tmp_path / "k.c") in str(caught.value)


def test_a_macro_value_that_is_not_a_define_is_refused(tmp_path: Path) -> None:
    (tmp_path / "k.c").write_text(MACRO)
    with pytest.raises(SpaceError, match="cannot be -D macro values"):
        build_space(KernelSpace("k.c", {"MODE": ["a b"]}), tmp_path, "p.py:P")


def test_a_user_jinja_template_can_include_the_packages_helpers(tmp_path: Path) -> None:
    (tmp_path / "t.c.j2").write_text(
        '{% include "_common.c.j2" %}\nvoid kernel(const float *x, float *y, int64_t n) {}\n'
    )
    params = {
        "simdlen": [8, 16],
        "threads": [1],
        "schedule": ["static"],
        "unroll": [1],
        "streaming": [False],
        "prefetch": [0],
    }
    space = build_space(KernelSpace("t.c.j2", params), tmp_path, "p.py:P")
    assert isinstance(space, JinjaTemplate)
    rendered = space.render(space.defaults)
    assert "#define KF_W 8" in rendered.source and "from template t" in rendered.source


def test_the_generic_space_tunes_openmp_without_an_edit() -> None:
    space = generic_space("seed_k", "p.py:P", SEED, "/x/k.c")
    names = [p.name for p in space.params]
    assert names == ["flags", "vector_width", "threads", "schedule"]
    as_is = space.render(space.defaults)
    assert as_is.source == SEED and as_is.flags == ("-O3", "-fopenmp")
    tuned = space.render(
        {"flags": "-O3 -march=native", "vector_width": 512, "threads": 2, "schedule": "dynamic"}
    )
    assert "#pragma omp parallel for num_threads(2) schedule(dynamic)" in tuned.source
    assert "-mprefer-vector-width=512" in tuned.flags
    one = space.render({"flags": "-O3", "vector_width": 0, "threads": 1, "schedule": "as_written"})
    assert "-fopenmp-simd" in one.flags and one.source == SEED
    assert not space.is_valid(
        {"flags": "-O3", "vector_width": 256, "threads": 0, "schedule": "as_written"}
    )
    assert not space.is_valid(
        {"flags": "-O3", "vector_width": 0, "threads": 1, "schedule": "dynamic"}
    )
    plain = generic_space("seed_p", "p.py:P", "void kernel(void) {}\n", "/x/p.c")
    assert [p.name for p in plain.params] == ["flags", "vector_width"]
    assert plain.render(plain.defaults).flags == ("-O3",)


def test_clauses_the_kernel_names_itself_are_kept() -> None:
    source = "#pragma omp parallel for schedule(guided) num_threads(4)\nfor(;;);\n"
    assert with_openmp_clauses(source, 2, "static") == source


def test_spaces_are_keyed_by_the_resolved_problem_file_not_its_name(tmp_path: Path) -> None:
    text = PROBLEM.replace('name="l2norm_rows"', 'name="softmax"').replace("SPACES_HERE", "[]")
    (tmp_path / "ops.py").write_text(text)
    spec = f"{tmp_path / 'ops.py'}:L2NORM"
    assert load_problem(spec).name == "softmax"
    assert design_spaces(spec, "cpu") == []  # never the built-in softmax templates


def test_problems_show_lists_what_the_planner_searches(
    cli: tuple[CliRunner, typer.Typer], tmp_path: Path
) -> None:
    runner, app = cli
    (tmp_path / "l2_rows.c.j2").write_text("void kernel(void) {}\n")
    spaces = '[KernelSpace("l2_rows.c.j2", {"unroll": [1, 2]}, problem="L2NORM")]'
    problem = _write_problem(tmp_path, spaces)
    result = runner.invoke(app, ["problems", "show", problem, "--json"])
    assert result.exit_code == 0, result.output
    shown = [t["name"] for t in json.loads(result.output)["templates"]]
    assert shown == [t.name for t in design_spaces(problem, "cpu")]
    assert [name.split("@")[0] for name in shown] == ["l2_rows"]


def test_a_campaign_file_resolves_its_files_next_to_it(tmp_path: Path) -> None:
    _write_problem(tmp_path)
    (tmp_path / "seed.c").write_text(SEED)
    (tmp_path / "m.c").write_text(MACRO)
    (tmp_path / "c.toml").write_text(
        'problem = "l2.py:L2NORM"\n[seed]\nsources = ["seed.c"]\n'
        '[[spaces]]\nfile = "m.c"\nparams = {BLOCK = [2, 4]}\n'
    )
    spec = load_campaign(tmp_path / "c.toml")
    assert spec.problem == f"{tmp_path / 'l2.py'}:L2NORM"
    assert spec.seed.sources == [str(tmp_path / "seed.c")]
    found = kernel_templates(spec.problem, "cpu", spec)
    assert [t.name.split("@")[0] for t in found] == ["seed_seed", "m"]
    assert isinstance(found[0], GenericSpace)
    assert [p.template for p in seed_points(spec)] == [found[0].name]
    # a template search starts from the seed as it is, then the other space's best point
    starting = starting_points(spec)
    assert [p.template for p in starting] == [found[0].name, found[1].name]
    assert starting[0].params == found[0].defaults
    assert starting[1].params == found[1].best_known
    assert template_named(spec, found[1].name) == found[1]
    (tmp_path / "m.c").write_text(MACRO + "/* edited */\n")
    edited = kernel_templates(spec.problem, "cpu", spec)[1].name
    assert edited.startswith("m@") and edited != found[1].name  # new points to the search


def test_the_blank_page_prompt_states_the_problem_alone(tmp_path: Path) -> None:
    problem = load_problem(_write_problem(tmp_path))
    ceilings = prompts.HostCeilings("test-host", bandwidth_gbs=10.0, peak_gflops=100.0)
    messages = prompts.write(problem, ["use two threads"], ceilings=ceilings)
    text = messages[1]["content"]
    assert "void kernel(const float *x, float *y, int64_t rows, int64_t cols)" in text
    assert "def _l2norm(a):" in text and "1e-12" in text
    assert "262144 bytes moved" in text and "10.0 GB/s" in text and "use two threads" in text
    assert "26.2 us" in text  # 262144 bytes at 10 GB/s
    keys = {v.key("c", 0) for v in blank_page(3)}
    assert len(keys) == 3


def test_kernels_without_a_template_fall_in_niches_by_how_they_are_built() -> None:
    assert source_traits("for (;;) y = x;") == "scalar"
    assert source_traits("#pragma omp parallel for\n#pragma omp simd\n") == "threads+simd"
    assert source_traits("__m256 v = _mm256_loadu_ps(p);") == "intrinsics"


def test_new_problem_writes_files_that_resolve(
    cli: tuple[CliRunner, typer.Typer], tmp_path: Path
) -> None:
    runner, app = cli
    folder = tmp_path / "mine"
    result = runner.invoke(app, ["new", "problem", "rownorm", "--folder", str(folder)])
    assert result.exit_code == 0, result.output
    spec = load_campaign(folder / "campaign.toml")
    found = kernel_templates(spec.problem, "cpu", spec)
    assert [t.name.split("@")[0] for t in found] == ["seed_rownorm_seed", "rownorm"]
    for point in found[1].valid_points():
        assert "void kernel(const float *x, float *y" in found[1].render(point).source
    again = runner.invoke(app, ["new", "problem", "rownorm", "--folder", str(folder)])
    assert again.exit_code != 0 and "--force" in str(again.exception)


def _llm_candidate(
    cid: str, family: str, source: str, speedup: float, parents: tuple[str, ...] = ()
) -> Candidate:
    actor = ActorRef.here("test")
    work = {"campaign_id": "c", "actor": actor, "problem": "p.py:P", "target": "cpu"}
    work |= {"candidate_id": cid, "generation": 0 if not parents else 1}
    proposal = new_event(
        CandidateProposed,
        template="llm",
        params={"family": family},
        operator="write" if not parents else "improve",
        parents=list(parents),
        **work,
    )
    written = new_event(
        KernelWritten, source_hash=cid, source=source, flags=[], writer="llm", **work
    )
    benchmark = new_event(
        BenchmarkCompleted,
        source_hash=cid,
        median_ns=1.0,
        iqr_ns=0.0,
        baseline="numpy",
        baseline_ns=speedup,
        speedup=speedup,
        roofline_fraction=0.1,
        **work,
    )
    return Candidate(proposal, written=written, benchmark=benchmark)


def test_blank_page_kernels_fill_niches_and_are_crossed_over() -> None:
    threaded = "#pragma omp parallel for\nfor (;;);\n"
    candidates = [
        _llm_candidate("c:g0:c0", "write0", "for (;;);\n", 1.5),
        _llm_candidate("c:g0:c1", "write1", threaded, 3.0),
        _llm_candidate("c:g1:c0", "ignored", threaded, 2.5, parents=("c:g0:c0",)),
    ]
    niches = set(archive_of(candidates).cells())
    assert {(n.family, n.algorithm) for n in niches} == {
        ("write0", "scalar"),
        ("write1", "threads"),
        ("write0", "threads"),  # the child keeps its root's family, with its own traits
    }
    chosen = variations(candidates, 4, 2, seed=1)
    assert {v.operator for v in chosen} == {"improve", "crossover"}
    crossed = next(v for v in chosen if v.operator == "crossover")
    assert len(set(crossed.parents)) == 2


def test_two_spaces_of_one_name_are_refused(tmp_path: Path) -> None:
    (tmp_path / "k.c").write_text(MACRO)
    spaces = '[KernelSpace("k.c", {"BLOCK": [2]}), KernelSpace("k.c", {"BLOCK": [4]})]'
    with pytest.raises(SpaceError, match="names of their own"):
        design_spaces(_write_problem(tmp_path, spaces), "cpu")


def test_a_template_search_starts_from_each_built_in_templates_best_known_point(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("kernels.templates.host_has", lambda feature: feature != "avx512f")
    spec = CampaignSpec(problem="softmax")
    first = TemplateStrategy().first_points(spec)
    templates = kernel_templates("softmax", "cpu", spec)
    assert [p.template for p in first] == [t.name for t in templates]
    assert [p.params for p in first] == [t.best_known for t in templates]


@pytest.mark.parametrize("avx512", [True, False])
def test_a_search_starts_from_points_known_on_other_hosts_that_this_one_can_run(
    avx512: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """softmax_rows' fastest point on an AVX-512 Xeon is proposed after its best known
    point where the host has AVX-512, and never where it has not (its space lacks it). The
    LLM writer starts from the best known points alone: one elite per template."""
    monkeypatch.setattr(
        "kernels.templates.host_has", lambda feature: avx512 or feature != "avx512f"
    )
    spec = CampaignSpec(name="c", problem="softmax")
    template = next(t for t in kernel_templates("softmax", "cpu", spec) if t.name == "softmax_rows")
    elsewhere = template.known_elsewhere[0]
    assert elsewhere["isa"] == "avx512" and elsewhere["fuse"] == "pipelined"
    first = TemplateStrategy().first_points(spec)
    started = [p.params for p in first if p.template == "softmax_rows"]
    assert started == ([template.best_known, elsewhere] if avx512 else [template.best_known])
    assert [p.params for p in starting_points(spec) if p.template == "softmax_rows"] == [
        template.best_known
    ]
