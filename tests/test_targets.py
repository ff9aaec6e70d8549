"""The target map (`gpu_workers.targets`): one entry per target, covering every target the
kernels are written for, and the per-target tables below it covering the map."""

from __future__ import annotations

import pytest

from gpu_workers.cpu.backend import CpuBackend
from gpu_workers.sandbox import Limits
from gpu_workers.targets import (
    PRECHECKED_TARGETS,
    TARGETS,
    UnsupportedTarget,
    backend_for,
    device_missing,
    target_of,
    worker_device_index,
)
from kernels.design_space import TARGET_DTYPES, TEMPLATE_TARGETS
from kernels.fusion.plan import CODEGENS
from kernels.templates import EXAMPLES


def test_every_per_target_table_covers_the_targets_of_the_map() -> None:
    assert set(TARGETS) == {"cpu", "cuda"}
    for table in (TARGET_DTYPES, TEMPLATE_TARGETS, EXAMPLES, CODEGENS):
        assert set(table) == set(TARGETS)
    assert all(target_of(name).dtypes == TARGET_DTYPES[name] for name in TARGETS)


def test_an_unknown_target_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(UnsupportedTarget, match=r"unknown target 'tpu'; known: cpu, cuda"):
        target_of("tpu")
    with pytest.raises(UnsupportedTarget):
        device_missing("tpu")


def test_the_cpu_target_runs_on_this_hosts_cores_and_verifies_in_one_piece() -> None:
    cpu = target_of("cpu")
    assert not cpu.precheck and PRECHECKED_TARGETS == ("cuda",)
    assert worker_device_index("cpu") is None
    assert device_missing("cpu") is None and device_missing("cpu", "benchmarker") is None
    assert cpu.default_flags == ("-O3", "-march=native", "-fopenmp")
    assert (cpu.source_suffix, target_of("cuda").source_suffix) == (".c", ".cu")


def test_the_workers_back_end_is_long_lived_and_a_check_gets_one_of_its_own() -> None:
    worker = backend_for("cpu")
    assert worker is backend_for("cpu")
    assert isinstance(worker, CpuBackend) and worker.recheck_pool is not None
    limits = Limits(cpu_seconds=3, address_space_bytes=1 << 30, wall_seconds=1.0)
    checking = target_of("cpu").checking_backend(limits)
    assert isinstance(checking, CpuBackend) and checking is not worker
    assert checking.verify_limits == limits and checking.recheck_pool is None
