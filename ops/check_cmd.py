"""`kfactory check`: verify (and with --bench, time) one hand-written kernel."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import msgspec
import typer

from gpu_workers.benchmarker import benchmark
from gpu_workers.cpu.backend import VERIFY_LIMITS, CpuBackend
from gpu_workers.cpu.calibrate import CalibrationError, load_or_calibrate
from gpu_workers.cpu.compiler import default_cache_dir
from gpu_workers.results import BenchmarkResult, Rejection, Verdict
from gpu_workers.verifier import verify
from kernels.loading import ProblemLoadError, load_problem
from ops.errors import UserError

DEFAULT_FLAGS = "-O3 -march=native -fopenmp"
FLAGS_COMMENT = re.compile(r"^\s*//\s*kfactory-flags:\s*(.+?)\s*$", re.MULTILINE)

CHECK_HELP = """Verify a hand-written kernel against a problem's reference; --bench also times it.

The kernel must define the problem's C signature (see `kfactory problems show NAME`). It is compiled, statically checked, and run in a sandbox on fresh inputs from every distribution and test shape. With --bench it is then timed at the default shape against the float32 numpy baseline, re-checked on new inputs, and compared with this host's roofline.

Compiler flags come from --flags, else from a `// kfactory-flags: ...` line in the source, else "-O3 -march=native -fopenmp". Exit status: 0 verified, 1 rejected, 2 bad input.

Examples:

  kfactory check softmax --target cpu --source kernels/examples/softmax.c

  kfactory check softmax --source my_softmax.c --bench --json

  kfactory check matmul --source mm.c --flags "-O3 -march=native -fopenmp" --bench

  kfactory check rmsnorm --source rms.c --bench --shape rows=1024,cols=8192
"""  # noqa: E501


def _parse_shape(text: str | None, dims: tuple[str, ...]) -> dict[str, int] | None:
    if not text:
        return None
    shape: dict[str, int] = {}
    for part in text.split(","):
        name, sep, value = part.partition("=")
        if not sep or not value.strip().isdigit():
            raise UserError(f"--shape takes NAME=INT pairs like rows=4096,cols=4096, got {part!r}")
        shape[name.strip()] = int(value)
    if set(shape) != set(dims):
        raise UserError(f"--shape must give exactly the dims {', '.join(dims)}")
    return shape


def _flags(source: str, flags: str | None) -> tuple[str, ...]:
    if flags is not None:
        return tuple(flags.split())
    found = FLAGS_COMMENT.search(source)
    return tuple((found.group(1) if found else DEFAULT_FLAGS).split())


def _report(verdict: Verdict, bench: BenchmarkResult | Rejection | None) -> dict[str, Any]:
    rejection = verdict.rejection or (bench if isinstance(bench, Rejection) else None)
    result = bench if isinstance(bench, BenchmarkResult) else None
    return {
        "verdict": "rejected" if rejection else "verified",
        "stage": rejection.stage if rejection else None,
        "reason": rejection.reason if rejection else None,
        "message": rejection.message if rejection else None,
        "evidence": rejection.evidence if rejection else {},
        "problem": verdict.problem,
        "target": verdict.target,
        "source_sha256": verdict.source_sha256,
        "flags": list(verdict.flags),
        "trials": len(verdict.trials),
        "max_rel_err": verdict.max_rel_err,
        "median_ns": result.kernel.median_ns if result else None,
        "iqr_ns": result.kernel.iqr_ns if result else None,
        "runs": result.kernel.runs if result else None,
        "baseline_ns": result.baseline.median_ns if result else None,
        "speedup": result.speedup if result else None,
        "roofline_ns": result.roofline_ns if result else None,
        "roofline_fraction": result.roofline_fraction if result else None,
        "shape": result.shape if result else None,
        "host_contention_cores": result.host_contention_cores if result else None,
        "sandbox": msgspec.to_builtins(verdict.sandbox) if verdict.sandbox else None,
    }


def _print_human(report: dict[str, Any]) -> None:
    if report["verdict"] == "verified":
        err = report["max_rel_err"]
        print(
            f"verified: {report['problem']} on {report['target']}, {report['trials']} trials, "
            f"max relative error {err:.3g}"
        )
    else:
        print(f"rejected at stage {report['stage']} ({report['reason']}): {report['message']}")
        for key, value in report["evidence"].items():
            text = str(value).strip()
            if text:
                lines = text.splitlines()
                shown = "\n    ".join(lines[-15:])
                print(f"  {key}: {shown}")
    if report["median_ns"] is not None:
        print(
            f"time:     {report['median_ns'] / 1e6:.3f} ms median "
            f"(IQR {report['iqr_ns'] / 1e6:.3f} ms, {report['runs']} runs) at {report['shape']}"
        )
        print(f"baseline: {report['baseline_ns'] / 1e6:.3f} ms (numpy float32)")
        print(f"speedup:  {report['speedup']:.2f}x over numpy")
        print(
            f"roofline: {report['roofline_fraction']:.3f} of this host's ceiling "
            f"({report['roofline_ns'] / 1e6:.3f} ms)"
        )
        busy = report["host_contention_cores"]
        if busy is not None and busy > 0.2:
            print(f"note: other work used {busy:.2f} cores during timing; figures are skewed")
    sandbox = report["sandbox"]
    if sandbox and not sandbox["network_isolated"]:
        print(f"note: network not isolated: {sandbox['network_note']}")


def check(
    problem: str = typer.Argument(..., help="Problem: a built-in name (softmax) or path.py:NAME."),
    source: Path = typer.Option(..., "--source", "-s", help="The kernel's C source file."),
    target: str = typer.Option("cpu", "--target", "-t", help="Device target; today: cpu."),
    bench: bool = typer.Option(False, "--bench", help="Also time it against numpy."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
    flags: str | None = typer.Option(
        None, "--flags", help='Compiler flags, e.g. "-O3 -march=native -fopenmp".'
    ),
    shape: str | None = typer.Option(
        None, "--shape", help="Benchmark shape as NAME=INT pairs (default: the problem's)."
    ),
    incumbent: Path | None = typer.Option(
        None, "--incumbent", help="A verified kernel to time interleaved with this one."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the trial inputs."),
    timeout: float = typer.Option(
        60.0, "--timeout", help="Wall-clock limit in seconds for the sandboxed verification run."
    ),
    recalibrate: bool = typer.Option(
        False, "--recalibrate", help="Measure this host's bandwidth and peak again (with --bench)."
    ),
) -> None:
    if target != "cpu":
        raise UserError(f"target {target!r} is not available yet; use --target cpu")
    try:
        spec = load_problem(problem)
    except ProblemLoadError as exc:
        raise UserError(str(exc)) from None
    if not source.is_file():
        raise UserError(f"kernel source {source} does not exist")
    text = source.read_text()
    bench_shape = _parse_shape(shape, spec.dims)
    if timeout <= 0:
        raise UserError("--timeout must be a positive number of seconds")
    backend = CpuBackend(
        cache_dir=default_cache_dir(),
        verify_limits=msgspec.structs.replace(
            VERIFY_LIMITS, wall_seconds=timeout, cpu_seconds=max(1, int(timeout * 2) + 1)
        ),
    )
    kernel_flags = _flags(text, flags)
    verdict = verify(spec, backend, text, kernel_flags, seed=seed)
    outcome: BenchmarkResult | Rejection | None = None
    if bench and verdict.verified:
        try:
            calibration = load_or_calibrate(default_cache_dir().parent, force=recalibrate)
        except CalibrationError as exc:
            raise UserError(f"cannot calibrate this host: {exc}") from None
        build = backend.compile(spec, text, kernel_flags).build
        incumbent_build = None
        if incumbent is not None:
            inc_text = incumbent.read_text()
            inc = backend.compile(spec, inc_text, _flags(inc_text, None))
            if inc.build is None:
                raise UserError(f"the incumbent {incumbent} does not compile")
            incumbent_build = inc.build
        outcome = benchmark(
            spec,
            backend,
            build,
            calibration,
            incumbent=incumbent_build,
            shape=bench_shape,
            seed=seed,
            recalibrate=lambda: load_or_calibrate(default_cache_dir().parent, force=True),
        )
    report = _report(verdict, outcome)
    if json_out:
        print(msgspec.json.encode(report).decode())
    else:
        _print_human(report)
    if report["verdict"] != "verified":
        raise typer.Exit(code=1)


def register(app: typer.Typer) -> None:
    app.command("check", help=CHECK_HELP)(check)
