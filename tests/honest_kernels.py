"""Honest C kernels for every built-in problem and for the rotary (RoPE) user problem of
`tests/problem_files.py`, for the error-scale tests: the example kernels as shipped
(`kernels/examples/`), two points of every CPU template (its defaults and its last valid
point, a far corner of the space: the most threads, the widest vectors, the most unroll,
the other flags), and per problem a plain scalar kernel written differently (double
accumulation, another order of the sums, the sigmoid or tanh form), as a user would."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

from gpu_workers.targets import target_of
from kernels.design_space import ParamValue, Template
from kernels.spec import Problem
from kernels.templates import templates_for
from tests.problem_files import ROTARY_KERNEL

EXAMPLES = Path(__file__).parent.parent / "kernels" / "examples"
FLAGS_LINE = re.compile(r"^//\s*kfactory-flags:\s*(.+?)\s*$", re.MULTILINE)
PLAIN_FLAGS = ("-O2", "-fopenmp")
ROTARY = "rotary"
"""The rotary (RoPE) user problem, loaded from the files `write_rotary` writes."""
ROPE = "rope"
"""The rotary problem judged by the default error scale over every distribution
(`rope`), where the user's own scale and narrower distributions are not needed."""
ROPE_INPUT_LIMIT = 1e18
"""Products of two inputs and their sums stay finite in fp32 (the issue's RoPE overflowed
to -inf where the exact result was 6.3e75: no fp32 kernel computes that)."""


@dataclass(frozen=True)
class HonestKernel:
    problem: str
    """A built-in problem's name, or ROTARY."""
    name: str
    source: str
    flags: tuple[str, ...]


def _example(problem: str) -> HonestKernel:
    source = (EXAMPLES / f"{problem}.c").read_text()
    found = FLAGS_LINE.search(source)
    assert found is not None, f"kernels/examples/{problem}.c has no kfactory-flags line"
    return HonestKernel(problem, "example", source, tuple(found.group(1).split()))


def last_valid_point(template: Template) -> dict[str, ParamValue]:
    """The last valid point in the order the space lists its choices: the far corner."""
    last: dict[str, ParamValue] | None = None
    for point in template.valid_points():
        last = point
    assert last is not None, f"{template.name} has no valid point"
    return last


def _template_points(problem: str) -> list[HonestKernel]:
    kernels = []
    for template in templates_for(problem, "cpu"):
        for label, point in (("defaults", template.defaults), ("last", last_valid_point(template))):
            rendered = template.render(point)
            kernels.append(
                HonestKernel(problem, f"{template.name}@{label}", rendered.source, rendered.flags)
            )
    return kernels


SOFTMAX_DOUBLE_SUM = """
#include <math.h>
#include <stdint.h>
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    #pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float m = xr[0];
        for (int64_t c = 1; c < cols; ++c) m = (xr[c] > m || isnan(xr[c])) ? xr[c] : m;
        double sum = 0.0;
        for (int64_t c = cols - 1; c >= 0; --c) sum += exp((double)xr[c] - (double)m);
        for (int64_t c = 0; c < cols; ++c) yr[c] = (float)(exp((double)xr[c] - (double)m) / sum);
    }
}
"""

RMSNORM_DOUBLE_SUM = """
#include <math.h>
#include <stdint.h>
void kernel(const float *x, const float *w, float *y, int64_t rows, int64_t cols) {
    #pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * cols;
        double squares = 0.0;
        for (int64_t c = 0; c < cols; ++c) squares += (double)xr[c] * xr[c];
        double inv = 1.0 / sqrt(squares / (double)cols + 1e-6);
        for (int64_t c = 0; c < cols; ++c) y[r * cols + c] = (float)(xr[c] * inv * w[c]);
    }
}
"""

LAYERNORM_DOUBLE_SUM = """
#include <math.h>
#include <stdint.h>
void kernel(const float *x, const float *w, const float *b, float *y, int64_t rows,
            int64_t cols) {
    #pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * cols;
        double sum = 0.0, squares = 0.0;
        for (int64_t c = cols - 1; c >= 0; --c) sum += xr[c];
        double mean = sum / (double)cols;
        for (int64_t c = 0; c < cols; ++c) squares += (xr[c] - mean) * (xr[c] - mean);
        double inv = 1.0 / sqrt(squares / (double)cols + 1e-5);
        for (int64_t c = 0; c < cols; ++c)
            y[r * cols + c] = (float)((xr[c] - mean) * inv * w[c] + b[c]);
    }
}
"""

GELU_TANHF = """
#include <math.h>
#include <stdint.h>
void kernel(const float *x, float *y, int64_t n) {
    #pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
        float v = x[i];
        y[i] = 0.5f * v * (1.0f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v)));
    }
}
"""

MATMUL_DOUBLE_DOT = """
#include <stdint.h>
void kernel(const float *A, const float *B, float *C, int64_t M, int64_t N, int64_t K) {
    #pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
            double dot = 0.0;
            for (int64_t k = K - 1; k >= 0; --k) dot += (double)A[i * K + k] * B[k * N + j];
            C[i * N + j] = (float)dot;
        }
}
"""

RESIDUAL_RMSNORM_GELU_SIGMOID = """
#include <math.h>
#include <stdint.h>
void kernel(const float *x, const float *r, const float *w, float *y, int64_t rows,
            int64_t cols) {
    #pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < rows; ++i) {
        double squares = 0.0;
        for (int64_t c = 0; c < cols; ++c) {
            double h = (double)x[i * cols + c] + r[i * cols + c];
            squares += h * h;
        }
        double inv = 1.0 / sqrt(squares / (double)cols + 1e-6);
        for (int64_t c = 0; c < cols; ++c) {
            double u = ((double)x[i * cols + c] + r[i * cols + c]) * inv * w[c];
            double t = 0.7978845608028654 * (u + 0.044715 * u * u * u);
            y[i * cols + c] = (float)(u / (1.0 + exp(-2.0 * t)));
        }
    }
}
"""

KDA_DOUBLE_STATE = """
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
void kernel(const float *q, const float *k, const float *v, const float *g, const float *beta,
            float *o, int64_t B, int64_t T, int64_t H, int64_t K, int64_t V) {
    #pragma omp parallel for schedule(dynamic)
    for (int64_t bh = 0; bh < B * H; ++bh) {
        const int64_t b = bh / H, h = bh % H;
        double *S = calloc((size_t)(K * V + V), sizeof(double));
        if (S == NULL) continue;
        double *kS = S + K * V;
        const double scale = 1.0 / sqrt((double)K);
        for (int64_t t = 0; t < T; ++t) {
            const int64_t row = (b * T + t) * H + h;
            const float *qt = q + row * K, *kt = k + row * K, *gt = g + row * K;
            const float *vt = v + row * V;
            for (int64_t e = 0; e < V; ++e) kS[e] = 0.0;
            for (int64_t a = 0; a < K; ++a) {
                const double decay = exp((double)gt[a]);
                for (int64_t e = 0; e < V; ++e) {
                    S[a * V + e] *= decay;
                    kS[e] += kt[a] * S[a * V + e];
                }
            }
            for (int64_t e = 0; e < V; ++e) kS[e] = beta[row] * (vt[e] - kS[e]);
            for (int64_t e = 0; e < V; ++e) {
                double out = 0.0;
                for (int64_t a = 0; a < K; ++a) {
                    S[a * V + e] += kt[a] * kS[e];
                    out += scale * qt[a] * S[a * V + e];
                }
                o[row * V + e] = (float)out;
            }
        }
        free(S);
    }
}
"""

ROTARY_DOUBLE = """
#include <stdint.h>
void kernel(const float *x, const float *cosines, const float *sines, float *y,
            int64_t rows, int64_t cols) {
    const int64_t half = cols / 2;
    for (int64_t i = 0; i < rows * half; ++i) {
        const int64_t r = i / half, j = i % half;
        const double a = x[r * cols + j], b = x[r * cols + j + half];
        y[r * cols + j] = (float)(a * cosines[i] - b * sines[i]);
        y[r * cols + j + half] = (float)(a * sines[i] + b * cosines[i]);
    }
}
"""

PLAIN: dict[str, tuple[str, str]] = {
    "softmax": ("scalar, double sum from the row's end", SOFTMAX_DOUBLE_SUM),
    "rmsnorm": ("scalar, double sum of squares", RMSNORM_DOUBLE_SUM),
    "layernorm": ("scalar, double two-pass sums", LAYERNORM_DOUBLE_SUM),
    "gelu": ("scalar tanhf in float", GELU_TANHF),
    "matmul": ("scalar, double dot products, k descending", MATMUL_DOUBLE_DOT),
    "residual_rmsnorm_gelu": (
        "scalar, double, sigmoid form of gelu",
        RESIDUAL_RMSNORM_GELU_SIGMOID,
    ),
    "kda": ("scalar, double state", KDA_DOUBLE_STATE),
    ROTARY: ("flat loop in double", ROTARY_DOUBLE),
    ROPE: ("flat loop in double", ROTARY_DOUBLE),
}


def rope(rotary: Problem) -> Problem:
    """ROPE: the rotary problem with the default error scale, every distribution (NaN and
    infinities propagate as in float64) and inputs within ROPE_INPUT_LIMIT."""
    return dataclasses.replace(
        rotary,
        name=ROPE,
        error_scale=None,
        supported_distributions=None,
        nonfinite="propagate",
        input_limit=ROPE_INPUT_LIMIT,
    )


def honest_kernels(problem: str) -> list[HonestKernel]:
    """Every honest kernel of `problem` (a built-in name, ROTARY or ROPE). The rotary
    example has no flags line: it is built as `kfactory check` builds it, with the
    target's default flags."""
    label, source = PLAIN[problem]
    plain = HonestKernel(problem, label, source, PLAIN_FLAGS)
    if problem in (ROTARY, ROPE):
        example = HonestKernel(problem, "example", ROTARY_KERNEL, target_of("cpu").default_flags)
        return [example, plain]
    return [_example(problem), *_template_points(problem), plain]
