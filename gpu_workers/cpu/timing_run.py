"""Timing in the CPU driver: the kernel on its host, the baseline here, interleaved.

Every timed call gets inputs no earlier call has seen, written while the kernel's process
is stopped, and starts from poisoned outputs, with its inputs and outputs flushed from
every cache level (no call finds them cached, however large the caches). Every call is
judged on a few rows drawn from the check's secret after it (`gpu_workers.sampled_rows`),
and a few calls, drawn the same way, in full. After timing, the same loaded kernel is
re-checked on every distribution of the problem at the timed shape, from the timed calls'
poison. The driver judges what it kept (it holds the inputs and outputs), with the
benchmarker's own rule. A re-check call whose set has pass bands (the worker's pool) is
judged on them in the arena as soon as it returns (`passes_on_bands`): only a call they do
not pass is read back and judged in full, so a passing re-check maps no fresh pages.

- The kernel, and the incumbent in a host of its own, each have one input set in their
  arena (`Contender`), read-only in their process; the baseline rotates over
  `input_sets` (2, or one per baseline seed). Fresh inputs come from `fresh_inputs.c` (N(0, 1)
  by Box-Muller from a keyed counter hash) for an fp32 problem that fills its inputs from
  a distribution, else from the problem's own generator with a fresh seed; the flush is
  `cache_flush.c` (CLFLUSHOPT or CLFLUSH on x86-64, `dc civac` on AArch64).
- The numpy baseline runs here, in the driver, which never loaded a kernel, in the same
  interleaved rounds (`gpu_workers.interleave`): every `BASELINE_EVERY`-th round, every
  `BASELINE_EVERY_WITH_INCUMBENT`-th with an incumbent.
- The run is set up before its timed window: with `wait_for_window` the driver waits
  until the worker holds the device (`runner_files.wait_for_window`), and says when the
  timed rounds are over (`close_window`). It records the handshake (the median of 21
  `nop`s) and the contention of the window (`ContentionMeter`: the host's busy CPU time
  less its kernels' and its own between calls).
- The kept calls' arrays are mapped in the set-up, and a kept call that replaces an
  earlier one takes over its arrays, so no fresh pages are needed mid-window (on a VM a
  fresh page costs more than the copy into it). The driver keeps the memory it frees
  (`backend.DRIVER_ENV`), so the baseline's arrays are not fresh pages after its first
  call either; a re-check call read back mid-window is copied off the heap
  (`off_heap_copy`), so it does not take the memory the baseline freed. `JUDGES` (1)
  thread judges the kept calls while the re-check runs, `PREPARED_AHEAD` (2)
  distributions' inputs (from the secret pool, `recheck_pool`) prepared in threads
  meanwhile.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from gpu_workers import runner_files as files
from gpu_workers.benchmarking import judge_calls, passes_on_bands
from gpu_workers.cpu import protocol as p
from gpu_workers.cpu.arena import ITEMSIZE, Arena, layout, moved, poison, slot_bytes
from gpu_workers.cpu.kernel_process import (
    KernelEnded,
    ended_rejection,
    kernel_process,
)
from gpu_workers.interleave import Call, interleave
from gpu_workers.pass_band import Band
from gpu_workers.protocols import JudgedCall
from gpu_workers.recheck_pool import entry
from gpu_workers.results import Rejection
from gpu_workers.sampled_rows import (
    RowSample,
    draw_rows,
    needs_whole_inputs,
    row_call,
    sampled,
    take_rows,
)
from gpu_workers.sandbox import host_busy_seconds
from gpu_workers.stopping import LOSS_ROUNDS
from gpu_workers.verification import trial_seed
from kernels.loading import load_problem
from kernels.spec import Arrays, Problem

FloatArray = npt.NDArray[np.float32]


Recipe = tuple[int, ...]
"""How one call's fresh inputs were made: a key pair per input (the fast generator) or one
seed (the problem's generator). Enough to make them again for judging."""


class FreshInputs:
    """Inputs no earlier call has seen, for every timed call: N(0, 1) values from the fast
    generator where the problem fills its inputs from a distribution, else the problem's
    own generator with a fresh seed. Keys and seeds come from the driver's secret."""

    def __init__(self, problem: Problem, job: p.BenchJob, secret: np.random.Generator) -> None:
        self.problem, self.job, self.secret = problem, job, secret
        self.fill: Callable[..., None] | None = None
        if problem.make_inputs is None and job.dtype == "fp32" and job.fresh_inputs_library:
            fill = ctypes.CDLL(job.fresh_inputs_library).kf_fill_normal
            fill.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_uint32, ctypes.c_uint32]
            fill.restype = None
            self.fill = fill

    def write(self, views: dict[str, FloatArray], recipe: Recipe | None = None) -> Recipe:
        """Fill the input `views` with fresh values (or those of `recipe` again)."""
        if self.fill is not None:
            keys = recipe or tuple(int(k) for k in self.secret.integers(0, 1 << 32, 2 * len(views)))
            for n, view in enumerate(views.values()):
                self.fill(view.ctypes.data, view.size, keys[2 * n], keys[2 * n + 1])
            return keys
        seed = recipe[0] if recipe else int(self.secret.integers(0, 1 << 63))
        fresh = self.problem.generate(self.job.shape, "normal", seed, self.job.dtype)
        for name, view in views.items():
            view[...] = fresh[name]
        return (seed,)

    def make(self, recipe: Recipe | None = None) -> Arrays:
        """The inputs of `recipe` (or fresh ones), in arrays of their own."""
        arrays = {
            a.name: np.empty(a.shape(self.job.shape), np.float32) for a in self.problem.inputs
        }
        self.write(arrays, recipe)
        return arrays


@dataclass
class Kept:
    """A timed call kept for judging: how its inputs were made, and what it left."""

    call: int
    recipe: Recipe
    outputs: Arrays
    inputs_after: Arrays


def mapped(shape: tuple[int, ...]) -> FloatArray:
    """A float32 array whose pages are mapped now: a fresh page costs more than the copy
    into it on a VM (np.empty and np.zeros map each page at its first write)."""
    array = np.empty(shape, np.float32)
    array.fill(0.0)
    return array


def off_heap_copy(array: FloatArray) -> FloatArray:
    """A copy in pages of its own (an anonymous mapping, unmapped when it is dropped), not
    from the heap. A re-check call read back mid-window is held until timing is over: from
    the heap, it took the memory the baseline had just freed, and the baseline's next calls
    paid fresh pages (softmax 4096x4096 on a 2-core VM: 300-380 ms a call against 30,
    three of the run's first four; its mean, and so the speedup, several times too high)."""
    region = mmap.mmap(-1, max(array.nbytes, 1))
    copy = np.frombuffer(region, dtype=array.dtype, count=array.size).reshape(array.shape)
    copy[...] = array
    return copy


Flush = Callable[[npt.NDArray[np.generic]], None]


def cache_flush(library: str) -> Flush:
    """Evicts an array from every cache level (`library`: gpu_workers/cpu/cache_flush.c)."""
    flush = ctypes.CDLL(library).kf_flush
    flush.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    flush.restype = None
    return lambda array: flush(array.ctypes.data, array.nbytes)


class Contender:
    """A kernel in its own host and arena, which holds one input set: every call gets fresh
    inputs, written while the kernel is stopped after the call before, and starts from
    poisoned outputs, so nothing of a later call is in the kernel's reach before that call
    (with two sets, the next call's inputs sat beside the current one's, and a kernel could
    do part of the next call's work in this one). The inputs are read-only in the kernel's
    process: a write to one ends the run as `input_written`. `judge` calls, drawn by reservoir
    sampling from the secret (every call equally likely, however many there are), are kept
    for judging; which ones is decided after each call, and the kernel cannot see it."""

    def __init__(
        self,
        problem: Problem,
        job: p.BenchJob,
        library: str,
        secret: np.random.Generator,
        judge: int,
        flush: Flush,
    ) -> None:
        self.problem, self.job, self.secret, self.judge = problem, job, secret, judge
        self.flush = flush
        shapes = [a.shape(job.shape) for a in problem.args]
        self.arena = Arena(set_slot_bytes(problem, job))
        self.slots = layout(shapes, ITEMSIZE, secret)
        self.dims = [int(job.shape[d]) for d in problem.dims]
        self.fresh = FreshInputs(problem, job, secret)
        self.recipe: Recipe = ()
        self.kept: list[Kept] = []
        self.spare = [
            (
                {a.name: mapped(a.shape(job.shape)) for a in problem.outputs},
                {a.name: mapped(a.shape(job.shape)) for a in problem.inputs},
            )
            for _ in range(judge)
        ]
        """The kept calls' copies, mapped in the set-up: no fresh pages in the timed window."""
        self.rows_checked = judge > 0 and sampled(problem)
        self.row_samples: list[tuple[RowSample, Recipe]] = []
        self._stack = contextlib.ExitStack()
        self.process = self._stack.enter_context(
            kernel_process(job.kernel_host, library, len(problem.args), len(self.dims), self.arena)
        )
        names, outputs = [a.name for a in problem.args], [a.output for a in problem.args]
        self.process.protect(self.slots, names, outputs)
        self.refresh()

    def views(self) -> dict[str, FloatArray]:
        return {
            a.name: self.arena.floats(slot)
            for a, slot in zip(self.problem.args, self.slots, strict=True)
        }

    def refresh(self) -> None:
        """New inputs and poisoned outputs for the next call, none of them in any cache,
        each buffer placed afresh in its slot (`arena.moved`: every contender's time is
        over the same spread of layouts)."""
        self.slots = moved(self.slots, self.secret)
        self.arena.fill_canaries(self.slots)
        views = self.views()
        for a in self.problem.outputs:
            poison(views[a.name], p.POISON_BITS[0])
        self.recipe = self.fresh.write({a.name: views[a.name] for a in self.problem.inputs})
        for view in views.values():
            self.flush(view)

    def timed(self, what: str) -> int:
        ns = self.process.call([s.offset for s in self.slots], self.dims, what)
        call = self.process.calls - 1
        self._check_canaries(what)
        if self.rows_checked:  # every call, on rows drawn now: the kernel cannot know which
            rows = draw_rows(self.problem, self.job.shape, self.secret)
            sample = take_rows(self.problem, call, rows, self.views())
            self.row_samples.append((sample, self.recipe))
        slot = call if call < self.judge else int(self.secret.integers(0, call + 1))
        if slot < self.judge:  # Algorithm R
            if len(self.kept) < self.judge:
                kept = Kept(call, self.recipe, *self.spare.pop())
                self.kept.append(kept)
            else:  # the call it replaces gives up its arrays
                evicted = self.kept[slot]
                kept = Kept(call, self.recipe, evicted.outputs, evicted.inputs_after)
                self.kept[slot] = kept
            views = self.views()
            for name, array in (*kept.outputs.items(), *kept.inputs_after.items()):
                np.copyto(array, views[name])
                self.flush(array)  # the next call does not pay for writing them back
        self.refresh()
        return ns

    def row_calls(self) -> list[JudgedCall]:
        """Every call's sampled rows as calls of their own (the whole of any input without
        the rows' dim made again from the call's recipe)."""
        whole = needs_whole_inputs(self.problem)
        return [
            row_call(
                self.problem,
                sample,
                self.fresh.make(recipe) if whole else {},
                p.POISON_BITS[0],
            )
            for sample, recipe in self.row_samples
        ]

    def judged(self) -> list[JudgedCall]:
        """The kept calls, their inputs made again, in the order they were made."""
        return [
            JudgedCall(
                when=f"timed call {k.call}",
                inputs=self.fresh.make(k.recipe),
                outputs=k.outputs,
                inputs_after=k.inputs_after,
                poison_bits=p.POISON_BITS[0],
                seed=None,
            )
            for k in sorted(self.kept, key=lambda k: k.call)
        ]

    def run_once(
        self, inputs: Arrays, what: str, seed: int, reference: Reference
    ) -> JudgedCall | None:
        """One call on `inputs`: None when it passed on its pass bands, judged in the arena
        at once (`passes_on_bands`); else the call, its outputs and inputs read back for
        `judge_calls`. Reading them back costs fresh pages, 128 MiB a call at softmax
        4096x4096 (on a 2-core VM, more time than the kernel's call and the band check
        together), so only a call the bands do not pass is read back."""
        views = self.views()
        for a in self.problem.outputs:
            poison(views[a.name], p.POISON_BITS[0])  # as every timed call's
        for a in self.problem.inputs:
            views[a.name][...] = inputs[a.name]
        self.process.call([s.offset for s in self.slots], self.dims, what)
        self._check_canaries(what)
        expected, scales, bands = reference
        call = JudgedCall(
            when=what,
            inputs=inputs,
            outputs={a.name: views[a.name] for a in self.problem.outputs},
            inputs_after={a.name: views[a.name] for a in self.problem.inputs},
            poison_bits=p.POISON_BITS[0],
            seed=seed,
            expected=expected,
            scales=scales,
            bands=bands,
        )
        if passes_on_bands(self.problem, call):
            return None
        call.outputs = {name: off_heap_copy(array) for name, array in call.outputs.items()}
        call.inputs_after = {name: off_heap_copy(a) for name, a in call.inputs_after.items()}
        return call

    def _check_canaries(self, what: str) -> None:
        for arg, slot in zip(self.problem.args, self.slots, strict=True):
            side = self.arena.damaged(slot)
            if side is not None:
                raise OutOfBounds(arg.name, side, what)

    def close(self) -> None:
        self._stack.close()
        self.arena.close()


class OutOfBounds(Exception):
    def __init__(self, name: str, side: str, what: str) -> None:
        super().__init__(f"wrote outside {name} ({side} its data) during {what}")
        self.rejection = Rejection(
            stage="benchmark",
            reason="out_of_bounds_write",
            message=str(self),
            evidence={"buffer": name, "side": side, "progress": what},
        )


class ContentionMeter:
    """The timed window's start: the host's busy CPU time, and this driver's and its
    kernels' own, to tell what else used the cores during it: other processes, and any
    thread of the driver that ran while a contender's call was timed."""

    def __init__(self, contenders: list[Contender]) -> None:
        self.contenders = contenders
        self.started = time.perf_counter()
        self.host = host_busy_seconds()
        self.own = self._own()

    def _own(self) -> float:
        in_calls = sum(c.process.helper_cpu_ns for c in self.contenders) / 1e9
        kernels = sum(c.process.cpu_seconds() for c in self.contenders)
        return time.process_time() - in_calls + kernels

    def contention(self) -> float | None:
        """Cores' worth of CPU time since the start that was neither the contenders' nor
        the driver's between calls."""
        host, wall = host_busy_seconds(), time.perf_counter() - self.started
        if host is None or self.host is None or wall <= 0:
            return None
        return max(0.0, host - self.host - (self._own() - self.own)) / wall


JUDGES = 1
"""Threads judging kept calls while the kernel runs the next re-check: timing is over, and
numpy's float64 reference and comparison release the GIL. One: a judged call at a timed
shape holds hundreds of MiB of float64 temporaries, and a second judge beside it doubled
the fresh pages the driver needs (on a 2-core VM, 1.2 s more CPU time per timing run at
softmax 4096x4096 for the same wall time)."""
QUEUED = 2
"""Calls (inputs, outputs, inputs after) held waiting for a judge, beyond those being
judged: the re-check goes on while the timed calls' float64 references are made."""
PREPARED_AHEAD = 2
"""Distributions whose re-check inputs (a pool set, filled on first use) are prepared in
threads of their own: before the timed window, and after it while the kernel runs and the
judges judge the ones before."""


def recheck_draws(problem: Problem, job: p.BenchJob) -> list[tuple[str, int]]:
    """(distribution, seed) of every re-check at the timed shape (none unless asked)."""
    if job.recheck_seed is None:
        return []
    return [(d, trial_seed(job.recheck_seed, i, d)) for i, d in enumerate(problem.distributions)]


RECHECK_SECONDS = 1.0
"""About how long the re-check's kernel calls may take in all: as many distributions as
calls of the kernel's time fit in it, one at least (`recheck_count`)."""


def recheck_count(distributions: int, call_seconds: float) -> int:
    """How many distributions a kernel whose call takes `call_seconds` is re-checked on at
    the timed shape: every one while their calls fit in `RECHECK_SECONDS`, fewer for a
    slower kernel, never none."""
    if distributions == 0:
        return 0
    if call_seconds <= 0:
        return distributions
    return max(1, min(distributions, int(RECHECK_SECONDS / call_seconds)))


class InterleavedRecheck:
    """The re-check among the timed calls: each distribution's call comes just before a
    timed call drawn from the secret among calls 1 to `warmup + min(min_runs,
    LOSS_ROUNDS)` (calls every run makes unless it hits `max_seconds` first, however soon
    the stopping rule ends it), on the same path with the same poison and shape, so a
    kernel cannot tell it from the calls around it (only its inputs differ, and every timed
    call is judged besides). Its time is not a sample. Once the first call is timed, the
    re-check keeps `recheck_count` distributions for that call's time, drawn from the
    secret (its cost scales with the kernel's time). Inputs are prepared before the timed
    window, `PREPARED_AHEAD` distributions at a time (a worker's first run fills its pool
    here: a float64 reference and pass bands per set); what the run ends before reaching
    is re-checked after timing."""

    def __init__(self, problem: Problem, job: p.BenchJob, secret: np.random.Generator) -> None:
        draws = recheck_draws(problem, job)
        span = job.warmup + min(job.min_runs, LOSS_ROUNDS)
        count = min(len(draws), span - 1)
        at = [int(n) + 1 for n in secret.choice(span - 1, size=count, replace=False)]
        self.due = {n: draw for n, draw in zip(at, draws, strict=False)}
        self.kept_order = [draws[int(i)][0] for i in secret.permutation(len(draws))]
        self.selected = [d for d, _ in draws]
        """The distributions this run re-checks, in the problem's order."""
        with ThreadPoolExecutor(max_workers=PREPARED_AHEAD) as preparers:
            futures = {
                n: (d, preparers.submit(_recheck_inputs, problem, job, d, seed))
                for n, (d, seed) in self.due.items()
            }
        self.prepared = {n: (d, future.result()) for n, (d, future) in futures.items()}
        self.calls = 0
        self.done: list[JudgedCall] = []
        self.distributions: list[str] = []

    def after_first_call(self, call_ns: int) -> None:
        """Keep as many distributions as the first call's time allows (`recheck_count`)."""
        kept = set(self.kept_order[: recheck_count(len(self.kept_order), call_ns / 1e9)])
        self.selected = [d for d in self.selected if d in kept]
        self.prepared = {n: item for n, item in self.prepared.items() if item[0] in kept}

    def before_timed_call(self, kernel: Contender) -> None:
        n, self.calls = self.calls, self.calls + 1
        if n not in self.prepared:
            return
        distribution, (inputs, reference, seed) = self.prepared.pop(n)
        what = (
            f"re-check among the timed calls (call {kernel.process.calls}): "
            f"{distribution} inputs at {kernel.job.shape}"
        )
        call = kernel.run_once(inputs, f"{what}, seed {seed}", seed, reference)
        if call is not None:
            self.done.append(call)
        self.distributions.append(distribution)
        kernel.refresh()


def _judge_and_recheck(
    problem: Problem,
    job: p.BenchJob,
    kernel: Contender,
    interleaved: InterleavedRecheck,
    rechecked: list[str],
) -> Rejection | None:
    """Judge the kept timed calls and the re-check calls made among them, then re-check
    every distribution it keeps (`InterleavedRecheck.selected`) that the run did not reach,
    on the same loaded kernel; the first failure, in that order."""
    rechecked += [d for d in problem.distributions if d in interleaved.distributions]
    draws = [
        (d, seed)
        for d, seed in recheck_draws(problem, job)
        if d in interleaved.selected and d not in rechecked
    ]
    with (
        ThreadPoolExecutor(max_workers=JUDGES) as judges,
        ThreadPoolExecutor(max_workers=PREPARED_AHEAD) as preparers,
    ):
        files.write_progress("judging the timed calls")
        rows = judge_calls(problem, job.dtype, kernel.row_calls())
        if rows is not None:
            return rows
        kernel.row_samples.clear()
        pending = [
            judges.submit(judge_calls, problem, job.dtype, [c])
            for c in (*kernel.judged(), *interleaved.done)
        ]
        kernel.kept.clear()
        interleaved.done.clear()
        prepared: dict[int, Future[tuple[Arrays, Reference, int]]] = {}
        for index, (distribution, seed) in enumerate(draws):
            for ahead in range(index, min(index + PREPARED_AHEAD, len(draws))):
                if ahead not in prepared:
                    prepared[ahead] = preparers.submit(_recheck_inputs, problem, job, *draws[ahead])
            running = [f for f in pending if not f.done()]
            if len(running) >= JUDGES + QUEUED:
                wait(running, return_when=FIRST_COMPLETED)
            if any(f.done() and f.result() is not None for f in pending):
                break
            files.write_progress(f"re-check after timing: {distribution} inputs at {job.shape}")
            inputs, reference, seed = prepared.pop(index).result()
            what = f"re-check after timing: {distribution} inputs at {job.shape}, seed {seed}"
            files.write_progress(what)
            call = kernel.run_once(inputs, what, seed, reference)
            if call is not None:
                pending.append(judges.submit(judge_calls, problem, job.dtype, [call]))
            rechecked.append(distribution)
        preparers.shutdown(cancel_futures=True)
        return next((r for f in pending if (r := f.result()) is not None), None)


Reference = tuple[Arrays | None, Arrays | None, dict[str, Band] | None]
"""A re-check's float64 reference, its error scale and its pass bands (None: the judge
computes the reference and scale where it needs them, and judges without bands)."""


def _recheck_inputs(
    problem: Problem, job: p.BenchJob, distribution: str, seed: int
) -> tuple[Arrays, Reference, int]:
    """One distribution's re-check inputs, their reference, and the seed they were drawn
    from: a set of the worker's secret pool, chosen by `seed` (filled here on first use),
    or drawn afresh from `seed`."""
    if job.recheck_pool is None:
        inputs = problem.generate(job.shape, distribution, seed, job.dtype)
        return inputs, (None, None, None), seed
    pooled = entry(Path(job.recheck_pool), problem, job.shape, job.dtype, distribution, seed)
    if not pooled.ready:
        pooled.fill(problem, job.shape, distribution, job.dtype)
    reference = (pooled.expected(problem), pooled.scales(problem), pooled.bands(problem))
    return pooled.inputs(problem), reference, pooled.seed


def input_sets(job: p.BenchJob) -> int:
    """How many input sets each contender rotates over: the caches are flushed before every
    call, so two (or one per baseline seed) are enough on any host."""
    return max(2, len(job.seeds))


def set_slot_bytes(problem: Problem, job: p.BenchJob) -> int:
    """Arena bytes one input set takes: every argument in its guarded slot."""
    return sum(slot_bytes(int(np.prod(a.shape(job.shape))) * ITEMSIZE) for a in problem.args)


def arena_bytes(problem: Problem, job: p.BenchJob) -> int:
    """The size of each contender's arena (one input set), the largest file the driver
    makes."""
    return set_slot_bytes(problem, job)


def baseline_inputs(problem: Problem, job: p.BenchJob, secret: np.random.Generator) -> list[Arrays]:
    """The baseline's input sets, one per baseline seed."""
    fresh = FreshInputs(problem, job, secret)
    return [
        fresh.make()
        if fresh.fill is not None
        else problem.generate(job.shape, "normal", seed, job.dtype)
        for seed in job.seeds
    ]


def baseline_call(problem: Problem, distinct: list[Arrays], flush: Flush) -> Call:
    """The baseline timed here, in the driver, on input set `i` flushed from the caches."""

    def call_baseline(i: int) -> int:
        inputs = distinct[i % len(distinct)]
        for array in inputs.values():
            flush(array)
        started = time.perf_counter_ns()
        outputs = problem.baseline(inputs)
        ns = time.perf_counter_ns() - started
        for array in outputs.values():  # the next call does not pay for writing them back
            if isinstance(array, np.ndarray) and array.flags.c_contiguous:
                flush(array)
        return ns

    return call_baseline


def bench(job: p.BenchJob) -> p.BenchReply:
    problem = load_problem(job.problem)
    secret = np.random.default_rng(job.seed)
    set_bytes = problem.nbytes(job.shape, job.dtype)
    n_sets = input_sets(job)
    files.write_progress("baseline inputs")
    distinct = baseline_inputs(problem, job, secret)
    flush = cache_flush(job.cache_flush_library)
    files.write_progress("starting the kernel")
    contenders: list[Contender] = []
    rejection: Rejection | None = None
    samples = None
    rechecked: list[str] = []
    judged_calls: list[int] = []
    handshake = 0.0
    cpu_before = cpu_after = 0.0
    contention: float | None = None
    try:
        kernel = Contender(problem, job, job.library, secret, job.judged_calls, flush)
        contenders.append(kernel)
        incumbent = None
        if job.incumbent_library:
            incumbent = Contender(problem, job, job.incumbent_library, secret, 0, flush)
            contenders.append(incumbent)
        files.write_progress("re-check inputs")
        interleaved = InterleavedRecheck(problem, job, secret)
        if job.wait_for_window:
            files.write_progress("waiting for the timed window")
            files.wait_for_window()
        handshake = float(np.median([kernel.process.nop() for _ in range(21)]))
        cpu_before = kernel.process.cpu_seconds()
        meter = ContentionMeter(contenders)

        def call_kernel(_: int) -> int:
            interleaved.before_timed_call(kernel)
            ns = kernel.timed(f"timed call {kernel.process.calls}")
            if interleaved.calls == 1:
                interleaved.after_first_call(ns)
            return ns

        def call_incumbent(_: int) -> int:
            assert incumbent is not None
            return incumbent.timed(f"incumbent call {incumbent.process.calls}")

        contender_calls: Call | None = call_incumbent if incumbent is not None else None
        samples = interleave(
            call_kernel,
            baseline_call(problem, distinct, flush),
            contender_calls,
            n_sets,
            warmup=job.warmup,
            warmup_seconds=job.warmup_seconds,
            min_runs=job.min_runs,
            min_seconds=job.min_seconds,
            max_seconds=job.max_seconds,
            max_runs=job.max_runs,
            half_width=job.half_width,
            progress=files.write_progress,
            baseline_every=(
                job.baseline_every if incumbent is None else job.baseline_every_with_incumbent
            ),
        )
        cpu_after = kernel.process.cpu_seconds()
        contention = meter.contention()
        files.close_window()
        if incumbent is not None:
            incumbent.close()
            contenders.remove(incumbent)
        distinct.clear()
        judged_calls = [k.call for k in kernel.kept]
        rejection = _judge_and_recheck(problem, job, kernel, interleaved, rechecked)
    except KernelEnded as ended:
        rejection = ended_rejection("benchmark", ended)
    except OutOfBounds as oob:
        rejection = oob.rejection
    finally:
        mechanisms = contenders[0].process.mechanisms if contenders else []
        for contender in contenders:
            contender.close()
    files.write_progress("done")
    return p.BenchReply(
        kernel_ns=samples.kernel_ns if samples else [],
        kernel_warmup_ns=samples.kernel_warmup_ns if samples else [],
        baseline_ns=samples.baseline_ns if samples else [],
        incumbent_ns=samples.incumbent_ns if samples else [],
        input_sets=n_sets,
        rotated_bytes=n_sets * set_bytes,
        timed_seconds=samples.timed_seconds if samples else 0.0,
        rejection=rejection,
        judged_calls=sorted(judged_calls),
        rechecked=rechecked,
        handshake_ns=handshake,
        kernel_cpu_seconds=max(0.0, cpu_after - cpu_before),
        mechanisms=list(mechanisms),
        window_contention_cores=contention,
        stopped=samples.stopped if samples else "",
    )
