"""Verification in the CPU driver: every trial's runs on the kernel host, read back.

The inputs come from the worker as .npy files; each trial's buffers are laid out afresh
(random placement in their pages, guard pages, canaries on both sides); the outputs and
the inputs as the kernel left them go back as .npy files, with any damage around the
buffers. An ending of the kernel's process is the reply's `ended`.
"""

from __future__ import annotations

import numpy as np

from gpu_workers import runner_files as files
from gpu_workers.cpu import protocol as p
from gpu_workers.cpu.arena import ITEMSIZE, Arena, layout, poison, slot_bytes
from gpu_workers.cpu.kernel_process import (
    KernelEnded,
    KernelProcess,
    ended_rejection,
    kernel_process,
)


def verify(job: p.VerifyJob) -> files.VerifyReply:
    n_dims = len(job.trials[0].dims) if job.trials else 0
    placement = np.random.default_rng(job.layout_seed)
    largest = max(
        (sum(slot_bytes(int(np.prod(s)) * ITEMSIZE) for s in t.arg_shapes) for t in job.trials),
        default=0,
    )
    arena = Arena(largest)
    records: list[files.RunRecord] = []
    try:
        with kernel_process(job.kernel_host, job.library, len(job.arg_names), n_dims, arena) as k:
            try:
                for trial in job.trials:
                    _verify_trial(job, trial, k, arena, placement, records)
            except KernelEnded as ended:
                return files.VerifyReply(
                    runs=records, ended=ended_rejection("run", ended), mechanisms=k.mechanisms
                )
            files.write_progress("done")
            return files.VerifyReply(runs=records, mechanisms=k.mechanisms)
    except KernelEnded as ended:  # it never got as far as the first call
        return files.VerifyReply(runs=records, ended=ended_rejection("run", ended))
    finally:
        arena.close()


def _verify_trial(
    job: p.VerifyJob,
    trial: p.TrialJob,
    kernel: KernelProcess,
    arena: Arena,
    placement: np.random.Generator,
    records: list[files.RunRecord],
) -> None:
    slots = layout([tuple(s) for s in trial.arg_shapes], ITEMSIZE, placement)
    arena.bytes[:] = 0  # nothing of an earlier trial stays anywhere in the kernel's reach
    kernel.protect(slots, job.arg_names, job.outputs)
    inputs = {
        name: np.load(files.input_file(trial.index, name))
        for name, out in zip(job.arg_names, job.outputs, strict=True)
        if not out
    }
    for run in range(trial.runs):
        arena.fill_canaries(slots)
        views = [arena.floats(s) for s in slots]
        for view, name, out in zip(views, job.arg_names, job.outputs, strict=True):
            if out:
                poison(view, p.POISON_BITS[run % len(p.POISON_BITS)])
            else:
                view[...] = inputs[name]
        what = (
            f"trial {trial.index} run {run}: shape {trial.shape}, "
            f"{trial.distribution} inputs, seed {trial.seed}"
        )
        files.write_progress(what)
        ns = kernel.call([s.offset for s in slots], trial.dims, what)
        damaged = [
            f"{name} ({side} its data)"
            for slot, name in zip(slots, job.arg_names, strict=True)
            if (side := arena.damaged(slot)) is not None
        ]
        for view, name, out in zip(views, job.arg_names, job.outputs, strict=True):
            target = files.out_file if out else files.after_file
            np.save(target(trial.index, run, name), view)
        records.append(
            files.RunRecord(trial=trial.index, run=run, damaged_slack=damaged, seconds=ns / 1e9)
        )
