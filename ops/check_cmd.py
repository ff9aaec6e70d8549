"""`kfactory check`: verify (and with --bench, time) one hand-written kernel.

It makes the stages a campaign makes (`gpu_workers.verification.verify`, then with
--bench `gpu_workers.benchmarking.benchmark` at the problem's default shape or
`--shape`, against `--incumbent` if given), under a fresh secret seed that `--seed`
replays. It prints, in text or one JSON object (`--json`), the verdict and its worst
element (`Verdict.worst`: where, got, expected, error, scale, allowed and the share of
the tolerance used), for a verified kernel the margin per distribution (`margins`: 1
minus the largest share of its tolerance any element of that distribution's trials
used), the timing against the baseline and the roofline with --bench, and the sandbox's
mechanisms, each applied or not and why.

Exit status: 0 verified, 1 rejected, 2 bad input, `EXIT_NOT_RUN` (3) when this host lacks
the target's device (a cuda kernel on a host without a GPU): only the compile and static
stages run, and a kernel that passes them is reported "not run", with its architecture
and ptxas resources.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, NoReturn

import msgspec
import typer

from gpu_workers.benchmarking import BenchmarkRequest, benchmark
from gpu_workers.cuda.nvcc import CudaBuild
from gpu_workers.deadlines import call_deadline
from gpu_workers.protocols import Backend
from gpu_workers.results import BenchmarkResult, Rejection, Verdict
from gpu_workers.targets import TARGET_MAP, TARGETS, calibration_for, device_missing, target_of
from gpu_workers.targets import recalibrate as recalibrate_device
from gpu_workers.verification import new_seed, precheck, verify
from kernels.loading import ProblemLoadError, load_problem
from kernels.spec import Problem, ProblemError
from ops.errors import UserError

EXIT_NOT_RUN = 3
FLAGS_COMMENT = re.compile(r"^\s*//\s*kfactory-flags:\s*(.+?)\s*$", re.MULTILINE)

CHECK_HELP = """Verify a hand-written kernel against a problem's reference; --bench also times it.

The kernel must define the problem's C signature (see `kfactory problems show NAME`). It is compiled, statically checked, and run in a sandbox on fresh inputs from every distribution (NaN/Inf, values near the type's limits, masked rows, ...) and test shape (fixed edge shapes and shapes drawn per check). The inputs and shapes come from a fresh secret seed, printed with the verdict; --seed N replays exactly the same check. Every verdict names its worst element (shape, distribution, seed, index, error, scale and the share of the tolerance used); a verified one also prints the margin left per distribution. With --bench it is then timed at the default shape against the baseline (float32 numpy on the CPU; torch eager, cupy or the naive kernel on a GPU), re-checked on new inputs, and compared with this host's roofline.

A cuda kernel (--target cuda) is device code with `// kf-launch:` lines saying what to launch (see a template's output: `kfactory problems show NAME`). On a host without a GPU only the compile and static stages run: nvcc for sm_90, the ptxas report, spills and the architecture's limits.

Compiler flags come from --flags, else from a `// kfactory-flags: ...` line in the source, else "-O3 -march=native -fopenmp" (cpu) or "-O3" (cuda). Exit status: 0 verified, 1 rejected, 2 bad input, 3 passed compile and static checks but not run (no GPU here).

Examples:

  kfactory check softmax --target cpu --source kernels/examples/softmax.c

  kfactory check softmax --source my_softmax.c --bench --json

  kfactory check matmul --source mm.c --flags "-O3 -march=native -fopenmp" --bench

  kfactory check rmsnorm --source rms.c --bench --shape rows=1024,cols=8192

  kfactory check softmax --target cuda --dtype bf16 --source softmax.cu
"""  # noqa: E501


def _parse_shape(text: str | None, problem: Problem) -> dict[str, int] | None:
    if not text:
        return None
    dims = problem.dims
    shape: dict[str, int] = {}
    for part in text.split(","):
        name, sep, value = part.partition("=")
        if not sep or not value.strip().isdigit():
            raise UserError(f"--shape takes NAME=INT pairs like rows=4096,cols=4096, got {part!r}")
        shape[name.strip()] = int(value)
    if set(shape) != set(dims):
        raise UserError(f"--shape must give exactly the dims {', '.join(dims)}")
    faults = problem.shape_faults(shape)
    if faults:
        raise UserError(f"--shape {faults[0]}")
    return shape


def _flags(source: str, flags: str | None, target: str = "cpu") -> tuple[str, ...]:
    if flags is not None:
        return tuple(flags.split())
    found = FLAGS_COMMENT.search(source)
    return tuple(found.group(1).split()) if found else target_of(target).default_flags


def margins(verdict: Verdict) -> dict[str, dict[str, Any]]:
    """Per distribution, the largest share of its tolerance any element's error used (over
    every trial of that distribution) and what is left: 1 - used."""
    found: dict[str, dict[str, Any]] = {}
    for trial in verdict.trials:
        seen = found.get(trial.distribution)
        if seen is None or trial.worst_used > seen["used"]:
            found[trial.distribution] = {
                "used": trial.worst_used,
                "margin": 1.0 - trial.worst_used,
                "shape": trial.shape,
                "seed": trial.seed,
            }
    return found


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
        "seed": verdict.seed,
        "max_rel_err": verdict.max_rel_err,
        "worst": msgspec.to_builtins(verdict.worst) if verdict.worst else None,
        "margins": margins(verdict) if verdict.verified else {},
        "median_ns": result.kernel.median_ns if result else None,
        "mean_ns": result.kernel.mean_ns if result else None,  # what `speedup` ranks by
        "baseline_mean_ns": result.baseline.mean_ns if result else None,
        "iqr_ns": result.kernel.iqr_ns if result else None,
        "runs": result.kernel.runs if result else None,
        "baseline_ns": result.baseline.median_ns if result else None,
        "baseline": result.baseline_name if result else None,
        "speedup": result.speedup if result else None,
        "roofline_ns": result.roofline_ns if result else None,
        "roofline_fraction": result.roofline_fraction if result else None,
        "shape": result.shape if result else None,
        "host_contention_cores": result.host_contention_cores if result else None,
        "sandbox": msgspec.to_builtins(verdict.sandbox) if verdict.sandbox else None,
    }


def _print_rejection(report: dict[str, Any]) -> None:
    print(f"rejected at stage {report['stage']} ({report['reason']}): {report['message']}")
    for key, value in report["evidence"].items():
        text = str(value).strip()
        if text:
            lines = text.splitlines()
            shown = "\n    ".join(lines[-15:])
            print(f"  {key}: {shown}")


def _print_worst(worst: dict[str, Any] | None) -> None:
    if worst is None:
        return
    index = ", ".join(str(i) for i in worst["index"])
    share = f"{worst['used']:.1%} of" if worst["used"] < 10 else f"{worst['used']:.3g}x"
    print(
        f"worst:    {worst['output']}[{index}] at {worst['shape']}, {worst['distribution']} "
        f"inputs (trial seed {worst['seed']}): got {worst['got']:.8g}, expected "
        f"{worst['expected']:.8g}, error {worst['error']:.3g}, scale {worst['scale']:.3g}, "
        f"allowed {worst['allowed']:.3g} ({share} the tolerance)"
    )


def _print_margins(found: dict[str, dict[str, Any]]) -> None:
    if not found:
        return
    print("margins:  the largest share of its tolerance an error used, per distribution")
    for distribution, m in found.items():
        print(
            f"  {distribution:10s} {m['used']:8.2%} used, margin {m['margin']:8.2%}"
            f"  (at {m['shape']})"
        )


def _print_human(report: dict[str, Any]) -> None:
    if report["verdict"] == "verified":
        err = report["max_rel_err"]
        print(
            f"verified: {report['problem']} on {report['target']}, {report['trials']} trials, "
            f"max relative error {err:.3g}"
        )
        _print_worst(report["worst"])
        _print_margins(report["margins"])
    else:
        _print_rejection(report)
        _print_worst(report["worst"])
    if report["seed"] is not None:
        print(f"seed:     {report['seed']} (the same inputs again: --seed {report['seed']})")
    if report.get("envelope"):
        print(f"shapes:   verified on {report['envelope']}")
    if report["median_ns"] is not None:
        print(
            f"time:     {report['mean_ns'] / 1e6:.3f} ms mean, {report['median_ns'] / 1e6:.3f} ms "
            f"median (IQR {report['iqr_ns'] / 1e6:.3f} ms, {report['runs']} runs) "
            f"at {report['shape']}"
        )
        print(
            f"baseline: {report['baseline_mean_ns'] / 1e6:.3f} ms mean, "
            f"{report['baseline_ns'] / 1e6:.3f} ms median ({report['baseline']})"
        )
        print(f"speedup:  {report['speedup']:.2f}x over the baseline (ratio of the means)")
        print(
            f"roofline: {report['roofline_fraction']:.3f} of this host's ceiling "
            f"({report['roofline_ns'] / 1e6:.3f} ms)"
        )
        busy = report["host_contention_cores"]
        if busy is not None and busy > 0.2:
            print(f"note: other work used {busy:.2f} cores during timing; figures are skewed")
    sandbox = report["sandbox"]
    if sandbox and sandbox["mechanisms"]:
        applied = [m["name"] for m in sandbox["mechanisms"] if m["applied"]]
        print(f"contained by: {', '.join(applied) or 'nothing'}")
        for m in sandbox["mechanisms"]:
            if not m["applied"]:
                print(f"  not applied: {m['name']}: {m['note']}")
    elif sandbox and not sandbox["network_isolated"]:
        print(f"note: network not isolated: {sandbox['network_note']}")


def check(
    problem: str = typer.Argument(..., help="Problem: a built-in name (softmax) or path.py:NAME."),
    source: Path = typer.Option(..., "--source", "-s", help="The kernel's C source file."),
    target: str = typer.Option("cpu", "--target", "-t", help="Device target: cpu or cuda."),
    dtype: str = typer.Option("fp32", "--dtype", help="Element type: fp32 (cuda: bf16, fp16)."),
    bench: bool = typer.Option(
        False,
        "--bench",
        help="Also time it against the baseline (numpy on cpu; torch, cupy or a naive "
        "kernel on cuda).",
    ),
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
    seed: int | None = typer.Option(
        None,
        "--seed",
        min=0,
        help="Replay a check: the seed its shapes and inputs were drawn from (printed by "
        "every check). Default: a fresh secret seed.",
    ),
    timeout: float = typer.Option(
        60.0,
        "--timeout",
        help="Wall-clock seconds the kernel's calls may take in all during verification.",
    ),
    recalibrate: bool = typer.Option(
        False, "--recalibrate", help="Measure this host's bandwidth and peak again (with --bench)."
    ),
) -> None:
    if target not in TARGET_MAP:
        raise UserError(f"unknown target {target!r}; use one of {', '.join(TARGETS)}")
    device = target_of(target)
    if dtype not in device.dtypes:
        raise UserError(f"{target} kernels take {', '.join(device.dtypes)}, not {dtype!r}")
    try:
        spec = load_problem(problem)
    except ProblemLoadError as exc:
        raise UserError(str(exc)) from None
    if dtype not in spec.dtypes:
        raise UserError(f"{spec.name} is defined for {', '.join(spec.dtypes)}, not {dtype}")
    if not source.is_file():
        raise UserError(f"kernel source {source} does not exist")
    text = source.read_text()
    bench_shape = _parse_shape(shape, spec)
    if timeout <= 0:
        raise UserError("--timeout must be a positive number of seconds")
    limits = {"wall_seconds": timeout, "cpu_seconds": max(1, int(timeout * 2) + 1)}
    backend = device.checking_backend(msgspec.structs.replace(device.verify_limits, **limits))
    kernel_flags = _flags(text, flags, target)
    missing = device_missing(target)
    if missing is not None:
        _not_run(spec, backend, text, kernel_flags, dtype, missing, json_out)
    check_seed = new_seed() if seed is None else seed
    try:
        verdict = verify(spec, backend, text, kernel_flags, dtype=dtype, seed=check_seed)
    except ProblemError as exc:
        raise UserError(str(exc)) from None
    outcome: BenchmarkResult | Rejection | None = None
    if bench and verdict.verified:
        try:
            calibration = calibration_for(target) if not recalibrate else recalibrate_device(target)
        except device.calibration_error as exc:
            raise UserError(f"cannot calibrate this host: {exc}") from None
        build = backend.compile(spec, text, kernel_flags, dtype).build
        incumbent_build = None
        if incumbent is not None:
            inc_text = incumbent.read_text()
            inc_flags = _flags(inc_text, None, target)
            inc = backend.compile(spec, inc_text, inc_flags, dtype)
            if inc.build is None:
                raise UserError(f"the incumbent {incumbent} does not compile")
            incumbent_build = inc.build
        outcome = benchmark(
            BenchmarkRequest(
                spec,
                backend,
                build,
                calibration,
                incumbent=incumbent_build,
                shape=bench_shape,
                dtype=dtype,
                seed=check_seed,
                recalibrate=lambda: recalibrate_device(target),
                call_seconds=call_deadline(
                    spec, spec.full_shape(bench_shape or spec.default_shape), verdict.pace, dtype
                )
                if verdict.pace is not None
                else None,
            )
        )
    report = {**_report(verdict, outcome), "envelope": spec.envelope}
    if json_out:
        print(msgspec.json.encode(report).decode())
    else:
        _print_human(report)
    if report["verdict"] != "verified":
        raise typer.Exit(code=1)


def _not_run(
    spec: Problem,
    backend: Backend[Any],
    text: str,
    flags: tuple[str, ...],
    dtype: str,
    missing: str,
    json_out: bool,
) -> NoReturn:
    """The stages this host can make; then exit 1 (rejected) or 3 (passed, not run)."""
    outcome = precheck(spec, backend, text, flags, dtype)
    rejection = outcome.rejection
    build = outcome.build
    resources = (
        [msgspec.to_builtins(r) for r in build.resources if r.entry]
        if isinstance(build, CudaBuild)
        else []
    )
    report: dict[str, Any] = {
        "verdict": "rejected" if rejection else "not_run",
        "stage": rejection.stage if rejection else None,
        "reason": rejection.reason if rejection else None,
        "message": rejection.message if rejection else f"not run: {missing}",
        "evidence": rejection.evidence if rejection else {},
        "problem": spec.name,
        "target": backend.target,
        "dtype": dtype,
        "flags": list(flags),
        "arch": build.arch if isinstance(build, CudaBuild) else None,
        "resources": resources,
    }
    if json_out:
        print(msgspec.json.encode(report).decode())
    elif rejection is not None:
        _print_rejection(report)
    else:
        print(f"compiled and checked for {report['arch']}: no spills, within its limits")
        for r in resources:
            print(
                f"  {r['kernel']}: {r['registers']} registers, {r['shared_bytes']} bytes "
                f"static shared memory, {r['stack_frame_bytes']} bytes stack"
            )
        print(f"not run: {missing}")
    raise typer.Exit(code=1 if rejection else EXIT_NOT_RUN)


def register(app: typer.Typer) -> None:
    app.command("check", help=CHECK_HELP)(check)
