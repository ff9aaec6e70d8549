"""`kfactory problems` and `kfactory check` as a user runs them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from gpu_workers.targets import device_missing
from kernels.builtin import BUILTIN
from kernels.templates import example_kernel
from ops import check_cmd, problems_cmd
from ops.cli import main
from tests.cpu_support import EXAMPLES, PLANTED, kf_cache
from tests.problem_files import ROTARY_KERNEL, ROTARY_MATH, WRONG_ROTARY_KERNEL, write_rotary

__all__ = ["kf_cache"]
JSON_KEYS = {
    "verdict",
    "stage",
    "reason",
    "max_rel_err",
    "median_ns",
    "baseline_ns",
    "speedup",
    "roofline_fraction",
}


@pytest.fixture
def cli(kf_cache: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[CliRunner, typer.Typer]:
    monkeypatch.setenv("KFACTORY_CACHE_DIR", str(kf_cache))
    app = typer.Typer()

    @app.callback()
    def root() -> None:
        """Root."""

    problems_cmd.register(app)
    check_cmd.register(app)
    return CliRunner(), app


def test_problems_lists_every_problem_with_signature(cli: tuple[CliRunner, typer.Typer]) -> None:
    runner, app = cli
    result = runner.invoke(app, ["problems", "--json"])
    assert result.exit_code == 0, result.output
    listed = {p["name"]: p for p in json.loads(result.output)}
    assert {"softmax", "rmsnorm", "layernorm", "gelu", "matmul", "kda"} <= set(listed)
    assert listed["softmax"]["signature"].startswith("void kernel(const float *x, float *y")
    table = runner.invoke(app, ["problems"])
    assert table.exit_code == 0 and "residual_rmsnorm_gelu" in table.output


def test_problems_show_gives_details_and_an_example(cli: tuple[CliRunner, typer.Typer]) -> None:
    runner, app = cli
    result = runner.invoke(app, ["problems", "show", "matmul"])
    assert result.exit_code == 0, result.output
    for text in ("C signature", "Tolerances", "matmul_packed", "matmul_blocked", "void kernel("):
        assert text in result.output
    data = json.loads(runner.invoke(app, ["problems", "show", "softmax", "--json"]).output)
    assert [t["name"] for t in data["templates"]] == ["softmax_rows"]
    assert (
        data["example_kernel"]
        == "\n".join((EXAMPLES / "softmax.c").read_text().splitlines(keepends=False)[2:]) + "\n"
    )


def test_check_verifies_and_benches_an_example(cli: tuple[CliRunner, typer.Typer]) -> None:
    runner, app = cli
    args = ["check", "softmax", "--target", "cpu", "--source", str(EXAMPLES / "softmax.c")]
    result = runner.invoke(app, [*args, "--json", "--bench", "--shape", "rows=64,cols=1000"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert set(report) >= JSON_KEYS
    assert report["verdict"] == "verified" and report["stage"] is None
    assert report["median_ns"] > 0 and report["baseline_ns"] > 0
    assert report["speedup"] == pytest.approx(report["baseline_mean_ns"] / report["mean_ns"])
    assert 0 < report["roofline_fraction"] <= 1.1
    assert report["envelope"] == BUILTIN["softmax"].envelope and "2^20" in report["envelope"]
    human = runner.invoke(app, args)
    assert human.exit_code == 0 and human.output.startswith("verified: softmax on cpu")
    assert f"shapes:   verified on {BUILTIN['softmax'].envelope}" in human.output


def test_check_reports_a_rejection_with_exit_status_1(cli: tuple[CliRunner, typer.Typer]) -> None:
    runner, app = cli
    source = str(PLANTED / "first_row_only.c")
    result = runner.invoke(app, ["check", "softmax", "--source", source, "--json", "--bench"])
    assert result.exit_code == 1
    report = json.loads(result.output)
    assert (report["verdict"], report["stage"], report["reason"]) == (
        "rejected",
        "compare",
        "unwritten",
    )
    assert report["median_ns"] is None
    human = runner.invoke(app, ["check", "softmax", "--source", str(PLANTED / "segfaults.c")])
    assert human.exit_code == 1
    assert "rejected at stage run (crashed)" in human.output and "SIGSEGV" in human.output
    forever = str(PLANTED / "loops_forever.c")
    hung = runner.invoke(app, ["check", "softmax", "--source", forever, "--timeout", "2", "--json"])
    assert hung.exit_code == 1
    assert json.loads(hung.output)["reason"] == "timeout"


def test_help_teaches_with_examples(cli: tuple[CliRunner, typer.Typer]) -> None:
    runner, app = cli
    for args in (["check", "--help"], ["problems", "--help"], ["problems", "show", "--help"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 0
        assert "Examples" in result.output and "kfactory" in result.output


def test_bad_input_is_one_clear_line(
    kf_cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KFACTORY_CACHE_DIR", str(kf_cache))
    source = str(EXAMPLES / "softmax.c")
    cases = [
        (["check", "sofmax", "--source", source], "unknown problem 'sofmax'"),
        (["check", "softmax", "--source", "/nope.c"], "does not exist"),
        (["check", "softmax", "--source", source, "--target", "tpu"], "unknown target 'tpu'"),
        (["check", "softmax", "--source", source, "--dtype", "bf16"], "not 'bf16'"),
        (["check", "softmax", "--source", source, "--shape", "rows=4"], "exactly the dims"),
        (["problems", "show", "nope.py:X"], "does not exist"),
    ]
    for argv, expected in cases:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("kfactory: error: ") and expected in err
        assert err.count("\n") == 1


SWIGLU_FILE = """
import numpy as np
from kernels.spec import Arg, Cost, Problem


def _swiglu(i):
    a, b = i["a"], i["b"]
    return {"y": a / (1 + np.exp(-np.clip(a, -80, 80))) * b}


SWIGLU = Problem(
    name="swiglu", description="silu(a) * b", dims=("n",),
    args=(Arg("a", ("n",)), Arg("b", ("n",)), Arg("y", ("n",), output=True)),
    reference=_swiglu, baseline=_swiglu,
    test_shapes=({"n": 64}, {"n": 1}, {"n": 1001}), default_shape={"n": 1 << 16},
    cost=lambda s: Cost(bytes_moved=12 * s["n"], flops=6 * s["n"]),
)
"""
SWIGLU_KERNEL = """
#include <math.h>
#include <stdint.h>
void kernel(const float *a, const float *b, float *y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        float x = a[i] < -80.0f ? -80.0f : (a[i] > 80.0f ? 80.0f : a[i]);
        y[i] = a[i] / (1.0f + expf(-x)) * b[i];
    }
}
"""


def test_check_a_problem_from_a_user_file(
    cli: tuple[CliRunner, typer.Typer], tmp_path: Path
) -> None:
    runner, app = cli
    (tmp_path / "my_ops.py").write_text(SWIGLU_FILE)
    (tmp_path / "swiglu.c").write_text(SWIGLU_KERNEL)
    problem = f"{tmp_path / 'my_ops.py'}:SWIGLU"
    args = ["check", problem, "--source", str(tmp_path / "swiglu.c"), "--json"]
    result = runner.invoke(app, [*args, "--bench", "--flags", "-O2"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["verdict"] == "verified" and report["problem"] == "swiglu"
    assert report["median_ns"] > 0 and report["shape"] == {"n": 1 << 16}


needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
no_gpu = pytest.mark.skipif(device_missing("cuda") is None, reason="this host has a GPU")


@needs_nvcc
@no_gpu
def test_check_of_a_cuda_kernel_without_a_gpu_compiles_checks_and_says_it_did_not_run(
    cli: tuple[CliRunner, typer.Typer], tmp_path: Path
) -> None:
    runner, app = cli
    example = example_kernel("softmax", "cuda", "bf16")
    assert example is not None
    source = tmp_path / "softmax.cu"
    source.write_text(example.source)
    args = ["check", "softmax", "--target", "cuda", "--dtype", "bf16", "--source", str(source)]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == check_cmd.EXIT_NOT_RUN, result.output
    report = json.loads(result.output)
    assert report["verdict"] == "not_run" and report["arch"] == "sm_90"
    assert report["message"] == f"not run: {device_missing('cuda')}"
    assert [r["kernel"] for r in report["resources"]] == ["kf_softmax_rows"]
    assert report["resources"][0]["registers"] > 0
    human = runner.invoke(app, args)
    assert "compiled and checked for sm_90" in human.output and "not run:" in human.output


@needs_nvcc
@no_gpu
def test_check_refuses_a_spilling_cuda_kernel_on_any_host(
    cli: tuple[CliRunner, typer.Typer],
) -> None:
    runner, app = cli
    spills = str(PLANTED / "cuda_spills.cu")
    result = runner.invoke(
        app, ["check", "softmax", "--target", "cuda", "--source", spills, "--json"]
    )
    assert result.exit_code == 1, result.output
    report = json.loads(result.output)
    assert (report["stage"], report["reason"]) == ("static", "register_spill")


def test_check_a_rotary_embedding_with_a_derived_dim_and_no_extra_argument(
    cli: tuple[CliRunner, typer.Typer], tmp_path: Path
) -> None:
    """half = cols // 2 is declared in the problem, not passed: a correct C kernel that
    computes it passes with the margin per distribution printed; a wrong one is rejected."""
    runner, app = cli
    problem = write_rotary(tmp_path)
    (tmp_path / "rotary.c").write_text(ROTARY_KERNEL)
    (tmp_path / "wrong.c").write_text(WRONG_ROTARY_KERNEL)
    args = ["check", problem, "--flags", "-O2", "--source"]
    result = runner.invoke(app, [*args, str(tmp_path / "rotary.c"), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["verdict"] == "verified" and report["problem"] == "rotary"
    assert set(report["margins"]) == {"normal", "uniform", "ties"}
    for margin in report["margins"].values():
        assert 0 <= margin["used"] < 1 and margin["margin"] == pytest.approx(1 - margin["used"])
        assert margin["shape"]["cols"] % 2 == 0
    worst = report["worst"]
    assert worst["used"] == max(m["used"] for m in report["margins"].values())
    assert worst["shape"]["half"] == worst["shape"]["cols"] // 2
    assert worst["error"] == pytest.approx(abs(worst["got"] - worst["expected"]))
    text = runner.invoke(app, [*args, str(tmp_path / "rotary.c"), "--seed", str(report["seed"])])
    assert text.exit_code == 0, text.output
    assert "margins:" in text.output and "worst:    y[" in text.output
    for distribution in ("normal", "uniform", "ties"):
        assert f"\n  {distribution} " in text.output
    wrong = runner.invoke(app, [*args, str(tmp_path / "wrong.c"), "--json"])
    assert wrong.exit_code == 1, wrong.output
    rejected = json.loads(wrong.output)
    assert (rejected["stage"], rejected["reason"]) == ("compare", "wrong_value")
    assert rejected["worst"]["used"] > 1 and rejected["margins"] == {}


def test_a_wrong_value_names_the_worst_element_and_it_is_that_element(
    cli: tuple[CliRunner, typer.Typer],
) -> None:
    """The planted gelu is wrong for negative inputs only: the worst element the verdict
    names is one, and its trial replays to the same values."""
    runner, app = cli
    source = str(PLANTED / "gelu_wrong_for_negatives.c")
    result = runner.invoke(app, ["check", "gelu", "--source", source, "--json"])
    assert result.exit_code == 1, result.output
    report = json.loads(result.output)
    assert report["reason"] == "wrong_value"
    worst = report["worst"]
    gelu = BUILTIN["gelu"]
    inputs = gelu.generate(worst["shape"], worst["distribution"], worst["seed"])
    expected = gelu.expected(inputs)
    index = tuple(worst["index"])
    assert inputs["x"][index] < 0
    assert worst["expected"] == expected["y"][index]
    assert worst["scale"] == gelu.scales(inputs, expected)["y"][index]
    tolerance = gelu.tolerances["fp32"]
    assert worst["allowed"] == pytest.approx(tolerance.atol + tolerance.rtol * worst["scale"])
    assert worst["error"] == pytest.approx(abs(worst["got"] - worst["expected"]))
    assert worst["used"] == pytest.approx(worst["error"] / worst["allowed"]) and worst["used"] > 1
    assert report["evidence"]["worst_index"] == str(index)
    assert report["evidence"]["shape"] == str(worst["shape"])


def test_problem_mistakes_and_broken_constraints_are_one_line_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    problem = write_rotary(tmp_path)
    (tmp_path / "rotary.c").write_text(ROTARY_KERNEL)
    source = str(tmp_path / "rotary.c")
    assert main(["check", problem, "--source", source, "--bench", "--shape", "rows=4,cols=7"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "kfactory: error: --shape {'rows': 4, 'cols': 7} breaks the constraint cols % 2 == 0\n"
    )
    (tmp_path / "rotary_math.py").write_text(ROTARY_MATH.replace("], axis=1)}", "], axis=0)}"))
    assert main(["check", problem, "--source", source]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kfactory: error: {problem}: the reference returns y of shape")
    assert err.count("\n") == 1


def test_problems_show_keeps_square_brackets_and_fits_the_terminal(
    cli: tuple[CliRunner, typer.Typer], tmp_path: Path
) -> None:
    runner, app = cli
    problem = write_rotary(tmp_path)
    result = runner.invoke(app, ["problems", "show", problem], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "y[r, i] = x[r, i] cos[r, i] - x[r, i + half] sin[r, i]" in result.output
    assert "cosines input  [rows, half] float32" in result.output
    assert "  y       output [rows, cols] float32" in result.output
    assert "Derived dim:   half = cols // 2" in result.output
    assert "Constraint:    cols % 2 == 0" in result.output
    data = json.loads(runner.invoke(app, ["problems", "show", problem, "--json"]).output)
    assert data["derived"] == {"half": "cols // 2"} and data["constraints"] == ["cols % 2 == 0"]
    for width in (60, 100):
        listed = runner.invoke(app, ["problems"], env={"COLUMNS": str(width)})
        assert listed.exit_code == 0 and "softmax" in listed.output
        assert max(len(line) for line in listed.output.splitlines()) <= width
