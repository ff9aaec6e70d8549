"""The fuser's IR, partitions and code generation: every partition verifies on the cpu,
the CUDA output compiles for sm_90, and sources are a pure function of the parameters."""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from gpu_workers.cpu.backend import CpuBackend
from gpu_workers.verification import verify
from kernels.builtin import BUILTIN
from kernels.cuda_launch import parse_launch_plan
from kernels.design_space import InvalidParams, Template
from kernels.fusion import (
    NotAGraphProblem,
    Partition,
    best_known_for,
    evaluate,
    fusion_space,
    graph_of,
    param_key,
    parse_partition,
    partitions,
    plan,
    unfused_chain,
)
from kernels.fusion.codegen_cuda import launch_plan
from kernels.fusion.ir import MATRIX, RowReduce
from kernels.fusion.plan import groups_of
from kernels.fusion.space import FUSION_SPACE_NAME
from kernels.spec import DISTRIBUTIONS
from tests.cpu_support import calibration, cpu_backend, kf_cache

__all__ = ["calibration", "cpu_backend", "kf_cache"]

PROBLEM = BUILTIN["residual_rmsnorm_gelu"]
KEYS = ["add|rmsnorm|gelu", "add|rmsnorm+gelu", "add+rmsnorm|gelu", "add+rmsnorm+gelu"]


def _code(source: str) -> str:
    """The source without comments: what the compiler sees."""
    return re.sub(r"/\*.*?\*/", "", source, flags=re.DOTALL)


# the IR ---------------------------------------------------------------------------------


def test_the_graph_is_derived_from_the_problem() -> None:
    graph = graph_of(PROBLEM)
    assert graph.op_names == PROBLEM.graph == ("add", "rmsnorm", "gelu")
    assert [t.name for t in graph.inputs] == ["x", "r", "w"]
    assert graph.output == "y"
    assert graph.op("add").inputs == ("x", "r")
    assert graph.op("rmsnorm").inputs == ("add_out", "w")
    assert graph.op("gelu").inputs == ("rmsnorm_out",)
    assert graph.op("gelu").output == "y"
    assert any(isinstance(s, RowReduce) for s in graph.op("rmsnorm").steps)
    assert graph.kinds()["add_out"] == MATRIX
    with pytest.raises(NotAGraphProblem):
        graph_of(BUILTIN["softmax"])


@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
def test_the_ir_computes_the_reference_and_the_baseline_is_the_unfused_chain(
    distribution: str,
) -> None:
    graph = graph_of(PROBLEM)
    chain = unfused_chain(PROBLEM)
    for seed, shape in enumerate(PROBLEM.test_shapes):
        inputs = PROBLEM.generate(shape, distribution, seed)
        expected = PROBLEM.expected(inputs)
        scale = PROBLEM.scales(inputs, expected)["y"]
        as64 = {k: v.astype(np.float64) for k, v in inputs.items()}
        # float64: the IR interpreter is the reference
        got64 = evaluate(graph, as64)["y"]
        finite = np.isfinite(expected["y"])  # the reference's NaN is the answer there
        assert np.array_equal(np.isnan(got64), np.isnan(expected["y"]))
        assert np.all((np.abs(got64 - expected["y"]) <= 1e-12 * scale + 1e-300)[finite])
        # float32: the IR chain and Problem.baseline are the same op-by-op numpy sequence,
        # up to float32 rounding (x * (1/sqrt) against x / sqrt), within the fp32 tolerance
        with np.errstate(all="ignore"):
            ours, theirs = chain(inputs)["y"], PROBLEM.baseline(inputs)["y"]
        assert ours.dtype == theirs.dtype == np.float32
        tol = PROBLEM.tolerances["fp32"]
        assert np.all((np.abs(ours - theirs) <= tol.rtol * scale + tol.atol)[finite])


# partitions -----------------------------------------------------------------------------


def test_partitions_are_every_contiguous_grouping_from_unfused_to_fused() -> None:
    found = partitions(PROBLEM.graph)
    assert [p.key for p in found] == KEYS
    assert found[0].groups == (("add",), ("rmsnorm",), ("gelu",))
    assert found[-1].groups == (("add", "rmsnorm", "gelu"),)
    assert [len(partitions("abcd"[:n])) for n in range(1, 5)] == [1, 2, 4, 8]
    assert len({p.key for p in partitions(list("abcde"))}) == 16
    for p in found:
        assert p.ops == PROBLEM.graph
        assert parse_partition(p.key, PROBLEM.graph) == p
        assert parse_partition(p.as_lists(), PROBLEM.graph) == p
    for bad in ("add|gelu|rmsnorm", "add+gelu|rmsnorm", "add||rmsnorm+gelu", "add|rmsnorm"):
        with pytest.raises(ValueError):
            parse_partition(bad, PROBLEM.graph)


# cpu code generation --------------------------------------------------------------------

# every partition, with both reuse modes where they differ, and the other knobs varied
CPU_CASES = [
    ("add|rmsnorm|gelu", "recompute", 0, 16, 2, True),
    ("add|rmsnorm+gelu", "recompute", 2, 8, 4, False),
    ("add+rmsnorm|gelu", "recompute", 1, 16, 1, True),
    ("add+rmsnorm|gelu", "stash", 0, 8, 2, False),
    ("add+rmsnorm+gelu", "recompute", 2, 16, 4, False),
    ("add+rmsnorm+gelu", "stash", 1, 8, 1, True),
    ("add+rmsnorm+gelu", "stash", 0, 16, 2, True),
]


@pytest.mark.parametrize(
    ("partition", "reuse", "threads", "simdlen", "unroll", "streaming"), CPU_CASES
)
def test_every_partition_verifies_on_the_cpu(
    partition: str,
    reuse: str,
    threads: int,
    simdlen: int,
    unroll: int,
    streaming: bool,
    cpu_backend: CpuBackend,
) -> None:
    params = {"reuse": reuse, "threads": threads, "simdlen": simdlen, "unroll": unroll}
    fused = plan(PROBLEM, partition, {**params, "streaming": streaming})
    assert len(re.findall(r"static void kf_group_\d+\(", fused.source)) == len(fused.groups)
    assert PROBLEM.c_signature() + " {" in fused.source
    crossing = len(fused.groups) - 1
    assert fused.source.count("aligned_alloc(64,") == min(2, crossing)
    assert fused.source.count("free(kf_buf") == 2 * min(2, crossing)
    verdict = verify(PROBLEM, cpu_backend, fused.source, fused.flags)
    assert verdict.verified, verdict.rejection
    assert verdict.max_rel_err is not None and verdict.max_rel_err < 1e-4


def test_a_failed_allocation_writes_nan_not_garbage(tmp_path: Path) -> None:
    """The unfused kernel, built with aligned_alloc forced to fail, outputs NaN only."""
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        pytest.skip("no C compiler")
    source = plan(PROBLEM, KEYS[0], {"threads": 1}).source
    rows, cols = 3, 7
    inputs = PROBLEM.generate({"rows": rows, "cols": cols}, "normal", 1)
    outputs = {}
    for label, text in (
        ("ok", source),
        ("fail", source.replace("#define KF_W", "#define aligned_alloc(a, n) NULL\n#define KF_W")),
    ):
        (tmp_path / f"{label}.c").write_text(text)
        lib = tmp_path / f"{label}.so"
        subprocess.run(
            [compiler, "-O2", "-fopenmp-simd", "-shared", "-fPIC", f"{label}.c", "-o", lib.name],
            cwd=tmp_path,
            check=True,
        )
        fn = ctypes.CDLL(str(lib)).kernel
        y = np.full((rows, cols), 7.0, dtype=np.float32)
        ptrs = [inputs[n].ctypes.data_as(ctypes.c_void_p) for n in ("x", "r", "w")]
        fn(*ptrs, y.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(rows), ctypes.c_int64(cols))
        outputs[label] = y
    expected = PROBLEM.expected(inputs)["y"]
    assert np.allclose(outputs["ok"], expected, rtol=1e-4, atol=1e-6)
    assert np.isnan(outputs["fail"]).all()


def test_sources_are_a_pure_function_of_the_parameters() -> None:
    space = fusion_space(PROBLEM, "cpu")
    seen: dict[tuple[str, tuple[str, ...]], dict[str, object]] = {}
    points = list(space.valid_points())
    assert len(points) > 100
    for point in points:
        first = space.render(point)
        again = space.render(dict(reversed(list(point.items()))))
        assert first == again
        key = (_code(first.source), first.flags)
        assert key not in seen, (point, seen.get(key))
        seen[key] = point


def test_the_fusion_space_is_a_template_a_planner_can_search() -> None:
    for target in ("cpu", "cuda"):
        space = fusion_space(PROBLEM, target)
        assert isinstance(space, Template)
        assert space.name == FUSION_SPACE_NAME
        assert {p.name for p in space.params} >= {"partition", "unroll", "reuse"}
        assert set(space.params[0].choices) == set(KEYS)
        assert space.is_valid(space.defaults) and space.is_valid(space.best_known)
        # stash is refused where no group computes a value a reduction reads twice
        assert not space.is_valid({**space.defaults, "partition": KEYS[0], "reuse": "stash"})
        assert space.is_valid({**space.defaults, "partition": KEYS[2], "reuse": "stash"})
        for key in KEYS:
            assert space.is_valid(best_known_for(space, key))
    cpu = fusion_space(PROBLEM, "cpu")
    assert {"threads", "simdlen"} <= {p.name for p in cpu.params}
    with pytest.raises(InvalidParams):
        cpu.render({**cpu.defaults, "threads": 3})


def test_a_plan_is_plain_data_for_a_fusion_planned_event() -> None:
    a = plan(PROBLEM, "add+rmsnorm|gelu", {"unroll": 4, "threads": 2})
    b = plan(PROBLEM, Partition((("add", "rmsnorm"), ("gelu",))), {"threads": 2, "unroll": 4})
    assert a == b
    assert a.param_key == param_key(dict(reversed(list(a.params.items()))))
    fields = a.event_fields()
    assert fields["groups"] == [["add", "rmsnorm"], ["gelu"]]
    assert fields["params"] == {
        **fusion_space(PROBLEM).defaults,
        "unroll": 4,
        "threads": 2,
        "partition": "add+rmsnorm|gelu",
    }
    assert groups_of(PROBLEM.name, a.params, "cpu") == fields["groups"]
    again = plan(PROBLEM.name, fields["groups"], a.params, "cpu")  # type: ignore[arg-type]
    assert again == a
    assert plan(PROBLEM, "add+rmsnorm|gelu", {"unroll": 1}).param_key != a.param_key
    with pytest.raises(InvalidParams):
        plan(PROBLEM, "add|rmsnorm+gelu", {"partition": "add+rmsnorm|gelu"})
    with pytest.raises(InvalidParams):
        plan(PROBLEM, "add|rmsnorm+gelu", {"block": 256})  # a cuda knob on the cpu
    with pytest.raises(ValueError):
        groups_of(PROBLEM.name, {"partition": "gelu|add+rmsnorm"})
    with pytest.raises(ValueError):
        groups_of("no_such_problem", {"partition": "add"})


# cuda code generation -------------------------------------------------------------------


def test_every_partition_compiles_with_nvcc_for_sm_90(tmp_path: Path) -> None:
    """Device code only: the launches and buffers are declared in the source and match
    `launch_plan`; each partition and reuse mode compiles to a cubin for every dtype."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not installed on this host: the CUDA output cannot be compiled")
    space = fusion_space(PROBLEM, "cuda")
    jobs: list[tuple[str, str, str, subprocess.Popen[str]]] = []
    for index, key in enumerate(KEYS):
        for reuse in ("recompute", "stash"):
            point = {
                **space.defaults,
                "partition": key,
                "reuse": reuse,
                "block": 128 << (index % 4),
            }
            if not space.is_valid(point):
                continue
            dtype = ("fp32", "bf16", "fp16")[len(jobs) % 3]
            fused = plan(PROBLEM, key, point, "cuda", dtype)
            assert not any(f.startswith("-arch") for f in fused.flags)
            assert "__host__" not in fused.source and "cudaMalloc" not in fused.source
            declared = parse_launch_plan(fused.source, PROBLEM)
            expected = launch_plan(
                PROBLEM, parse_partition(key, PROBLEM.graph), int(point["block"]), reuse, dtype
            )
            assert declared.render() == expected.render()
            assert len(fused.launches) == len(fused.groups) == len(declared.launches)
            crossing = min(2, len(fused.groups) - 1)
            apart = reuse == "stash" and dtype != "fp32" and len(fused.groups) == 1
            assert len(declared.buffers) == crossing + apart, (key, reuse, dtype)
            name = f"k{len(jobs)}"
            (tmp_path / f"{name}.cu").write_text(fused.source)
            command = [nvcc, "-cubin", "-arch=sm_90", "-Xptxas", "-v", *fused.flags]
            command += [f"{name}.cu", "-o", f"{name}.cubin"]
            jobs.append(
                (
                    key,
                    reuse,
                    name,
                    subprocess.Popen(
                        command,
                        cwd=tmp_path,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT,
                        text=True,
                    ),
                )
            )
    assert len(jobs) == 6
    for key, reuse, name, proc in jobs:
        log, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, (key, reuse, log)
        assert (tmp_path / f"{name}.cubin").stat().st_size > 0
        groups = key.count("|") + 1
        compiled = re.findall(r"Compiling entry function '(kf_group_\d+)'", log)
        assert sorted(compiled) == [f"kf_group_{g}" for g in range(groups)], log
        assert log.count(" 0 bytes spill stores") == groups, log
