"""A problem's whole design space, measured once on this host and cached, so a search can
be replayed against real timings for many seeds.

Usage:
  .venv/bin/python bench/space_table.py                      # softmax at 256x4096 and 2048x512
  .venv/bin/python bench/space_table.py --template softmax_rows   # one space of it
  .venv/bin/python bench/space_table.py --problem rmsnorm --shapes 1024x4096

Every valid point of every space the planner searches for the problem (cpu, fp32) is
rendered and compiled with its own flags (two compiles at a time), then, one point at
a time with nothing else of ours running, called in this process through ctypes at each
shape:
- the output of its last call is compared with a float64 reference, elementwise,
  with the problem's fp32 tolerance (a point that fails is `rejected`, stage compare; one
  that does not compile is rejected at compile);
- its time is taken interleaved with a fixed reference kernel (the first template's
  default point, on one thread: the steadiest), call for call, and the point's figure is
  the reference's median over its own: a ratio over a kernel timed in the same rounds,
  so drift of the host between points cancels.

This is a cheaper objective than the factory's evaluation (no sandbox, one input
distribution, no re-check): the search only needs each point's rank, and the figures say
so. The table goes to bench/results/space_<problem>_<host>.json and is reused as long as
the templates render the same sources (a digest of them is part of the file). The load
average is recorded before and after.
"""

from __future__ import annotations

import _ctypes
import argparse
import ctypes
import hashlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from actors.campaign.history import param_key  # noqa: E402
from actors.search.spaces import design_spaces  # noqa: E402
from gpu_workers.cpu.toolchain import COMPILER, nan_safe, prelude  # noqa: E402
from kernels.design_space import Template  # noqa: E402
from kernels.loading import load_problem  # noqa: E402
from kernels.templates import TEMPLATES  # noqa: E402

RESULTS = ROOT / "bench" / "results"
BUILDS = RESULTS / "space_builds"
ROUNDS = 15
WARMUP = 2


def templates_of(problem: str, only: str | None = None) -> list[Template]:
    """The spaces a cpu fp32 campaign of the problem searches, as the planner resolves them
    (`only`: just the template of that name)."""
    spaces = [s for s in design_spaces(problem, "cpu", "fp32") if only in (None, s.name)]
    if not spaces:
        raise SystemExit(f"{problem}: no cpu space named {only!r}")
    if not all(isinstance(s, Template) for s in spaces):
        raise SystemExit(f"{problem}: only template spaces can be measured here")
    return [s for s in spaces if isinstance(s, Template)]


def points_of(problem: str, only: str | None = None) -> list[tuple[Template, dict[str, Any]]]:
    return [(t, dict(p)) for t in templates_of(problem, only) for p in t.valid_points()]


def space_digest(problem: str, only: str | None = None) -> str:
    """A digest of every point's rendered source and flags: the table is stale without it."""
    digest = hashlib.sha256()
    for template, params in points_of(problem, only):
        rendered = template.render(params)
        digest.update(rendered.source.encode())
        digest.update(" ".join(rendered.flags).encode())
    return digest.hexdigest()[:16]


def table_path(problem: str, only: str | None = None, host: str | None = None) -> Path:
    return RESULTS / f"space_{only or problem}_{host or socket.gethostname()}.json"


def _shape_text(shape: dict[str, int]) -> str:
    return "x".join(str(v) for v in shape.values())


def _compile(job: tuple[str, str, dict[str, Any]]) -> tuple[str, str | None, str | None]:
    """(key, library or None, the compiler's first error line): one point built with its
    own flags (and the factory's NaN-safe flag) by one `cc` call, cached by content. The
    factory's compiler also scans the source and the object; our own templates need
    neither, and one call is a third of its time."""
    problem_name, template_name, params = job
    rendered = TEMPLATES[template_name].render(params)
    flags = nan_safe(rendered.flags)
    prototype = load_problem(problem_name).c_signature("fp32")
    source = prelude(prototype) + rendered.source
    digest = hashlib.sha256((source + " ".join(flags)).encode()).hexdigest()[:24]
    library = BUILDS / f"{digest}.so"
    key = param_key(template_name, params)
    if library.exists():
        return key, str(library), None
    BUILDS.mkdir(parents=True, exist_ok=True)
    outputs = ("-fPIC", "-shared", "kernel.c", "-o", "kernel.so", "-lmvec", "-lm")
    with tempfile.TemporaryDirectory() as work:
        (Path(work) / "kernel.c").write_text(source)
        built = subprocess.run(
            [COMPILER, *flags, *outputs],
            cwd=work,
            capture_output=True,
            text=True,
            check=False,
        )
        if built.returncode != 0:
            first = next((ln for ln in built.stderr.splitlines() if "error" in ln), "error")
            return key, None, first.strip()
        os.replace(Path(work) / "kernel.so", library)
    return key, str(library), None


class Caller:
    """A compiled kernel called in this process: kernel(const float*, float*, int64, int64).
    Used as a context manager it is unloaded on exit: a process holds at most 65530 memory
    mappings (vm.max_map_count), a few per library, fewer than a space has points. The
    OpenMP runtime stays loaded: its idle threads outlive every kernel."""

    openmp = ctypes.CDLL("libgomp.so.1", mode=ctypes.RTLD_GLOBAL)

    def __init__(self, library: str) -> None:
        self.library = ctypes.CDLL(library)
        self.fn = self.library.kernel
        self.fn.restype = None
        self.fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]

    def __enter__(self) -> Caller:
        return self

    def __exit__(self, *exc: object) -> None:
        del self.fn
        _ctypes.dlclose(self.library._handle)

    def __call__(self, x: np.ndarray, y: np.ndarray) -> int:
        start = time.perf_counter_ns()
        self.fn(x.ctypes.data, y.ctypes.data, x.shape[0], x.shape[1])
        return time.perf_counter_ns() - start


class Shape:
    """One shape's inputs, output buffers and float64 reference."""

    def __init__(self, problem_name: str, shape: dict[str, int]) -> None:
        problem = load_problem(problem_name)
        if tuple(shape) != ("rows", "cols") or [a.name for a in problem.args] != ["x", "y"]:
            raise SystemExit(f"{problem_name}: only row problems kernel(x, y, rows, cols)")
        rng = np.random.default_rng(1)
        self.shape = shape
        self.x = rng.standard_normal((shape["rows"], shape["cols"])).astype(np.float32)
        self.y = np.empty_like(self.x)
        self.y_ref = np.empty_like(self.x)
        self.expected = np.asarray(problem.reference({"x": self.x.astype(np.float64)})["y"])
        tolerance = problem.tolerances["fp32"]
        self.allowed = tolerance.atol + tolerance.rtol * np.abs(self.expected)

    def correct(self) -> bool:
        return bool(np.all(np.abs(self.y.astype(np.float64) - self.expected) <= self.allowed))


def time_point(
    kernel: Caller, reference: Caller, shape: Shape, rounds: int = ROUNDS
) -> dict[str, Any]:
    """Kernel and reference called in alternating order, round by round."""
    for _ in range(WARMUP):
        kernel(shape.x, shape.y)
        reference(shape.x, shape.y_ref)
    ours, theirs = [], []
    for round_ in range(rounds):
        if round_ % 2:
            theirs.append(reference(shape.x, shape.y_ref))
            ours.append(kernel(shape.x, shape.y))
        else:
            ours.append(kernel(shape.x, shape.y))
            theirs.append(reference(shape.x, shape.y_ref))
    if not shape.correct():
        return {"ratio": None, "stage": "compare"}
    median = statistics.median(ours)
    return {
        "ratio": statistics.median(theirs) / median,
        "median_ns": median,
        "reference_ns": statistics.median(theirs),
        "iqr_ns": float(np.subtract(*np.percentile(ours, [75, 25]))),
    }


def measure(
    problem: str, only: str | None, shapes: list[dict[str, int]], jobs: int
) -> dict[str, Any]:
    points = points_of(problem, only)
    load_before = os.getloadavg()
    started = time.monotonic()
    with ProcessPoolExecutor(jobs) as pool:
        built = list(pool.map(_compile, [(problem, t.name, p) for t, p in points], chunksize=8))
    compiled_s = time.monotonic() - started
    print(f"compiled {len(built)} points in {compiled_s:.0f} s", flush=True)
    first = templates_of(problem, only)[0]
    reference_key = param_key(first.name, {**first.defaults, "threads": 1})
    libraries = {key: library for key, library, _ in built}
    reference = Caller(str(libraries[reference_key]))
    sized = [Shape(problem, s) for s in shapes]
    rows: list[dict[str, Any]] = []
    for n, ((template, params), (key, library, refused)) in enumerate(
        zip(points, built, strict=True), 1
    ):
        row: dict[str, Any] = {"key": key, "template": template.name, "params": params}
        if library is None:
            row["at"] = {_shape_text(s.shape): {"ratio": None, "stage": "compile"} for s in sized}
            row["refused"] = refused
        else:
            with Caller(library) as kernel:
                row["at"] = {_shape_text(s.shape): time_point(kernel, reference, s) for s in sized}
        rows.append(row)
        if n % 50 == 0:
            print(f"timed {n}/{len(points)} ({time.monotonic() - started:.0f} s)", flush=True)
    return {
        "problem": problem,
        "templates": [t.name for t in templates_of(problem, only)],
        "host": socket.gethostname(),
        "cpus": os.cpu_count(),
        "digest": space_digest(problem, only),
        "shapes": [_shape_text(s) for s in shapes],
        "reference_point": reference_key,
        "objective": "reference kernel's median over the point's, interleaved call for call "
        f"({ROUNDS} rounds after {WARMUP} warm-up), in-process through ctypes; correctness "
        "checked against float64 on the timed input",
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "seconds": {"compile": compiled_s, "total": time.monotonic() - started},
        "points": rows,
    }


def retime_top(table: dict[str, Any], top: int, rounds: int) -> None:
    """Time the `top` best points of each shape again with `rounds` rounds and keep that
    figure (the first pass's is kept as `first`): the goal of a search is set by the best
    points, and one lucky pass should not set it alone."""
    problem = table["problem"]
    by_key = {row["key"]: row for row in table["points"]}
    reference = Caller(_compile((problem, *_split(table["reference_point"])))[1] or "")
    for shape_text in table["shapes"]:
        shape = Shape(
            problem, dict(zip(("rows", "cols"), map(int, shape_text.split("x")), strict=True))
        )
        ranked = sorted(
            (r for r in table["points"] if r["at"][shape_text]["ratio"] is not None),
            key=lambda r: -r["at"][shape_text]["ratio"],
        )[:top]
        for row in ranked:
            library = _compile((problem, row["template"], row["params"]))[1]
            assert library is not None
            with Caller(library) as kernel:
                again = time_point(kernel, reference, shape, rounds)
            by_key[row["key"]]["at"][shape_text] = {**again, "first": row["at"][shape_text]}
        print(f"re-timed the {top} best at {shape_text}", flush=True)
    table["retimed"] = {"top": top, "rounds": rounds, "load_average_after": os.getloadavg()}


def _split(key: str) -> tuple[str, dict[str, Any]]:
    template, params = key.split(":", 1)
    return template, json.loads(params)


def load_table(
    problem: str, only: str | None, shapes: list[str], host: str | None = None
) -> dict[str, Any]:
    """The cached table, if it holds these shapes and the templates render as they did."""
    path = table_path(problem, only, host)
    if not path.exists():
        raise FileNotFoundError(f"{path}: run bench/space_table.py --problem {problem} first")
    table: dict[str, Any] = json.loads(path.read_text())
    missing = [s for s in shapes if s not in table["shapes"]]
    if missing:
        raise SystemExit(f"{path} has no timings at {missing}; measure them first")
    if table["digest"] != space_digest(problem, only):
        raise SystemExit(f"{path} was measured on other templates; measure again")
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problem", default="softmax")
    parser.add_argument("--shapes", default="256x4096,2048x512")
    parser.add_argument("--template", default=None, help="only this space of the problem")
    parser.add_argument("--jobs", type=int, default=2, help="compiles at a time")
    parser.add_argument("--retime-top", type=int, default=24, help="best points timed again")
    parser.add_argument("--retime-rounds", type=int, default=41)
    parser.add_argument(
        "--retime-only", action="store_true", help="re-time the cached table's best points"
    )
    args = parser.parse_args()
    shapes = [
        dict(zip(("rows", "cols"), map(int, s.split("x")), strict=True))
        for s in args.shapes.split(",")
    ]
    path = table_path(args.problem, args.template)
    if args.retime_only:
        table = load_table(args.problem, args.template, [_shape_text(s) for s in shapes])
    else:
        table = measure(args.problem, args.template, shapes, args.jobs)
    if args.retime_top:
        retime_top(table, args.retime_top, args.retime_rounds)
    RESULTS.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(table, indent=1) + "\n")
    rejected = sum(1 for r in table["points"] if any(v["ratio"] is None for v in r["at"].values()))
    print(
        f"{args.problem}: {len(table['points'])} points at {args.shapes}, {rejected} rejected, "
        f"{table['seconds']['total']:.0f} s; load average {table['load_average_before']} -> "
        f"{table['load_average_after']}; written to {path}"
    )


if __name__ == "__main__":
    main()
