"""The row templates that can reach the memory limit (softmax, rmsnorm, layernorm, the fused
chain): every pass structure compiles, the explicit AVX-512 path compiles with -mavx512f
and is searched only on a host that has it, streaming stores write only what nothing reads
again, and points of every structure pass the factory's verifier."""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from gpu_workers.cpu.backend import CpuBackend
from gpu_workers.verification import verify
from kernels.builtin import BUILTIN
from kernels.design_space import InvalidParams, ParamValue, Template
from kernels.host_isa import host_cpu_flags
from kernels.templates import TEMPLATES
from tests.cpu_support import cpu_backend, kf_cache

__all__ = ["cpu_backend", "kf_cache"]

ROW_TEMPLATES = ("softmax_rows", "rmsnorm_rows", "layernorm_rows", "residual_rmsnorm_gelu_fused")
STRUCTURE = ("fuse", "buffer", "tile", "streaming", "intermediate", "gelu")


def one_point_per_structure(template: Template) -> list[dict[str, ParamValue]]:
    """The first valid point of each combination of the structural parameters."""
    names = [n for n in STRUCTURE if n in template.space()]
    found: dict[tuple[object, ...], dict[str, ParamValue]] = {}
    for point in template.valid_points():
        found.setdefault(tuple(point[n] for n in names), dict(point))
    return list(found.values())


def compile_object(source: str, flags: tuple[str, ...], folder: Path, name: str) -> str:
    """gcc's errors for `source` built with `flags` at -O0 (a quick check of the source: the
    verification tests build at the point's own optimisation level)."""
    src = folder / f"{name}.c"
    src.write_text(source)
    quick = [f for f in flags if not f.startswith("-O") and f != "-funroll-loops"]
    proc = subprocess.run(
        ["gcc", *quick, "-O0", "-fPIC", "-Wall", "-Wno-psabi", "-c", str(src), "-o", f"{src}.o"],
        capture_output=True,
        text=True,
        check=False,
    )
    return proc.stderr if proc.returncode else ""


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_the_avx512_path_compiles_with_avx512f_and_refuses_to_build_without(
    tmp_path: Path,
) -> None:
    """Rendered past the host restriction (this host may lack AVX-512): it must build for
    AVX-512 even where it cannot run. Every other structure is built by the verification
    tests below."""
    jobs: list[tuple[str, str, tuple[str, ...]]] = []
    for name in ROW_TEMPLATES:
        template = TEMPLATES[name]
        explicit = {**template.best_known, "isa": "avx512", "simdlen": 16}
        rendered = template.generate(explicit, "fp32")
        assert "_mm512_" in rendered.source and "__m512" in rendered.source
        jobs.append((f"{name}-avx512", rendered.source, (*rendered.flags, "-mavx512f")))
    chain = TEMPLATES["residual_rmsnorm_gelu_fused"]
    for gelu in ("exp2_poly5", "exp2_poly4"):
        point = {**chain.best_known, "isa": "avx512", "simdlen": 16, "gelu": gelu}
        rendered = chain.generate(point, "fp32")
        assert "_mm512_rcp14_ps" in rendered.source
        jobs.insert(0, (f"chain-{gelu}-avx512", rendered.source, (*rendered.flags, "-mavx512f")))
    plain = tuple(f for f in jobs[-1][2] if f not in ("-mavx512f", "-march=native"))
    jobs.append(("plain", jobs[-1][1], plain))
    with ThreadPoolExecutor(max_workers=2) as pool:
        errors = list(pool.map(lambda j: compile_object(j[1], j[2], tmp_path, j[0]), jobs))
    assert errors[:-1] == [""] * (len(jobs) - 1)
    assert "explicit AVX-512 path" in errors[-1]


def test_the_avx512_path_is_searched_only_on_a_host_that_has_it() -> None:
    has = "avx512f" in host_cpu_flags()
    for name in ROW_TEMPLATES:
        template = TEMPLATES[name]
        wide = {**template.best_known, "isa": "avx512", "simdlen": 16}
        assert template.is_valid(wide) == has, name
        assert not template.is_valid({**wide, "simdlen": 8})
        offered = {p["isa"] for p in template.valid_points()}
        assert offered == ({"portable", "avx512"} if has else {"portable"})


AVX2_HOST = frozenset({"sse4_2", "avx", "avx2", "fma", "f16c", "bmi2"})
"""The flags of an AVX2-only host (a 2-core AMD EPYC, say): no avx512f."""


def test_an_avx2_host_is_never_offered_an_avx512_point(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("kernels.templates.host_has", lambda feature: feature in AVX2_HOST)
    for name in ROW_TEMPLATES:
        template = TEMPLATES[name]
        assert {p["isa"] for p in template.valid_points()} == {"portable"}, name
        assert not template.is_valid({**template.best_known, "isa": "avx512", "simdlen": 16})


def test_streaming_stores_only_where_nothing_reads_the_output_again() -> None:
    softmax = TEMPLATES["softmax_rows"]
    into_output = {**softmax.defaults, "fuse": "none", "buffer": False, "streaming": True}
    assert "streaming only to an untouched output" in softmax.violations(into_output)
    assert softmax.is_valid({**into_output, "buffer": True})
    assert softmax.is_valid({**into_output, "fuse": "online"})
    chain = TEMPLATES["residual_rmsnorm_gelu_fused"]
    assert not chain.is_valid({**chain.defaults, "intermediate": "output", "streaming": True})
    for name in ROW_TEMPLATES:
        template = TEMPLATES[name]
        for point in one_point_per_structure(template):
            if not point["streaming"]:
                continue
            source = template.render(point).source
            row_function = source[source.index("static void ") :]
            after_first_stream = row_function[
                row_function.index("v_stream(") : row_function.index("void kernel(")
            ]
            # after the first non-temporal store nothing reads the output row
            assert "v_load(y" not in after_first_stream, (name, point)
            assert not re.search(r"=[^;]*\byt?\[", after_first_stream), (name, point)


def test_one_point_of_each_row_template_off_its_best_known_verifies(
    cpu_backend: CpuBackend,
) -> None:
    others: dict[str, dict[str, ParamValue]] = {
        "softmax_rows": {
            "fuse": "online",
            "tile": 0,
            "streaming": True,
            "prefetch": 2,
            "exp": "exp2_4",
        },
        "rmsnorm_rows": {"simdlen": 16, "unroll": 1, "streaming": False, "threads": 1},
        "layernorm_rows": {"simdlen": 16, "unroll": 4, "prefetch": 0},
        "residual_rmsnorm_gelu_fused": {"intermediate": "recompute", "streaming": True},
    }
    for name, change in others.items():
        template = TEMPLATES[name]
        point = {**template.best_known, **change}
        rendered = template.render(point)
        verdict = verify(BUILTIN[template.problem], cpu_backend, rendered.source, rendered.flags)
        assert verdict.verified, (name, point, verdict.seed, verdict.rejection)


@pytest.mark.slow  # one verification per pass structure (the chain: 15 points, 210 s at load 11)
@pytest.mark.parametrize("name", ROW_TEMPLATES)
def test_every_pass_structure_of_the_row_templates_verifies(
    name: str, cpu_backend: CpuBackend
) -> None:
    template = TEMPLATES[name]
    exps = template.space().get("exp", ())
    for i, point in enumerate(one_point_per_structure(template)):
        if exps:  # softmax's exps in turn: each structure with one, every exp in several
            point = {**point, "exp": exps[i % len(exps)]}
        rendered = template.render(point)
        verdict = verify(BUILTIN[template.problem], cpu_backend, rendered.source, rendered.flags)
        assert verdict.verified, (name, point, verdict.seed, verdict.rejection)


PROBE = """
void probe(const float *d, float *out, int64_t n) {
    for (int64_t j = 0; j + KF_W <= n; j += KF_W) v_store(out + j, sm_exp(v_load(d + j)));
}
"""


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
@pytest.mark.parametrize("exp", ["cephes", "exp2_5", "exp2_4"])
def test_the_softmax_exps_are_close_to_exp_for_every_argument_a_softmax_gives_them(
    exp: str, tmp_path: Path
) -> None:
    """Each exp choice, called alone on d <= 0 (what the passes give it) under the point's
    -ffast-math: within 1e-5 of exp (the problem allows 1e-4), NaN stays NaN, and -inf
    gives a value below the problem's atol."""
    template = TEMPLATES["softmax_rows"]
    rendered = template.render({**template.best_known, "exp": exp})
    src = tmp_path / "probe.c"
    src.write_text(rendered.source + PROBE)
    obj, lib = tmp_path / "probe.o", tmp_path / "probe.so"
    subprocess.run(["gcc", *rendered.flags, "-fPIC", "-c", str(src), "-o", str(obj)], check=True)
    # linked without -ffast-math: its crtfastmath.o would flush denormals in this process,
    # and so in every test that runs after this one in it
    subprocess.run(["gcc", "-shared", "-fopenmp", str(obj), "-o", str(lib), "-lm"], check=True)
    fn = ctypes.CDLL(str(lib)).probe
    d = np.concatenate(
        [np.linspace(-87.0, 0.0, 100_000, dtype=np.float32), [0.0, -0.0, -1e-30, np.nan]]
    ).astype(np.float32)
    d = np.concatenate([d, np.full(-len(d) % 16, -np.inf, dtype=np.float32)])
    out = np.zeros_like(d)
    fn(d.ctypes.data_as(ctypes.c_void_p), out.ctypes.data_as(ctypes.c_void_p), len(d))
    finite = np.isfinite(d)
    exact = np.exp(d[finite].astype(np.float64))
    assert np.max(np.abs(out[finite] - exact) / exact) < 1e-5
    assert np.isnan(out[np.isnan(d)]).all()
    assert (out[np.isneginf(d)] < 1e-30).all() and (out[np.isneginf(d)] >= 0).all()


MAX_MIN_PROBE = """
void probe(const float *a, const float *b, float *hi, float *lo, int64_t n) {
    for (int64_t j = 0; j + KF_W <= n; j += KF_W) {
        v_store(hi + j, v_max(v_load(a + j), v_load(b + j)));
        v_store(lo + j, v_min(v_load(a + j), v_load(b + j)));
    }
}
"""


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
@pytest.mark.parametrize("simdlen", [8, 16])
def test_vector_max_and_min_are_a_greater_than_b_then_a_else_b(
    simdlen: int, tmp_path: Path
) -> None:
    """v_max(a, b) is a > b ? a : b and v_min(a, b) is a < b ? a : b, bit for bit, under
    the factory's NaN-keeping flags: a NaN in either place, signed zeros, infinities (the
    exp clamps rely on a NaN second argument passing through)."""
    template = TEMPLATES["softmax_rows"]
    rendered = template.render({**template.best_known, "simdlen": simdlen})
    src = tmp_path / "probe.c"
    src.write_text(rendered.source + MAX_MIN_PROBE)
    obj, lib = tmp_path / "probe.o", tmp_path / "probe.so"
    flags = [*rendered.flags, "-fno-finite-math-only"]
    subprocess.run(["gcc", *flags, "-fPIC", "-c", str(src), "-o", str(obj)], check=True)
    subprocess.run(["gcc", "-shared", "-fopenmp", str(obj), "-o", str(lib)], check=True)
    special = np.array([np.nan, -np.inf, np.inf, 0.0, -0.0, 1.0, -1.0, 3e38], dtype=np.float32)
    a, b = (x.ravel() for x in np.meshgrid(special, special))
    a, b = np.tile(a, 2), np.tile(b, 2)  # 128 pairs: whole vectors of 8 and of 16
    hi, lo = np.zeros_like(a), np.zeros_like(a)
    pointers = [x.ctypes.data_as(ctypes.c_void_p) for x in (a, b, hi, lo)]
    ctypes.CDLL(str(lib)).probe(*pointers, ctypes.c_int64(len(a)))
    with np.errstate(invalid="ignore"):
        assert hi.tobytes() == np.where(a > b, a, b).tobytes()
        assert lo.tobytes() == np.where(a < b, a, b).tobytes()


def test_the_chains_cheapest_gelu_form_verifies(cpu_backend: CpuBackend) -> None:
    """2^t by a degree-4 polynomial and a reciprocal estimate (two AVX halves at simdlen
    16), under -ffast-math: within the problem's tolerance, NaN rows included. Every other
    gelu form is verified by the slow sweep of every structure (slow, above)."""
    template = TEMPLATES["residual_rmsnorm_gelu_fused"]
    point = {
        **template.best_known,
        "gelu": "exp2_poly4",
        "simdlen": 16,
        "flags": "-O3 -march=native -ffast-math",
    }
    assert template.is_valid(point)
    rendered = template.render(point)
    assert "v_gelu_fast(" in rendered.source and "v_recip(" in rendered.source
    verdict = verify(BUILTIN[template.problem], cpu_backend, rendered.source, rendered.flags)
    assert verdict.verified, (point, verdict.seed, verdict.rejection)


def test_a_point_recorded_before_a_parameter_existed_renders_the_kernel_it_did() -> None:
    """A store from before `prefetch_pass` holds softmax points without it: they render (a
    resumed campaign re-writes them) as the template rendered them then, prefetching in
    the output pass; a point missing a parameter that was there from the start is still
    refused."""
    template = TEMPLATES["softmax_rows"]
    point = {**template.best_known, "prefetch": 1, "prefetch_pass": "output"}
    recorded = {k: v for k, v in point.items() if k != "prefetch_pass"}
    assert template.render(recorded) == template.render(point)
    assert template.render(recorded) != template.render({**point, "prefetch_pass": "exp"})
    with pytest.raises(InvalidParams, match="missing parameter unroll"):
        template.render({k: v for k, v in recorded.items() if k != "unroll"})


def test_the_pipelined_sweep_keeps_two_row_buffers_and_one_block_of_rows() -> None:
    softmax = TEMPLATES["softmax_rows"]
    pipelined = {
        **softmax.best_known,
        "fuse": "pipelined",
        "buffer": True,
        "streaming": True,
        "prefetch_pass": "output",
    }
    assert softmax.is_valid(pipelined)
    for change in (
        {"buffer": False, "streaming": False},
        {"tile": 512},
        {"schedule": "dynamic"},
        {"prefetch_pass": "exp"},
    ):
        assert softmax.violations({**pipelined, **change}) == ["pipelined keeps two row buffers"]


@pytest.mark.parametrize("threads", [0, 2])
def test_a_pipelined_point_verifies_however_its_rows_split(
    threads: int, cpu_backend: CpuBackend
) -> None:
    """Each thread's block of rows, one row or none included (the verifier's shapes start
    at one row), with the stores streamed and the row two ahead prefetched."""
    softmax = TEMPLATES["softmax_rows"]
    point = {
        **softmax.best_known,
        "fuse": "pipelined",
        "buffer": True,
        "streaming": True,
        "prefetch": 2,
        "prefetch_pass": "output",
        "threads": threads,
    }
    rendered = softmax.render(point)
    verdict = verify(BUILTIN["softmax"], cpu_backend, rendered.source, rendered.flags)
    assert verdict.verified, (point, verdict.seed, verdict.rejection)
