"""A neutral harness for CPU kernel figures: each contender compiled with its own flags into
a shared library and called in one process through ctypes, interleaved round by round on
rotated input sets (the order rotates too), so that drift on a shared host hits every
contender alike. Before each call the caches are flushed of that call's inputs and
outputs, as the factory's harness does: every call starts from memory, whatever the size
of the host's caches and whoever ran just before it.

Also a cheap search over a factory template: the planner's kind of optuna study (TPE,
multivariate, grouped), each point compiled and timed here, without the factory's
verification per point; the caller verifies the winner with the real verifier.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import os
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import optuna

from actors.search.llm.extract import split_flags
from gpu_workers.cpu.timing_run import Flush, cache_flush
from gpu_workers.cpu.trusted_build import cache_flush_library
from gpu_workers.held_folder import HeldFolder
from kernels.design_space import ParamValue, Template
from kernels.spec import Problem

optuna.logging.set_verbosity(optuna.logging.WARNING)

_BUILD = HeldFolder("kf-native-")  # removed at exit, or by the next bench if this one is killed
BUILD_DIR = _BUILD.path


def load_average() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()]


def compile_library(name: str, source: str, flags: tuple[str, ...], compiler: str = "gcc") -> Path:
    """`source` built into BUILD_DIR/<name>.so with `flags` (C for gcc, C++ for g++)."""
    suffix = ".cc" if compiler == "g++" else ".c"
    src = BUILD_DIR / f"{name}{suffix}"
    lib = BUILD_DIR / f"{name}.so"
    obj = BUILD_DIR / f"{name}.o"
    src.write_text(source)
    # Linked without the compile flags: -ffast-math there would add crtfastmath.o, which
    # turns on FTZ/DAZ in this whole process when loaded, numpy's float64 references and
    # baselines included (the factory's harness resets MXCSR around every kernel call).
    link = [f for f in flags if f == "-fopenmp"]
    for command in (
        [compiler, *flags, "-fPIC", "-c", "-w", str(src), "-o", str(obj)],
        [compiler, "-shared", *link, str(obj), "-o", str(lib), "-lm"],
    ):
        proc = subprocess.run(command, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"{name}: {compiler} failed: {proc.stderr[-2000:]}")
    return lib


def kernel_file(path: Path) -> tuple[str, tuple[str, ...]]:
    """A kernel file's text and the flags its `// kfactory-flags: ...` line names, as
    `kfactory best` writes it and `kfactory check` reads it."""
    text = path.read_text()
    flags = split_flags(text).flags
    if flags is None:
        raise SystemExit(f"{path}: no `// kfactory-flags: ...` line")
    return text, flags


def aligned(array: np.ndarray, alignment: int = 64, shared: bool = False) -> np.ndarray:
    """A copy of `array` whose data starts on an `alignment`-byte boundary, as the
    factory's harness passes every array. `shared`: in shared memory, as the factory's
    arena (a memfd) holds a kernel's arrays: on a host whose shared memory takes no
    transparent huge pages (/sys/kernel/mm/transparent_hugepage/shmem_enabled `never`),
    4 KiB pages where numpy's own arrays get 2 MiB ones."""
    if shared:
        region = mmap.mmap(-1, array.nbytes + alignment)
        raw = np.frombuffer(region, dtype=np.uint8)
    else:
        raw = np.empty(array.nbytes + alignment, dtype=np.uint8)
    start = -raw.ctypes.data % alignment
    out = raw[start : start + array.nbytes].view(array.dtype).reshape(array.shape)
    out[...] = array
    return out


@dataclass
class Workload:
    """`sets` input sets of a problem at a shape (the factory's own generator), one output
    array per output argument, and the argument list in the C signature's order."""

    spec: Problem
    shape: dict[str, int]
    sets: int = 3
    shared: bool = False
    """Every array in shared memory, as the factory's arena holds them (`aligned`)."""
    inputs: list[dict[str, np.ndarray]] = field(init=False)
    outputs: dict[str, np.ndarray] = field(init=False)

    def __post_init__(self) -> None:
        self.inputs = [
            {
                k: aligned(v, shared=self.shared)
                for k, v in self.spec.generate(self.shape, "normal", seed=1000 + i).items()
            }
            for i in range(self.sets)
        ]
        full = self.spec.full_shape(self.shape)
        self.outputs = {
            a.name: aligned(np.zeros(a.shape(full), dtype=np.float32), shared=self.shared)
            for a in self.spec.outputs
        }

    def args(self, i: int) -> list[Any]:
        arrays = [
            (self.outputs[a.name] if a.output else self.inputs[i][a.name]).ctypes.data_as(
                ctypes.c_void_p
            )
            for a in self.spec.args
        ]
        full = self.spec.full_shape(self.shape)
        return [*arrays, *(ctypes.c_int64(full[d]) for d in self.spec.dims)]

    @property
    def nbytes(self) -> int:
        return self.spec.nbytes(self.shape)

    def flush(self, i: int) -> None:
        """Evict input set i and the outputs from every cache level."""
        for array in (*self.inputs[i % self.sets].values(), *self.outputs.values()):
            flush_caches(array)

    def max_rel_error(self, i: int = 0) -> float:
        """The outputs (after a call on set i) against the float64 reference, relative to
        the largest reference value of each output."""
        expected = self.spec.expected(self.inputs[i])
        return max(
            float(np.max(np.abs(self.outputs[k] - v)) / max(float(np.max(np.abs(v))), 1e-30))
            for k, v in expected.items()
        )


@functools.cache
def _flush() -> Flush:
    """The flush the factory's timing runs use, from the same build."""
    return cache_flush(str(cache_flush_library()))


def flush_caches(array: np.ndarray) -> None:
    """Write back and evict every cache line of `array`, at every level."""
    _flush()(array)


Call = Callable[[int], int]


def native_call(library: Path, workload: Workload, symbol: str = "kernel") -> Call:
    fn = getattr(ctypes.CDLL(str(library)), symbol)
    fn.restype = None
    argsets = [workload.args(i) for i in range(workload.sets)]

    def call(i: int) -> int:
        args = argsets[i % len(argsets)]
        workload.flush(i)
        started = time.perf_counter_ns()
        fn(*args)
        return time.perf_counter_ns() - started

    return call


CALIBRATION_SOURCE = Path(__file__).resolve().parent.parent / "gpu_workers/cpu/calibration.c"


def copy_call(workload: Workload, source: str, destination: str) -> Call:
    """The calibration's all-core non-temporal copy, input `source` to output
    `destination`: the bandwidth ceiling measured in the same run, under the same load."""
    library = compile_library(
        "calibration_copy", CALIBRATION_SOURCE.read_text(), ("-O3", "-march=native", "-fopenmp")
    )
    return library_call(library, "kf_stream_copy", workload, source, destination)


def library_call(
    library: Path, symbol: str, workload: Workload, source: str = "x", destination: str = "y"
) -> Call:
    """`symbol(source, destination, n)` of a compiled library on the workload's arrays:
    a copy timed like a kernel, rotating through the input sets."""
    fn = getattr(ctypes.CDLL(str(library)), symbol)
    fn.restype = None
    out = workload.outputs[destination]
    sets = [
        (
            workload.inputs[i][source].ctypes.data_as(ctypes.c_void_p),
            out.ctypes.data_as(ctypes.c_void_p),
            ctypes.c_int64(out.size),
        )
        for i in range(workload.sets)
    ]

    def call(i: int) -> int:
        workload.flush(i)
        started = time.perf_counter_ns()
        fn(*sets[i % len(sets)])
        return time.perf_counter_ns() - started

    return call


def timed(fn: Callable[[int], object], workload: Workload) -> Call:
    """`fn(i)` (numpy on the workload's set i, say) timed like a kernel."""

    def call(i: int) -> int:
        workload.flush(i)
        started = time.perf_counter_ns()
        fn(i)
        return time.perf_counter_ns() - started

    return call


def interleaved(
    contenders: dict[str, Call],
    rounds: int,
    sets: int,
    warmup: int = 2,
    cpu: dict[str, list[int]] | None = None,
) -> dict[str, list[int]]:
    """Every contender once per round on input set (round % sets), the starting contender
    rotating each round; `warmup` untimed rounds first. With `cpu`, also the CPU time this
    process spent in each call (all its threads), which other work on the host inflates
    far less than the wall time."""
    names = list(contenders)
    samples: dict[str, list[int]] = {n: [] for n in names}
    for r in range(warmup + rounds):
        for k in range(len(names)):
            name = names[(r + k) % len(names)]
            cpu_started = time.process_time_ns()
            ns = contenders[name](r % sets)
            cpu_ns = time.process_time_ns() - cpu_started
            if r >= warmup:
                samples[name].append(ns)
                if cpu is not None:
                    cpu.setdefault(name, []).append(cpu_ns)
    return samples


def summary(samples: dict[str, list[int]], reference: str) -> dict[str, dict[str, float]]:
    """Median and IQR per contender, and the median of the per-round ratios to `reference`
    (paired: both timed in the same round)."""
    out: dict[str, dict[str, float]] = {}
    for name, ns in samples.items():
        q = statistics.quantiles(ns, n=4)
        ratios = [r / k for r, k in zip(samples[reference], ns, strict=True)]
        out[name] = {
            "median_ms": statistics.median(ns) / 1e6,
            "q1_ms": q[0] / 1e6,
            "q3_ms": q[2] / 1e6,
            "speedup_vs_reference": statistics.median(ratios),
            "rounds": len(ns),
        }
    return out


def choice(trial: optuna.trial.Trial, name: str, choices: tuple[ParamValue, ...]) -> int:
    """The index of the choice the trial suggests (optuna stores the value itself)."""
    return choices.index(trial.suggest_categorical(name, list(choices)))


@dataclass
class SearchResult:
    best: dict[str, Any]
    best_ms: float
    evaluated: list[dict[str, Any]]
    seconds: float


def search_template(
    template: Template,
    workload: Workload,
    budget: int,
    seed: int,
    calls: int = 5,
    fixed: dict[str, ParamValue] | None = None,
) -> SearchResult:
    """`budget` distinct valid points of `template`, proposed by TPE (the planner's sampler
    settings), each compiled and timed here: the median of `calls` calls on rotated sets
    after one warm-up call. Points outside the space's restrictions are pruned, uncounted."""
    started = time.time()
    sampler = optuna.samplers.TPESampler(
        seed=seed, n_startup_trials=8, multivariate=True, group=True
    )
    study = optuna.create_study(direction="minimize", sampler=sampler)
    fixed = fixed or {}
    evaluated: list[dict[str, Any]] = []
    seen: set[str] = set()
    for _ in range(200 * budget):
        if len(evaluated) >= budget:
            break
        trial = study.ask()
        params: dict[str, ParamValue] = {
            p.name: fixed[p.name]
            if p.name in fixed
            else p.choices[choice(trial, p.name, p.choices)]
            for p in template.params
        }
        key = repr(sorted(params.items()))
        if not template.is_valid(params) or key in seen:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            continue
        seen.add(key)
        rendered = template.render(params)
        try:
            library = compile_library(
                f"{template.name}-{len(evaluated)}", rendered.source, rendered.flags
            )
        except RuntimeError as exc:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            evaluated.append({"params": params, "error": str(exc)[:300]})
            continue
        call = native_call(library, workload)
        call(0)
        ms = statistics.median(call(i) for i in range(calls)) / 1e6
        study.tell(trial, ms)
        evaluated.append({"params": params, "median_ms": ms})
    timed_points = [e for e in evaluated if "median_ms" in e]
    best = min(timed_points, key=lambda e: e["median_ms"])
    return SearchResult(best["params"], best["median_ms"], evaluated, time.time() - started)
