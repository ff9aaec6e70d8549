"""Every timed call judged, cheaply: a few rows of each call's outputs against the reference.

Judging a whole timed call costs a float64 reference of the whole shape, so only a few
timed calls are judged in full (`judged_calls`, drawn at random from the secret seed). A
kernel that counts its calls could be wrong on a few of them and most likely escape that
draw. Here every timed call is also judged on `ROWS_PER_CALL` rows along the problem's
first dim, drawn from the secret seed after the call (the kernel cannot know which): the
driver copies those rows of the inputs and outputs while the kernel is stopped, and the
reference of just those rows is computed after timing (`Problem.rows_independent`: a row
of every output depends only on the same row of the inputs that have that dim, and on
the whole of those that do not).

A call judged whole at a large shape is judged a block of rows at a time
(`passes_in_row_blocks`) where that gives the whole's verdict: each block's float64
reference, scale and comparison stay in cache, where the whole's temporaries are hundreds
of MiB. A block that fails hands the call to the whole-array rules, which name the failure.

The arithmetic. Each wrong call is checked on R = 8 rows drawn without replacement. A
call wrong on at least half of its rows (a call skipped, or computed from other inputs,
is wrong on all of them) escapes its own check with probability at most 2^-8 = 0.0039,
so it is caught with probability at least 0.996 >= 0.99, whichever call it is. A kernel
wrong on 1 call in 40 has at least one wrong call in any run of 30 or more timed calls
that includes such a call; each is caught with that probability, independently of the
full judging of `judged_calls` calls, which adds to it. (The old full judging alone: 3
calls of 33 judged, a kernel wrong on one of them is caught with probability 3/33 = 0.09.)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpu_workers.protocols import JudgedCall
from gpu_workers.quick_compare import every_element_passes
from kernels.spec import Arrays, Problem, Tolerance

ROWS_PER_CALL = 8
BLOCK_ELEMENTS = 1 << 16
"""Output elements per block of rows judged at once: its float64 temporaries stay in cache."""


@dataclass
class RowSample:
    """The rows of one timed call kept for judging: `rows` along the problem's first dim,
    the inputs that have that dim at those rows, and the outputs at those rows."""

    call: int
    rows: np.ndarray
    inputs: Arrays
    outputs: Arrays


def sampled(problem: Problem) -> bool:
    """Whether the problem's calls can be judged on rows: its rows are independent, and
    every output has its first dim first."""
    first = problem.dims[0]
    return problem.rows_independent and all(a.dims[:1] == (first,) for a in problem.outputs)


def draw_rows(problem: Problem, shape: dict[str, int], rng: np.random.Generator) -> np.ndarray:
    """`ROWS_PER_CALL` distinct rows (all of them where there are fewer), sorted."""
    count = int(shape[problem.dims[0]])
    drawn = rng.choice(count, size=min(ROWS_PER_CALL, count), replace=False)
    return np.sort(drawn)


def take_rows(problem: Problem, call: int, rows: np.ndarray, views: Arrays) -> RowSample:
    """Copies of `rows` of the call's inputs with the first dim, and of its outputs."""
    first = problem.dims[0]
    return RowSample(
        call=call,
        rows=rows,
        inputs={a.name: views[a.name][rows] for a in problem.inputs if a.dims[:1] == (first,)},
        outputs={a.name: views[a.name][rows] for a in problem.outputs},
    )


def row_call(
    problem: Problem, sample: RowSample, whole_inputs: Arrays, poison_bits: int
) -> JudgedCall:
    """The sample as a call of its own: the sampled rows of the inputs with the first dim,
    the whole of the others (from `whole_inputs`), and the sampled rows of the outputs."""
    inputs = {a.name: sample.inputs.get(a.name, whole_inputs.get(a.name)) for a in problem.inputs}
    missing = [name for name, array in inputs.items() if array is None]
    if missing:
        raise ValueError(f"no inputs {missing} for the rows of timed call {sample.call}")
    complete: Arrays = {name: array for name, array in inputs.items() if array is not None}
    rows = ", ".join(str(r) for r in sample.rows)
    return JudgedCall(
        when=f"timed call {sample.call} (rows {rows})",
        inputs=complete,
        outputs=sample.outputs,
        inputs_after=complete,
        poison_bits=poison_bits,
        seed=None,
    )


def needs_whole_inputs(problem: Problem) -> bool:
    """Some input lacks the first dim: judging a sample needs the call's whole inputs made
    again."""
    first = problem.dims[0]
    return any(a.dims[:1] != (first,) for a in problem.inputs)


def judged_in_row_blocks(problem: Problem) -> bool:
    """Whether a block of rows gets the verdict the whole call would: rows independent,
    every output first-dim first and with a last axis of its own (two dims or more), and
    the default error scale, which is per row of that last axis."""
    return (
        sampled(problem)
        and problem.error_scale is None
        and all(len(a.dims) >= 2 for a in problem.outputs)
    )


def passes_in_row_blocks(
    problem: Problem, tolerance: Tolerance, inputs: Arrays, outputs: Arrays, poison_bits: int
) -> bool:
    """Whether every output element passes, judged `BLOCK_ELEMENTS` at a time along the
    first dim (`judged_in_row_blocks` problems only). False where any block does not, or
    where an output's shape is not the reference's: the whole-array rules then decide."""
    first = problem.dims[0]
    rows = len(outputs[problem.outputs[0].name])
    per_row = max(outputs[a.name][:1].size for a in problem.outputs)
    step = max(1, BLOCK_ELEMENTS // max(per_row, 1))
    for start in range(0, rows, step):
        block = {
            a.name: inputs[a.name][start : start + step]
            if a.dims[:1] == (first,)
            else inputs[a.name]
            for a in problem.inputs
        }
        expected = problem.expected(block)
        scales = problem.scales(block, expected)
        for a in problem.outputs:
            got = outputs[a.name][start : start + step]
            if got.shape != expected[a.name].shape:
                return False
            if not every_element_passes(
                got, expected[a.name], scales[a.name], poison_bits, tolerance
            ):
                return False
    return True
