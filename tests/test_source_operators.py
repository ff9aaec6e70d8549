"""The offline variation operators on C source, structurally: each applies where its
precondition holds (the child parses, the edit is where it should be, everything else of
the parent survives byte for byte) and refuses, with its reason code, where it does not.
tests/test_source_operators_verified.py runs the real verifier on children and chains."""

from __future__ import annotations

import difflib

import pytest

from actors.search.operators.c_ast import CSource, Edit, apply_edits
from actors.search.operators.dependence import independence
from actors.search.operators.helpers import insert_helpers, render
from actors.search.operators.protocol import (
    Context,
    ParentKernel,
    Refusal,
    Refuse,
    Variation,
)
from actors.search.operators.registry import OPERATORS
from kernels.fusion.codegen_c import STREAM_ROW
from tests.operator_seeds import seed

CTX = Context("test", rtol=1e-4)


def apply(op: str, parent: ParentKernel, **params: object) -> Variation:
    out = OPERATORS[op].apply([parent], params, CTX)  # type: ignore[arg-type]
    assert isinstance(out, Variation), out
    assert CSource(out.source).kernel() is not None
    return out


def refusal(op: str, parent: ParentKernel, **params: object) -> str:
    out = OPERATORS[op].apply([parent], params, CTX)  # type: ignore[arg-type]
    assert isinstance(out, Refusal), out.source if isinstance(out, Variation) else out
    assert out.operator == op and out.message
    return out.reason


def kernel_of(text: str, name: str = "k") -> ParentKernel:
    return ParentKernel(name, "#include <stdint.h>\n" + text, ("-O3",))


def added(parent: str, child: str) -> list[str]:
    """The lines the child adds, if it only adds lines; fails if it changes any."""
    ops = difflib.SequenceMatcher(None, parent.splitlines(), child.splitlines()).get_opcodes()
    assert all(tag in ("equal", "insert") for tag, *_ in ops), child
    lines = child.splitlines()
    return [ln.strip() for tag, _, _, j1, j2 in ops if tag == "insert" for ln in lines[j1:j2]]


# the registry and the protocol ------------------------------------------------------


def test_every_operator_has_a_searchable_space_and_its_defaults_apply_somewhere() -> None:
    assert set(OPERATORS) >= {
        "omp_parallel",
        "omp_simd",
        "unroll",
        "restrict",
        "hoist",
        "approx_math",
        "tile",
        "fuse",
        "nontemporal",
        "crossover",
    }
    for name, op in OPERATORS.items():
        assert op.name == name and op.arity == (2 if name == "crossover" else 1)
        space = op.space()
        assert space and all(isinstance(v, tuple) and v for v in space.values())
        space["extra"] = (1,)
        assert "extra" not in op.space()  # a copy: the planner may not change it


def test_a_child_records_its_operator_point_parents_lineage_and_diff() -> None:
    parent = seed("softmax")
    child = apply("omp_parallel", parent, threads=2)
    assert child.operator == "omp_parallel" and child.parents == ("softmax-seed",)
    assert child.params == {"threads": 2, "schedule": "static", "chunk": 0}
    assert child.flags == ("-O3", "-fopenmp")
    assert child.diff.startswith("--- softmax-seed.c\n+++ omp_parallel.c\n")
    assert "+#pragma omp parallel for schedule(static) num_threads(2)\n" in child.diff
    grandchild = apply("omp_simd", child.as_parent("c1"))
    assert [s.operator for s in grandchild.lineage] == ["omp_parallel", "omp_simd"]
    assert grandchild.lineage[1].parents == ("c1",)


def test_bad_points_wrong_targets_and_arity_are_refused() -> None:
    parent = seed("l2norm")
    assert refusal("omp_parallel", parent, threads=3) == "bad_param"
    assert refusal("omp_parallel", parent, threads="2") == "bad_param"
    assert refusal("unroll", parent, colour="red") == "bad_param"
    out = OPERATORS["omp_simd"].apply([parent], {}, Context(target="cuda"))
    assert isinstance(out, Refusal) and out.reason == "wrong_target"
    out = OPERATORS["crossover"].apply([parent], {}, CTX)
    assert isinstance(out, Refusal) and out.reason == "arity"
    assert refusal("omp_simd", kernel_of("void kernel(float *y) { y[0] = 1.0f;")) == "parse_error"
    assert refusal("omp_simd", kernel_of("void other(float *y) { y[0] = 1.0f; }")) == "no_kernel"


def test_the_same_inputs_give_the_same_child_byte_for_byte() -> None:
    for op, params in [("omp_parallel", {}), ("approx_math", {}), ("tile", {"mode": "row_buffer"})]:
        first = OPERATORS[op].apply([seed("softmax")], params, CTX)
        again = OPERATORS[op].apply([seed("softmax")], params, CTX)
        assert isinstance(first, Variation) and first == again


# parsing and editing ------------------------------------------------------------------


def test_edits_apply_back_to_front_and_may_not_overlap() -> None:
    data = b"abcdef"
    assert apply_edits(data, [Edit(1, 2, "XX"), Edit(4, 4, "-"), Edit(4, 4, "+")]) == b"aXXcd-+ef"
    with pytest.raises(ValueError, match="overlapping"):
        apply_edits(data, [Edit(1, 3, "x"), Edit(2, 4, "y")])


def test_a_pragma_before_an_unbraced_loop_body_braces_it() -> None:
    parent = kernel_of(
        "void kernel(const float *x, float *y, int64_t rows, int64_t cols) {\n"
        "    for (int64_t r = 0; r < rows; ++r)\n"
        "        for (int64_t j = 0; j < cols; ++j) y[r * cols + j] = 2.0f * x[r * cols + j];\n"
        "}\n"
    )
    child = apply("omp_simd", parent)
    assert "for (int64_t r = 0; r < rows; ++r)\n        {\n#pragma omp simd\n" in child.source
    assert CSource(child.source).root.has_error is False


# dependence ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("y[0] = x[0]; for (int64_t i = 1; i < n; ++i) y[i] = y[i - 1] + x[i];", "carried"),
        (
            "float c = 0; for (int64_t i = 0; i < n; ++i) { c = c * 0.5f + x[i]; y[i] = c; }",
            "scalar",
        ),
        ("for (int64_t i = 0; i < n; ++i) y[i] = foo(x[i]);", "opaque_call"),
        ("for (int64_t i = 0; i < n; ++i) { if (x[i] < 0) return; y[i] = x[i]; }", "control"),
        ("for (int64_t i = 0; i < n; ++i) y[0] += x[i];", "carried"),
        ("float *p = y; for (int64_t i = 0; i < n; ++i) { *p = x[i]; p++; }", "scalar"),
        ("for (int64_t i = 0; i < n; ++i) y[(i * 7) % n] = x[i];", "unknown_index"),
    ],
)
def test_loops_whose_independence_cannot_be_proven_are_refused(body: str, reason: str) -> None:
    parent = kernel_of(
        f"float foo(float);\nvoid kernel(const float *x, float *y, int64_t n) {{ {body} }}\n"
    )
    assert refusal("omp_parallel", parent).startswith(reason)
    assert refusal("omp_simd", parent).startswith(reason)


def test_the_row_loop_of_every_seed_is_independent_and_its_passes_reduce() -> None:
    found = {}
    for name in ("l2norm", "softmax", "logsumexp", "layernorm"):
        src = CSource(seed(name).source)
        fn = src.kernel()
        loops = src.loops(src.body(fn))
        assert independence(src, fn, loops[0], loops).reductions == ()
        found[name] = [
            (r.var, r.op) for lp in loops[1:] for r in independence(src, fn, lp, loops).reductions
        ]
    assert found == {
        "l2norm": [("s", "+")],
        "softmax": [("m", "max"), ("s", "+")],
        "logsumexp": [("m", "max"), ("s", "+")],
        "layernorm": [("mean", "+"), ("var", "+")],
    }


def test_a_row_through_a_pointer_alias_or_c89_counters_is_still_a_row() -> None:
    aliased = kernel_of(
        "void kernel(const float *x, float *y, int64_t rows, int64_t cols) {\n"
        "    int64_t r, j;\n"
        "    for (r = 0; r < rows; r++) {\n"
        "        float *yr = y + r * cols;\n"
        "        const float *xr = &x[r * cols];\n"
        "        for (j = 0; j < cols; j++) yr[j] = 2.0f * xr[j];\n"
        "    }\n"
        "}\n"
    )
    assert "#pragma omp parallel for schedule(static) private(j)" in added(
        aliased.source, apply("omp_parallel", aliased).source
    )
    shifted = kernel_of(
        "void kernel(const float *x, float *y, int64_t rows, int64_t cols) {\n"
        "    for (int64_t r = 0; r < rows; ++r)\n"
        "        for (int64_t j = 0; j < cols + 1; ++j) y[r * cols + j] = x[r * cols + j];\n"
        "}\n"
    )
    src = CSource(shifted.source)
    loops = src.loops(src.body(src.kernel()))
    with pytest.raises(Refuse, match="carried_dependence"):
        independence(src, src.kernel(), loops[0], loops)
    inner = apply("omp_parallel", shifted).source  # below the row loop, its one loop nest
    assert "        {\n#pragma omp parallel for schedule(static)\n        for (int64_t j" in inner


# the operators, one by one --------------------------------------------------------------


def test_omp_parallel_marks_the_row_loop_and_nothing_else() -> None:
    parent = seed("softmax")
    child = apply("omp_parallel", parent, threads=4, schedule="dynamic", chunk=16)
    assert added(parent.source, child.source) == [
        "#pragma omp parallel for schedule(dynamic, 16) num_threads(4)"
    ]
    pragma_at = child.source.index("#pragma omp parallel")
    assert child.source[pragma_at:].split("\n")[1] == "    for (int64_t r = 0; r < rows; ++r) {"
    assert refusal("omp_parallel", child.as_parent("c")) == "already_parallel"
    assert refusal("omp_parallel", kernel_of("void kernel(float *y) { y[0] = 1.0f; }")) == "no_loop"


def test_omp_parallel_refuses_float_sums_across_threads_and_joins_an_omp_simd() -> None:
    total = kernel_of(
        "void kernel(const float *x, float *y, int64_t n) {\n"
        "    float s = 0.0f;\n"
        "    for (int64_t i = 0; i < n; ++i) s += x[i];\n"
        "    y[0] = s;\n"
        "}\n"
    )
    assert refusal("omp_parallel", total) == "nondeterministic_reduction"
    simd = apply("omp_simd", seed("swiglu"), simdlen=8)
    both = apply("omp_parallel", simd.as_parent("s"), threads=2)
    assert (
        "#pragma omp parallel for simd simdlen(8) schedule(static) num_threads(2)\n" in both.source
    )


def test_omp_simd_marks_each_innermost_loop_with_its_reduction() -> None:
    parent = seed("softmax")
    child = apply("omp_simd", parent, simdlen=8)
    assert added(parent.source, child.source) == [
        "#pragma omp simd simdlen(8) reduction(max:m)",
        "#pragma omp simd simdlen(8) reduction(+:s)",
        "#pragma omp simd simdlen(8)",
    ]
    assert child.flags == ("-O3", "-fopenmp-simd")
    assert refusal("omp_simd", child.as_parent("c")) == "already_simd"
    select = apply("omp_simd", parent, minmax="select")
    assert "m = x[r * cols + j] > m ? x[r * cols + j] : m;" in select.source
    assert "// one exp per element" in select.source


def test_unroll_by_pragma_or_with_accumulators() -> None:
    parent = seed("l2norm")
    child = apply("unroll", parent, mode="pragma", factor=8)
    assert added(parent.source, child.source) == ["#pragma GCC unroll 8"] * 2
    acc = apply("unroll", parent, mode="accumulators", factor=16)
    assert "float kf_acc_s[16];" in acc.source
    assert "kf_acc_s[kf_k] += x[r * cols + j] * x[r * cols + j];" in acc.source
    assert "for (int kf_k = 0; kf_k < 16; ++kf_k) { s += kf_acc_s[kf_k]; }" in acc.source
    assert (
        "for (int64_t j = kf_j; j < cols; ++j) s += x[r * cols + j] * x[r * cols + j];"
        in acc.source
    )
    assert refusal("unroll", seed("swiglu"), mode="accumulators") == "no_reduction"
    simd = apply("omp_simd", parent)
    assert refusal("unroll", simd.as_parent("s"), mode="pragma") == "loop_has_pragma"


def test_restrict_and_alignment_hints_on_the_pointer_parameters() -> None:
    parent = seed("layernorm")
    child = apply("restrict", parent, align=64)
    assert (
        "void kernel(const float *restrict x, const float *restrict w, const float *restrict b, "
        "float *restrict y, int64_t rows," in child.source
    )
    assert "    x = __builtin_assume_aligned(x, 64);\n    w = __builtin_assume_aligned(w, 64);" in (
        child.source
    )
    assert refusal("restrict", child.as_parent("c"), align=64) == "already_applied"
    assert refusal("restrict", kernel_of("void kernel(int64_t n) { }")) == "no_pointer_params"


def test_hoist_turns_invariant_divisions_into_reciprocals_within_the_tolerance() -> None:
    parent = seed("layernorm")
    child = apply("hoist", parent, what="divisions")
    assert "const float kf_inv_1 = 1.0f / sqrtf(var + 1e-5f);" in child.source
    assert "(x[r * cols + j] - mean) * kf_inv_1 * w[j] + b[j];" in child.source
    assert "mean *= kf_inv_0;" in child.source and "var *= kf_inv_0;" in child.source
    tight = OPERATORS["hoist"].apply([parent], {}, Context(rtol=1e-7))
    assert isinstance(tight, Refusal) and tight.reason == "tolerance_too_tight"
    assert refusal("hoist", seed("swiglu")) == "nothing_invariant"
    integer = kernel_of(
        "void kernel(const float *x, float *y, int64_t n, int64_t k) {\n"
        "    for (int64_t i = 0; i < n; ++i) y[i] = x[i] * (float)(n / k);\n"
        "}\n"
    )
    assert refusal("hoist", integer, what="divisions") == "nothing_invariant"


def test_hoist_reads_an_invariant_load_once_guarded_by_the_loop_running() -> None:
    parent = kernel_of(
        "void kernel(const float *x, const float *s, float *y, int64_t n) {\n"
        "    for (int64_t i = 0; i < n; ++i) y[i] = x[i] * s[0];\n"
        "}\n"
    )
    child = apply("hoist", parent, what="loads")
    assert "    const float kf_ld_0 = 0 < n ? s[0] : 0.0f;\n" in child.source
    assert "y[i] = x[i] * kf_ld_0;" in child.source


def test_approx_math_renames_the_calls_and_inserts_the_template_helpers_once() -> None:
    parent = seed("l2norm")
    child = apply("approx_math", parent, function="sqrtf", accuracy="medium")
    assert "const float inv = kf_rsqrt_medium(s + 1e-12f);" in child.source
    assert render("kf_rsqrt_medium").rstrip() in child.source
    assert child.flags == ("-O3", "-fno-trapping-math")
    gelu = apply("approx_math", seed("gelu"))
    assert gelu.source.count("static inline float kf_exp_full(") == 1
    assert gelu.source.index("kf_exp_full(") < gelu.source.index("kf_tanh_full(")
    lse = apply("approx_math", seed("logsumexp"), function="expf")
    both = apply("approx_math", lse.as_parent("e"), function="logf")
    assert "y[r] = m + kf_log_full(s);" in both.source
    assert both.source.count("static inline float kf_exp_full(") == 1
    assert refusal("approx_math", both.as_parent("b")) == "no_call"
    assert refusal("approx_math", seed("swiglu"), function="erff") == "no_call"


def test_approx_math_covers_log1p_and_refuses_levels_coarser_than_the_tolerance() -> None:
    parent = kernel_of(
        "#include <math.h>\n"
        "void kernel(const float *x, float *y, long n) {\n"
        "    for (long i = 0; i < n; ++i) y[i] = log1pf(expf(x[i]));\n"
        "}\n"
    )
    child = apply("approx_math", parent, accuracy="medium")
    assert "y[i] = kf_log1p_medium(kf_exp_medium(x[i]));" in child.source
    assert child.source.index("kf_log_medium(") < child.source.index("kf_log1p_medium(")
    # rtol 1e-4: the low levels err by up to 6.5e-4 (exp) and 2.5e-4 (log1p)
    assert refusal("approx_math", parent, accuracy="low") == "too_coarse"
    assert refusal("approx_math", parent, function="log1pf", accuracy="low") == "too_coarse"


def test_a_chain_applies_the_steps_that_hold_and_refuses_when_none_does() -> None:
    parent = seed("softmax")
    child = apply("chain", parent, steps="simd_math", accuracy="medium")
    assert child.lineage[-1].operator == "chain" and child.parents == (parent.candidate_id,)
    assert "omp parallel" not in child.source and "#pragma omp simd" in child.source
    assert "kf_exp_medium(" in child.source and "restrict" in child.source
    assert "-march=native" in child.flags and child.diff.startswith("---")
    threads = apply("chain", child.as_parent("c"), steps="threads_simd_math", accuracy="medium")
    assert "#pragma omp parallel for" in threads.source  # the one step that still held
    assert refusal("chain", threads.as_parent("t"), steps="simd_math", accuracy="medium") == (
        "no_step"
    )
    assert refusal("chain", parent, steps="everything") == "bad_param"


def test_a_pure_helper_of_the_users_is_called_freely_and_an_impure_one_is_not() -> None:
    helper = "static float clampf(float v, float lo, float hi) {{ {body} }}\n"
    kernel = (
        "void kernel(const float *x, float *y, long n) {\n"
        "    for (long i = 0; i < n; ++i) y[i] = x[i] * clampf(x[i] + 3.0f, 0.0f, 6.0f);\n"
        "}\n"
    )
    pure = helper.format(body="return v < lo ? lo : (v > hi ? hi : v);")
    child = apply("omp_parallel", kernel_of(pure + kernel))
    assert "#pragma omp parallel for" in child.source
    for body in (
        "static int calls; calls++; return v;",  # keeps state across calls
        "extern float last; last = v; return v;",  # writes a global
        "return v + rand();",  # calls what may have effects
    ):
        impure = kernel_of(helper.format(body=body) + kernel)
        assert refusal("omp_parallel", impure) == "opaque_call", body


def test_a_max_written_as_an_if_is_a_reduction_and_double_maths_is_replaced_too() -> None:
    parent = kernel_of(
        "#include <math.h>\n"
        "void kernel(const float *x, float *y, long rows, long cols) {\n"
        "    for (long r = 0; r < rows; ++r) {\n"
        "        float m = x[r * cols];\n"
        "        for (long c = 1; c < cols; ++c) if (x[r * cols + c] > m) m = x[r * cols + c];\n"
        "        double s = 0.0;\n"
        "        for (long c = 0; c < cols; ++c) s += exp(x[r * cols + c] - m);\n"
        "        y[r] = m + (float)log(s);\n"
        "    }\n"
        "}\n"
    )
    kept = apply("omp_simd", parent)
    assert "#pragma omp simd reduction(max:m)" in kept.source
    assert "if (x[r * cols + c] > m) m = x[r * cols + c];" in kept.source
    select = apply("omp_simd", parent, minmax="select")
    assert "m = x[r * cols + c] > m ? x[r * cols + c] : m;" in select.source
    maths = apply("approx_math", parent)
    assert "s += kf_exp_full(x[r * cols + c] - m);" in maths.source
    assert "y[r] = m + (float)kf_log_full(s);" in maths.source
    # `if (m < e) m = e;` is a max as well; an if with an else is no reduction
    flipped = parent.source.replace("if (x[r * cols + c] > m)", "if (m < x[r * cols + c])")
    assert "reduction(max:m)" in apply("omp_simd", kernel_of(flipped)).source
    with_else = parent.source.replace("m = x[r * cols + c];", "m = x[r * cols + c]; else m = 0;")
    assert "reduction(max:m)" not in apply("omp_simd", kernel_of(with_else)).source


def test_a_helper_name_the_user_took_is_refused() -> None:
    parent = kernel_of(
        "static inline float kf_exp_full(float x) { return x; }\n"
        "float expf(float);\n"
        "void kernel(const float *x, float *y, int64_t n) {\n"
        "    for (int64_t i = 0; i < n; ++i) y[i] = expf(x[i]);\n"
        "}\n"
    )
    assert refusal("approx_math", parent, function="expf") == "name_taken"
    with pytest.raises(Refuse):
        insert_helpers(CSource(parent.source), ["kf_exp_full"])


def test_tile_strip_mines_passes_that_may_run_block_by_block() -> None:
    parent = kernel_of(
        "void kernel(const float *a, const float *b, float *y, int64_t n) {\n"
        "    for (int64_t i = 0; i < n; ++i) y[i] = a[i] / (1.0f + a[i] * a[i]);\n"
        "    // then the gate\n"
        "    for (int64_t k = 0; k < n; ++k) {\n"
        "        y[k] *= b[k];\n"
        "    }\n"
        "}\n"
    )
    child = apply("tile", parent, mode="tile", block=1024)
    assert (
        "    for (int64_t kf_t0 = 0; kf_t0 < n; kf_t0 += 1024) {\n"
        "        const int64_t kf_tn = n - kf_t0 < 1024 ? n - kf_t0 : 1024;\n"
        "        for (int64_t i = kf_t0; i < kf_t0 + kf_tn; ++i) "
        "y[i] = a[i] / (1.0f + a[i] * a[i]);\n"
        "        // then the gate\n"
        "        for (int64_t k = kf_t0; k < kf_t0 + kf_tn; ++k) {\n"
        "            y[k] *= b[k];\n"
        "        }\n"
        "    }\n"
    ) in child.source
    for name in ("softmax", "l2norm", "layernorm"):
        assert refusal("tile", seed(name), mode="tile") == "no_tileable_passes"


def test_a_row_read_twice_goes_through_a_buffer_and_the_output_is_written_once() -> None:
    parent = seed("softmax")
    child = apply("tile", parent, mode="row_buffer", block=4096)
    assert "#include <stdlib.h>\n" in child.source
    assert "            kf_row_y[j] = e;\n" in child.source
    assert "y[r * cols + j] = kf_row_y[j] / (s);" in child.source
    assert "if (kf_row_y != kf_stack_y) free(kf_row_y);" in child.source
    assert child.source.count("y[r * cols + j]") == 1
    assert refusal("tile", seed("l2norm"), mode="row_buffer") == "no_row_read_twice"


def test_fuse_joins_adjacent_loops_over_one_range_unless_one_needs_the_others_result() -> None:
    parent = kernel_of(
        "void kernel(const float *x, float *y, int64_t rows, int64_t cols) {\n"
        "    for (int64_t r = 0; r < rows; ++r) {\n"
        "        float s = 0.0f, t = 0.0f;\n"
        "        for (int64_t j = 0; j < cols; ++j) s += x[r * cols + j];\n"
        "        for (int64_t k = 0; k < cols; ++k) {\n"
        "            const float v = x[r * cols + k];\n"
        "            t += v * v;\n"
        "        }\n"
        "        y[r * cols] = s + t;\n"
        "    }\n"
        "}\n"
    )
    child = apply("fuse", parent)
    assert (
        "        for (int64_t j = 0; j < cols; ++j) {\n"
        "            s += x[r * cols + j];\n"
        "            const float v = x[r * cols + j];\n"
        "            t += v * v;\n"
        "        }\n"
    ) in child.source
    assert refusal("fuse", seed("softmax")) == "no_fusable_loops"
    assert refusal("fuse", apply("omp_simd", parent).as_parent("s")) == "no_fusable_loops"


def test_nontemporal_streams_write_only_rows_and_chunks_of_a_flat_output() -> None:
    parent = seed("l2norm")
    child = apply("nontemporal", parent)
    assert "        kf_stream_row(y + (r * cols), cols);\n    }\n}" in child.source
    assert render("kf_stream_row") == STREAM_ROW and STREAM_ROW.rstrip() in child.source
    assert refusal("nontemporal", seed("softmax")) == "no_write_only_output"
    assert refusal("nontemporal", seed("swiglu")) == "whole_array"
    parallel = apply("omp_simd", apply("omp_parallel", seed("swiglu"), threads=2).as_parent("p"))
    chunked = apply("nontemporal", parallel.as_parent("s"), chunk=1024)
    assert (
        "#pragma omp parallel for schedule(static) num_threads(2)\n"
        "    for (int64_t kf_c0 = 0; kf_c0 < n; kf_c0 += 1024) {\n"
        "        const int64_t kf_cn = n - kf_c0 < 1024 ? n - kf_c0 : 1024;\n"
        "#pragma omp simd\n"
        "        for (int64_t i = kf_c0; i < kf_c0 + kf_cn; ++i) "
    ) in chunked.source
    assert "        kf_stream_row(y + kf_c0, kf_cn);\n" in chunked.source
    assert refusal("nontemporal", child.as_parent("c")) == "already_streamed"


def test_compiler_flags_choose_among_the_allowed_flags_and_keep_the_others() -> None:
    parent = apply("omp_parallel", seed("l2norm"))
    child = apply("compiler_flags", parent.as_parent("p"), math="fast", vector_width=256)
    assert child.source == parent.source and child.diff == ""
    assert child.flags == (
        "-O3",
        "-march=native",
        "-ffast-math",
        "-mprefer-vector-width=256",
        "-fopenmp",
    )
    assert (
        refusal("compiler_flags", seed("l2norm"), arch="generic", vector_width=512)
        == "needs_native"
    )
    assert (
        refusal("compiler_flags", kernel_of("void kernel(void) {}"), arch="generic") == "no_change"
    )


def test_crossover_takes_a_loop_or_a_function_of_the_second_parent() -> None:
    parallel = apply("omp_parallel", seed("softmax")).as_parent("a")
    fast = apply("approx_math", apply("omp_simd", seed("softmax")).as_parent("s")).as_parent("b")
    out = OPERATORS["crossover"].apply([parallel, fast], {"unit": "loop", "index": 2}, CTX)
    assert isinstance(out, Variation)
    assert "#pragma omp parallel for schedule(static)\n" in out.source
    assert "#pragma omp simd reduction(+:s)\n" in out.source
    assert "const float e = kf_exp_full(x[r * cols + j] - m);" in out.source
    assert (
        out.source.count("#pragma omp simd") == 1
        and "static inline float kf_exp_full" in out.source
    )
    assert out.flags == ("-O3", "-fopenmp", "-fno-trapping-math")
    whole = OPERATORS["crossover"].apply([parallel, fast], {"unit": "function"}, CTX)
    assert isinstance(whole, Variation) and "omp parallel" not in whole.source
    missing = OPERATORS["crossover"].apply([parallel, fast], {"unit": "function", "index": 1}, CTX)
    assert isinstance(missing, Refusal) and missing.reason == "no_such_unit"
    same = OPERATORS["crossover"].apply([parallel, parallel], {}, CTX)
    assert isinstance(same, Refusal) and same.reason == "parents_identical"


def test_comments_and_formatting_outside_the_edits_survive_every_operator() -> None:
    parent = seed("softmax")
    for name, op in OPERATORS.items():
        if op.arity != 1:
            continue
        out = op.apply([parent], {}, CTX)
        if isinstance(out, Variation):
            title = "/* Softmax over each row in three passes: the max, exp and its sum, the"
            assert title + " scaling. */\nvoid kernel(" in out.source, name
            assert "  // one exp per element\n" in out.source, name
