"""The variation operators' children judged by the real verifier (compiled, run in the
sandbox against a float64 reference over many shapes and inputs): single operators and
chains from plain scalar seeds verify, and what is wrong is rejected, whether an operator
proposed it (a too coarse approximation) or an edit broke it by hand. The verifier is the
judge, not the operator. About 30 s on one core."""

from __future__ import annotations

import pytest

from actors.search.operators.protocol import Context, ParentKernel, Variation
from actors.search.operators.registry import OPERATORS
from gpu_workers.cpu.backend import CpuBackend
from gpu_workers.verification import verify
from tests.cpu_support import cpu_backend, kf_cache
from tests.operator_seeds import SEEDS, SWIGLU, seed

__all__ = ["cpu_backend", "kf_cache"]

CTX = Context("test", rtol=1e-4)
CHECK_SEED = 11
"""One fixed draw of the verifier's shapes and inputs, so a failure replays."""

Step = tuple[str, dict[str, object]]
FAST: list[Step] = [
    ("omp_parallel", {"threads": 2}),
    ("omp_simd", {"minmax": "select"}),
    ("approx_math", {}),
    ("restrict", {"align": 64}),
    ("compiler_flags", {}),
]


def chain(parent: ParentKernel, steps: list[Step], context: Context = CTX) -> ParentKernel:
    """Apply each step to the child of the one before; every step must apply."""
    for k, (op, params) in enumerate(steps):
        out = OPERATORS[op].apply([parent], params, context)  # type: ignore[arg-type]
        assert isinstance(out, Variation), (op, out)
        parent = out.as_parent(f"{parent.candidate_id}.{k}")
    return parent


def judge(name: str, kernel: ParentKernel, backend: CpuBackend) -> str:
    """'' if the kernel verifies, else the rejection's reason code."""
    problem = SEEDS[name][0]
    verdict = verify(problem, backend, kernel.source, kernel.flags, seed=CHECK_SEED)
    return "" if verdict.verified else (verdict.rejection.reason if verdict.rejection else "?")


@pytest.mark.parametrize("name", sorted(SEEDS))
def test_threads_simd_fast_maths_and_restrict_verify_on_every_seed(
    name: str, cpu_backend: CpuBackend
) -> None:
    kernel = chain(seed(name), FAST)
    assert "#pragma omp parallel for" in kernel.source and "kf_" in kernel.source
    assert judge(name, kernel, cpu_backend) == ""


@pytest.mark.parametrize(
    ("name", "steps"),
    [(n, ("threads_simd_math", "threads_simd_math_hoist")[i % 2]) for i, n in enumerate(SEEDS)],
)
def test_each_chain_is_one_child_that_verifies_on_every_seed(
    name: str, steps: str, cpu_backend: CpuBackend
) -> None:
    kernel = chain(seed(name), [("chain", {"steps": steps})])
    assert [s.operator for s in kernel.lineage] == ["chain"]
    assert "#pragma omp parallel for" in kernel.source and "-march=native" in kernel.flags
    assert judge(name, kernel, cpu_backend) == ""


def test_softmax_with_a_row_buffer_streamed_output_and_reciprocal_verifies(
    cpu_backend: CpuBackend,
) -> None:
    kernel = chain(
        seed("softmax"),
        [
            ("omp_parallel", {}),
            ("tile", {"mode": "row_buffer", "block": 1024}),
            ("nontemporal", {}),
            ("omp_simd", {"minmax": "select"}),
            ("approx_math", {"accuracy": "medium"}),
            ("hoist", {}),
            ("compiler_flags", {}),
        ],
    )
    assert "kf_stream_row(y + (r * cols), cols);" in kernel.source
    assert judge("softmax", kernel, cpu_backend) == ""


@pytest.mark.parametrize("name", ["softmax", "layernorm"])
def test_accumulators_then_threads_verify(name: str, cpu_backend: CpuBackend) -> None:
    kernel = chain(
        seed(name),
        [
            ("unroll", {"mode": "accumulators", "factor": 16}),
            ("approx_math", {}),
            ("compiler_flags", {}),
            ("omp_parallel", {}),
        ],
    )
    assert "#pragma omp parallel for schedule(static)\n    for (int64_t r" in kernel.source
    assert judge(name, kernel, cpu_backend) == ""


def test_a_flat_output_streamed_in_chunks_by_threads_verifies(cpu_backend: CpuBackend) -> None:
    kernel = chain(
        seed("swiglu"),
        [
            ("omp_parallel", {"threads": 2}),
            ("omp_simd", {}),
            ("nontemporal", {"chunk": 1024}),
            ("approx_math", {}),
            ("compiler_flags", {}),
        ],
    )
    assert judge("swiglu", kernel, cpu_backend) == ""


def test_tiled_and_fused_passes_verify(cpu_backend: CpuBackend) -> None:
    two_pass = ParentKernel(
        "swiglu-two-pass",
        "#include <math.h>\n#include <stdint.h>\n"
        "void kernel(const float *a, const float *b, float *y, int64_t n) {\n"
        "    for (int64_t i = 0; i < n; ++i) y[i] = a[i] / (1.0f + expf(-a[i]));\n"
        "    for (int64_t i = 0; i < n; ++i) y[i] *= b[i];\n"
        "}\n",
        ("-O3",),
    )
    for step in [("tile", {"block": 1024}), ("fuse", {})]:
        kernel = chain(two_pass, [step])
        assert verify(SWIGLU, cpu_backend, kernel.source, kernel.flags, seed=CHECK_SEED).verified


def test_a_crossover_of_two_children_verifies(cpu_backend: CpuBackend) -> None:
    threads = chain(seed("logsumexp"), [("omp_parallel", {})])
    vectors = chain(seed("logsumexp"), [("omp_simd", {"minmax": "select"}), ("approx_math", {})])
    out = OPERATORS["crossover"].apply([threads, vectors], {"unit": "loop", "index": 2}, CTX)
    assert isinstance(out, Variation)
    assert "omp parallel for" in out.source and "kf_exp_full" in out.source
    assert judge("logsumexp", out.as_parent("x"), cpu_backend) == ""


def test_what_is_wrong_is_rejected_whoever_proposed_it(cpu_backend: CpuBackend) -> None:
    # An operator that does not know the tolerance (none given) proposes a too coarse sqrt.
    coarse = chain(seed("layernorm"), [("approx_math", {"accuracy": "low"})], Context("test"))
    assert judge("layernorm", coarse, cpu_backend) == "wrong_value"
    honest = chain(seed("l2norm"), [("unroll", {"mode": "accumulators", "factor": 8})])
    combine = "{ s += kf_acc_s[kf_k]; }"
    assert combine in honest.source
    broken = ParentKernel(
        "broken", honest.source.replace(combine, "{ s = kf_acc_s[kf_k]; }"), honest.flags
    )
    assert judge("l2norm", broken, cpu_backend) == "wrong_value"
