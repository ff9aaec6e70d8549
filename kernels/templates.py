"""The kernel templates of every target, by name: the CPU ones here (jinja files in
`cpu_templates/`), the CUDA ones in `kernels.cuda_templates`; and the example kernels.

The CPU row templates that can reach the memory limit (`softmax_rows`, `rmsnorm_rows`,
`layernorm_rows`, `residual_rmsnorm_gelu_fused`) are written once over a vector layer
(`cpu_templates/_vec.c.j2`): `isa` portable (GCC vector extensions of `simdlen` floats,
lowered to what the flags enable; its max and min are spelled as MAXPS and MINPS at 8
floats on AVX, whose `a > b ? a : b` rule the compiler cannot see through the bitwise
form once NaNs are kept) or avx512 (explicit 512-bit intrinsics, `#error` without
AVX-512). Only avx512 includes `<immintrin.h>`: the portable path and the streaming
stores (`_common.c.j2`) call the compiler's x86 builtins, since parsing that header takes
most of a kernel's compile time. A restriction on the host's ISA (`kernels.host_isa`)
keeps avx512 out of the space where the CPU lacks avx512f. Every one has `unroll`
(vectors per step, and independent accumulators), `prefetch` (the row 0, 1 or 2 rows
ahead is prefetched to L2 while a row is worked from cache) and `streaming`
(non-temporal stores, for the final write only). The structure of the passes is a
parameter too:
- softmax: `fuse` (a max pass then exp, or online max and sum in one sweep, or pipelined:
  one row's output written in the sweep that makes the next row's exp values, so the
  stores overlap the arithmetic: on a 2-core AVX-512 Xeon, 4.63 ms at 4096x4096 against
  the buffered, streaming point's 5.11 ms, both avx512, in one `bench/softmax_limit.py
  --point` run), `buffer`
  (exp values in a per-thread row buffer that stays in L1/L2, or in the output row),
  `tile` (max and exp sweep tiles of 512 or 2048 floats, or the whole row),
  `prefetch_pass` (the row ahead is prefetched while the output is written, or during the
  exp sweep, the longest stretch of arithmetic: on a 2-core AVX2 EPYC the second made the
  best known point 1.13x and a buffered, streaming point 1.37x faster, `bench/softmax_limit.py
  --point`) and `exp` (the vector layer's Cephes exp, or
  2^(d log2 e) by a degree-5 or degree-4 polynomial and a truncating round: fewer
  operations, within the tolerance; the passes only take exp of d <= 0);
- layernorm has no one-sweep form (shifted float32 sums of squares cancel on rows with
  outliers, which the verifier rejects);
- the fused chain: `intermediate` (h = x + r kept in the output row, a row buffer, or
  recomputed) and `gelu` (the sigmoid form with the exp and a division, or 2^t by a
  degree-5/4 polynomial and a reciprocal estimate refined by one Newton step).
A restriction allows streaming only where nothing re-reads the output (a buffer, the
online sweep, a recomputed h): a non-temporal store to a line the row has just written
first evicts it. Each thread fences its non-temporal stores once, after its rows. Which
points are fast is left to the search.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kernels.cuda_templates import CUDA_TEMPLATES
from kernels.design_space import (
    Constraint,
    Param,
    Params,
    ParamValue,
    Rendered,
    Template,
    implied,
)
from kernels.host_isa import host_has

FLAG_CHOICES: tuple[str, ...] = (
    "-O3 -march=native",
    "-O3 -march=native -ffast-math",
    "-O2 -march=native -funroll-loops",
)


def _row_params(extra: tuple[Param, ...] = ()) -> tuple[Param, ...]:
    return (
        Param("threads", (0, 1, 2), "OpenMP threads over rows; 0 = all cores"),
        Param("schedule", ("static", "dynamic"), "OpenMP schedule of rows"),
        Param("simdlen", (8, 16), "floats per vector (omp simd simdlen and vector extensions)"),
        Param("unroll", (1, 2, 4), "unroll factor of the inner loops"),
        Param("streaming", (False, True), "non-temporal stores for the final output"),
        Param("prefetch", (0, 256, 1024), "software prefetch distance in floats (0 = off)"),
        Param("flags", FLAG_CHOICES, "compiler flags"),
        *extra,
    )


def _width_needs_avx512(p: Params) -> bool:
    return int(p["simdlen"]) <= 8 or "-march=native" in str(p["flags"])


def _one_thread(p: Params) -> bool:
    return int(p["threads"]) == 1


def _prefetch_beyond_unrolled_body(p: Params) -> bool:
    return int(p["prefetch"]) == 0 or int(p["prefetch"]) >= int(p["simdlen"]) * int(p["unroll"])


ROW_CONSTRAINTS: tuple[Constraint, ...] = (
    Constraint(
        "512-bit vectors need -march=native",
        "simdlen 16 assumes AVX-512 (or two AVX2 registers), which only -march=native enables",
        _width_needs_avx512,
    ),
    implied(
        "schedule only matters with threads",
        "a dynamic schedule on one thread is the static one with overhead",
        _one_thread,
        {"schedule": "static"},
    ),
    Constraint(
        "prefetch beyond the unrolled body",
        "a prefetch distance inside the current unrolled iteration fetches lines already loaded",
        _prefetch_beyond_unrolled_body,
    ),
)

_ROW_DEFAULTS: dict[str, ParamValue] = {
    "threads": 0,
    "schedule": "static",
    "simdlen": 16,
    "unroll": 2,
    "streaming": False,
    "prefetch": 0,
    "flags": "-O3 -march=native",
}
_ROW_BEST: dict[str, ParamValue] = {
    **_ROW_DEFAULTS,
    "streaming": True,
    "flags": "-O3 -march=native -ffast-math",
}


def _row_template(
    name: str, problem: str, file: str, algorithm: str, *, streams_output: bool = True
) -> Template:
    """`streams_output=False`: a kernel whose output is not a stream (KDA) has no streaming
    or prefetch parameters, so a planner does not search knobs that do nothing."""
    params = _row_params()
    constraints = ROW_CONSTRAINTS
    defaults, best = dict(_ROW_DEFAULTS), dict(_ROW_BEST)
    if not streams_output:
        params = tuple(p for p in params if p.name not in ("streaming", "prefetch"))
        constraints = ROW_CONSTRAINTS[:2]
        for point in (defaults, best):
            del point["streaming"], point["prefetch"]
    return Template(
        name=name,
        problem=problem,
        target="cpu",
        file=file,
        algorithm=algorithm,
        params=params,
        constraints=constraints,
        defaults=defaults,
        best_known=best,
    )


# The row kernels that can reach the memory limit (softmax, rmsnorm, layernorm, the fused
# chain): one vector layer (`_vec.c.j2`, portable or explicit AVX-512), the next rows
# prefetched while a row works out of cache, streaming stores for the final write only,
# and per kernel the structure of its passes.


def _stream_params() -> tuple[Param, ...]:
    return (
        Param("threads", (0, 1, 2), "OpenMP threads over rows; 0 = all cores"),
        Param("schedule", ("static", "dynamic"), "OpenMP schedule of rows"),
        Param("simdlen", (8, 16), "floats per vector"),
        Param(
            "isa",
            ("portable", "avx512"),
            "portable: GCC vector extensions, lowered to what the flags enable; avx512: "
            "explicit 512-bit intrinsics (16 floats, only on a host with AVX-512)",
        ),
        Param("unroll", (1, 2, 4), "vectors per loop step (and independent accumulators)"),
        Param(
            "streaming",
            (False, True),
            "non-temporal stores for the final write of the output, which nothing reads again",
        ),
        Param(
            "prefetch",
            (0, 1, 2),
            "prefetch the row this many rows ahead while a row is worked from cache (0 = off)",
        ),
        Param("flags", FLAG_CHOICES, "compiler flags"),
    )


def _explicit_avx512(p: Params) -> bool:
    return p["isa"] == "avx512"


def _avx512_on_this_host(p: Params) -> bool:
    return p["isa"] != "avx512" or host_has("avx512f")


STREAM_CONSTRAINTS: tuple[Constraint, ...] = (
    ROW_CONSTRAINTS[1],
    implied(
        "explicit AVX-512 is 16 floats wide",
        "isa avx512 works on __m512 registers: simdlen 16",
        _explicit_avx512,
        {"simdlen": 16},
    ),
    Constraint(
        "explicit AVX-512 only where the host has it",
        "isa avx512 needs a host whose CPU flags list avx512f (restriction on the host's ISA)",
        _avx512_on_this_host,
    ),
)


def _online(p: Params) -> bool:
    return p["fuse"] == "online"


def _pipelined(p: Params) -> bool:
    return p["fuse"] == "pipelined"


def _no_prefetch(p: Params) -> bool:
    return int(p["prefetch"]) == 0


def _softmax_streams_an_untouched_output(p: Params) -> bool:
    return not p["streaming"] or bool(p["buffer"]) or p["fuse"] == "online"


def _chain_streams_an_untouched_output(p: Params) -> bool:
    return not p["streaming"] or p["intermediate"] != "output"


def _stream_template(
    name: str,
    problem: str,
    file: str,
    algorithm: str,
    extra: tuple[Param, ...],
    constraints: tuple[Constraint, ...],
    shape_defaults: dict[str, ParamValue],
    best: dict[str, ParamValue],
    elsewhere: tuple[dict[str, ParamValue], ...] = (),
) -> Template:
    defaults: dict[str, ParamValue] = {
        "threads": 0,
        "schedule": "static",
        "simdlen": 8,
        "isa": "portable",
        "unroll": 2,
        "streaming": False,
        "prefetch": 0,
        "flags": "-O3 -march=native",
        **shape_defaults,
    }
    return Template(
        name=name,
        problem=problem,
        target="cpu",
        file=file,
        algorithm=algorithm,
        params=(*_stream_params(), *extra),
        constraints=(*STREAM_CONSTRAINTS, *constraints),
        defaults=defaults,
        best_known={**defaults, **best},
        known_elsewhere=tuple({**defaults, **best, **point} for point in elsewhere),
    )


SOFTMAX_ROWS = _stream_template(
    "softmax_rows",
    "softmax",
    "softmax_rows.c.j2",
    "per tile: max, then exp into a row buffer (or the output) and its sum; one scaling "
    "pass writes the output. Or online: one sweep for max and sum, then exp and scale",
    (
        Param(
            "fuse",
            ("none", "online", "pipelined"),
            "none: a max pass, then exp; online: max and sum in one sweep of x (running max, "
            "rescaled sum), exp computed again in the output pass; pipelined: as none, with "
            "two row buffers, the output of one row written in the sweep that makes the next "
            "row's exp values (its stores overlap that arithmetic)",
            added=("pipelined",),
        ),
        Param(
            "buffer",
            (False, True),
            "exp values kept in a per-thread row buffer (L1/L2) instead of the output row",
        ),
        Param(
            "tile",
            (0, 512, 2048),
            "max and exp sweep the row in tiles of this many floats, each still in L1 "
            "(0 = the whole row per sweep)",
        ),
        Param(
            "prefetch_pass",
            ("output", "exp"),
            "the pass that prefetches the row ahead: the output pass (while it writes) or the "
            "exp sweep (the longest stretch of arithmetic, so the next row's reads overlap it)",
            before="output",
        ),
        Param(
            "exp",
            ("cephes", "exp2_5", "exp2_4"),
            "the vector exp of the passes (arguments <= 0): cephes, the vector layer's "
            "degree-6 exp; exp2_5 / exp2_4, 2^(d log2 e) with a degree-5 / degree-4 "
            "polynomial and a truncating round (relative error 2.3e-7 / 2.7e-6, fewer ops)",
        ),
    ),
    (
        implied(
            "online keeps no buffer",
            "the online sweep stores nothing: buffer and tile belong to the other structures",
            _online,
            {"buffer": False, "tile": 0},
        ),
        implied(
            "pipelined keeps two row buffers",
            "the pipelined sweep keeps its rows' exp values in two whole-row buffers, takes "
            "each thread's rows as one block (the static schedule), and its one sweep both "
            "computes and writes (prefetch_pass output names it)",
            _pipelined,
            {"buffer": True, "tile": 0, "schedule": "static", "prefetch_pass": "output"},
        ),
        implied(
            "the prefetching pass needs a prefetch",
            "prefetch_pass exp moves the prefetch of the row ahead: without one it is the "
            "same kernel as prefetch_pass output",
            _no_prefetch,
            {"prefetch_pass": "output"},
        ),
        Constraint(
            "streaming only to an untouched output",
            "a non-temporal store to a line the row just wrote (exp values in the output) "
            "evicts it from cache first: stream only with a buffer or the online sweep",
            _softmax_streams_an_untouched_output,
        ),
    ),
    {"fuse": "none", "buffer": False, "tile": 0, "exp": "cephes", "prefetch_pass": "output"},
    # a fast point on a quiet 2-core AVX2 EPYC: 4.93 ms at 4096x4096 against Kernel
    # Tuner's best 7.08 ms in one run of bench/softmax_limit.py --point; buffer + streaming
    # was faster there still (4.69 ms) while the host's memory ran slow, so the search
    # decides
    {
        "unroll": 2,
        "prefetch": 1,
        "prefetch_pass": "exp",
        "exp": "exp2_4",
        "flags": "-O3 -march=native -ffast-math",
    },
    # on a quiet 2-core AVX-512 Xeon: 4.63 ms, against the buffered, streaming avx512
    # point's 5.11 ms and Kernel Tuner's best 8.25 ms in one run of bench/softmax_limit.py
    # --point (the portable pipelined point: 6.68 ms)
    (
        {
            "isa": "avx512",
            "simdlen": 16,
            "unroll": 4,
            "fuse": "pipelined",
            "buffer": True,
            "streaming": True,
            "prefetch_pass": "output",
        },
    ),
)

RMSNORM_ROWS = _stream_template(
    "rmsnorm_rows",
    "rmsnorm",
    "rmsnorm.c.j2",
    "sum of squares over the row, then a scale pass from cache",
    (),
    (),
    {},
    {"streaming": True, "prefetch": 1},
)

LAYERNORM_ROWS = _stream_template(
    "layernorm_rows",
    "layernorm",
    "layernorm.c.j2",
    "a mean sweep, a variance sweep from cache, then the output pass",
    (),
    (),
    {},
    # no one-sweep form: float32 sums of squares shifted by one element cancel on rows
    # with outliers, which the verifier rejects; the second sweep reads the row from cache
    {"streaming": True, "prefetch": 1},
)

RESIDUAL_RMSNORM_GELU_FUSED = _stream_template(
    "residual_rmsnorm_gelu_fused",
    "residual_rmsnorm_gelu",
    "residual_rmsnorm_gelu.c.j2",
    "per row: h = x + r and its sum of squares in one sweep, then gelu(h * inv * w)",
    (
        Param(
            "intermediate",
            ("output", "buffer", "recompute"),
            "where h = x + r waits for the scale: in the output row, in a per-thread row "
            "buffer (L1/L2), or recomputed from x and r (still in cache)",
        ),
        Param(
            "gelu",
            ("exp", "exp2_poly5", "exp2_poly4"),
            "the sigmoid form x / (1 + exp(-2u)): exp: kf_exp's degree-6 exp and a division; "
            "exp2_poly5 / exp2_poly4: 2^t by a degree-5 / degree-4 polynomial (relative error "
            "4e-7 / 7e-6) and a reciprocal estimate with one Newton step",
        ),
    ),
    (
        Constraint(
            "streaming only to an untouched output",
            "h kept in the output row is re-read: stream only with a buffer or recompute",
            _chain_streams_an_untouched_output,
        ),
    ),
    {"intermediate": "output", "gelu": "exp"},
    {"streaming": True, "prefetch": 1, "intermediate": "buffer"},
)


def _matmul_tiles_fit_l2(p: Params) -> bool:
    return (int(p["mc"]) * int(p["kc"]) + int(p["kc"]) * int(p["nc"])) * 4 <= 2 * 1024 * 1024


def _microkernel_registers(p: Params) -> bool:
    return int(p["mr"]) * (int(p["nr"]) // int(p["simdlen"])) <= 28


def _nr_multiple_of_width(p: Params) -> bool:
    return int(p["nr"]) % int(p["simdlen"]) == 0


MATMUL_BLOCKED = Template(
    name="matmul_blocked",
    problem="matmul",
    target="cpu",
    file="matmul_blocked.c.j2",
    algorithm="cache-blocked triple loop; the innermost loop runs along a row of B and C",
    params=(
        Param("threads", (0, 1, 2), "OpenMP threads over row blocks of C; 0 = all cores"),
        Param("schedule", ("static", "dynamic"), "OpenMP schedule of row blocks"),
        Param("simdlen", (8, 16), "floats per vector in the inner loop"),
        Param("mc", (32, 64, 128), "rows of A per block"),
        Param("nc", (256, 512, 1024), "columns of B per block"),
        Param("kc", (64, 128, 256), "depth per block"),
        Param("loop_order", ("ikj", "kij"), "order of the loops inside a block"),
        Param("unroll", (1, 2, 4), "unroll of the depth loop"),
        Param("flags", FLAG_CHOICES, "compiler flags"),
    ),
    constraints=(
        Constraint(
            "blocks fit in L2",
            "an A block plus a B block must fit in 2 MiB",
            lambda p: (
                (int(p["mc"]) * int(p["kc"]) + int(p["kc"]) * int(p["nc"])) * 4 <= 2 * 1024 * 1024
            ),
        ),
        ROW_CONSTRAINTS[0],
        ROW_CONSTRAINTS[1],
    ),
    defaults={
        "threads": 0,
        "schedule": "static",
        "simdlen": 16,
        "mc": 64,
        "nc": 512,
        "kc": 128,
        "loop_order": "ikj",
        "unroll": 1,
        "flags": "-O3 -march=native",
    },
    best_known={
        "threads": 0,
        "schedule": "dynamic",
        "simdlen": 16,
        "mc": 64,
        "nc": 512,
        "kc": 256,
        "loop_order": "ikj",
        "unroll": 4,
        "flags": "-O3 -march=native",
    },
)

MATMUL_PACKED = Template(
    name="matmul_packed",
    problem="matmul",
    target="cpu",
    file="matmul_packed.c.j2",
    algorithm="GotoBLAS style: pack B panels and A slivers, MR x NR register micro-kernel",
    params=(
        Param("threads", (0, 1, 2), "OpenMP threads over row blocks of C; 0 = all cores"),
        Param("schedule", ("static", "dynamic"), "OpenMP schedule of row blocks"),
        Param("simdlen", (8, 16), "floats per vector register"),
        Param("mr", (4, 6, 8, 12), "rows of the micro-tile"),
        Param("nr", (16, 32, 48), "columns of the micro-tile"),
        Param("mc", (48, 96, 192), "rows of A packed per block"),
        Param("kc", (128, 256, 384), "depth packed per block"),
        Param("nc", (480, 960, 1920), "columns of B packed per panel"),
        Param("prefetch", (0, 256, 1024), "prefetch distance into packed A, in floats (0 = off)"),
        Param("flags", FLAG_CHOICES, "compiler flags"),
    ),
    constraints=(
        Constraint("NR is a whole number of vectors", "nr % simdlen == 0", _nr_multiple_of_width),
        Constraint(
            "accumulators fit in registers",
            "mr * nr / simdlen vector accumulators must leave room in 32 registers",
            _microkernel_registers,
        ),
        Constraint(
            "mc is a multiple of mr", "mc % mr == 0", lambda p: int(p["mc"]) % int(p["mr"]) == 0
        ),
        Constraint(
            "nc is a multiple of nr", "nc % nr == 0", lambda p: int(p["nc"]) % int(p["nr"]) == 0
        ),
        Constraint(
            "packed blocks fit in L2", "A block + B panel slice <= 2 MiB", _matmul_tiles_fit_l2
        ),
        ROW_CONSTRAINTS[0],
        ROW_CONSTRAINTS[1],
    ),
    defaults={
        "threads": 0,
        "schedule": "static",
        "simdlen": 16,
        "mr": 6,
        "nr": 32,
        "mc": 96,
        "kc": 256,
        "nc": 960,
        "prefetch": 0,
        "flags": "-O3 -march=native",
    },
    best_known={
        "threads": 0,
        "schedule": "dynamic",
        "simdlen": 16,
        "mr": 12,
        "nr": 32,
        "mc": 96,
        "kc": 384,
        "nc": 960,
        "prefetch": 0,
        "flags": "-O3 -march=native",
    },
)


TEMPLATES: dict[str, Template] = {
    t.name: t
    for t in (
        SOFTMAX_ROWS,
        RMSNORM_ROWS,
        LAYERNORM_ROWS,
        _row_template("gelu_stream", "gelu", "gelu.c.j2", "elementwise, chunked over threads"),
        RESIDUAL_RMSNORM_GELU_FUSED,
        _row_template(
            "kda_recurrent",
            "kda",
            "kda_recurrent.c.j2",
            "state kept in cache, one (batch, head) pair per task",
            streams_output=False,
        ),
        MATMUL_BLOCKED,
        MATMUL_PACKED,
        *CUDA_TEMPLATES,
    )
}


def templates_for(problem: str, target: str = "cpu") -> list[Template]:
    return [t for t in TEMPLATES.values() if t.problem == problem and t.target == target]


EXAMPLE_TEMPLATES: dict[str, str] = {
    "softmax": "softmax_rows",
    "rmsnorm": "rmsnorm_rows",
    "layernorm": "layernorm_rows",
    "gelu": "gelu_stream",
    "matmul": "matmul_packed",
    "residual_rmsnorm_gelu": "residual_rmsnorm_gelu_fused",
    "kda": "kda_recurrent",
}
"""For each problem, the template whose best known point is its example kernel."""


def _hand_tuned(problem: str, target: str, dtype: str) -> Rendered | None:
    """The best hand-tuned kernel (`EXAMPLE_TEMPLATES`)."""
    name = EXAMPLE_TEMPLATES.get(problem)
    return TEMPLATES[name].render(TEMPLATES[name].best_known) if name else None


def _most_specialised(problem: str, target: str, dtype: str) -> Rendered | None:
    """The best known point (an unmeasured guess) of the last template written for
    `dtype`, the most specialised one, since a problem's templates are listed general
    first (cuda matmul: SIMT, then tensor cores for bf16 and fp16)."""
    fitting = [t for t in templates_for(problem, target) if t.accepts(dtype)]
    return fitting[-1].render(fitting[-1].best_known, dtype) if fitting else None


@dataclass(frozen=True)
class Examples:
    """Where a target's example kernels come from, and what they are."""

    kind: str
    """What an example kernel of this target is, in a few words."""
    choose: Callable[[str, str, str], Rendered | None]
    """(problem, target, dtype) to the example kernel, rendered; None: none."""


EXAMPLES: dict[str, Examples] = {
    "cpu": Examples("Example kernel", _hand_tuned),
    "cuda": Examples("Starting-point kernel (not yet measured)", _most_specialised),
}


def example_kernel(problem: str, target: str = "cpu", dtype: str = "fp32") -> Rendered | None:
    """The example kernel of a problem, rendered (`EXAMPLES`); None if it has none."""
    return EXAMPLES[target].choose(problem, target, dtype)


def example_file_text(
    problem: str, built_flags: Callable[[tuple[str, ...]], tuple[str, ...]]
) -> str:
    """The text of `kernels/examples/<problem>.c`: flags line (the point's flags as the
    CPU back end builds with them: `built_flags`), provenance, source."""
    rendered = example_kernel(problem)
    if rendered is None:
        raise KeyError(problem)
    template = TEMPLATES[EXAMPLE_TEMPLATES[problem]]
    return (
        f"// kfactory-flags: {' '.join(built_flags(rendered.flags))}\n"
        f"// {problem}: template {template.name} at {template.best_known}\n" + rendered.source
    )
