"""The CUDA compile and static stages: nvcc builds, the ptxas report, the static rules.

Tests that build need nvcc (KFACTORY_NVCC or on PATH) and are skipped without it; none
needs a GPU. Planted kernels live in tests/planted/cuda_*.cu.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import msgspec
import pytest

from gpu_workers.compile_failure import CompileFailure
from gpu_workers.cuda.arch import ARCHES, UnknownArch, limits_for, registers_per_block
from gpu_workers.cuda.backend import CudaBackend
from gpu_workers.cuda.nvcc import CudaBuild, bad_flags, compile_cuda, nvcc_path
from gpu_workers.cuda.ptxas import parse_ptx, parse_ptxas_report, report_lines
from gpu_workers.cuda.static import source_check, static_check
from gpu_workers.results import Rejection
from kernels.builtin import BUILTIN
from kernels.cuda_launch import LaunchError, parse_launch_plan

SOFTMAX = BUILTIN["softmax"]
PLANTED = Path(__file__).parent / "planted"
SHAPES = (*SOFTMAX.test_shapes, SOFTMAX.default_shape)

needs_nvcc = pytest.mark.skipif(
    nvcc_path() is None, reason="nvcc not found (set KFACTORY_NVCC or put nvcc on PATH)"
)

GOOD = r"""
#include <stdint.h>
#include <cuda_fp16.h>
// kf-launch: kf_softmax(x, y, rows, cols) grid=(rows) block=(256)
static __device__ float block_sum(float v, float *shared) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) shared[threadIdx.x >> 5] = v;
    __syncthreads();
    float total = 0.0f;
    for (int w = 0; w < (int)(blockDim.x >> 5); ++w) total += shared[w];
    __syncthreads();
    return total;
}
static __device__ float block_max(float v, float *shared) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if ((threadIdx.x & 31) == 0) shared[threadIdx.x >> 5] = v;
    __syncthreads();
    float m = shared[0];
    for (int w = 1; w < (int)(blockDim.x >> 5); ++w) m = fmaxf(m, shared[w]);
    __syncthreads();
    return m;
}
extern "C" __global__ void __launch_bounds__(256)
kf_softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    __shared__ float shared[32];
    const float *xr = x + blockIdx.x * cols;
    float m = -INFINITY;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, xr[c]);
    m = block_max(m, shared);
    float s = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) s += expf(xr[c] - m);
    s = block_sum(s, shared);
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
        y[blockIdx.x * cols + c] = expf(xr[c] - m) / s;
}
"""

# nvcc 13.0 for sm_90 (the first two functions) and sm_80 (cmem), plus the older form of
# the Used line (no barriers, two constant banks) and a device function called from two
# kernels, reported after each.
PTXAS_SAMPLE = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'kf_spills' for 'sm_90'
ptxas info    : Function properties for kf_spills
    808 bytes stack frame, 1872 bytes spill stores, 1872 bytes spill loads
ptxas info    : Used 64 registers, used 0 barriers, 808 bytes cumulative stack size
ptxas info    : Compile time = 57.180 ms
ptxas info    : Compiling entry function 'kf_softmax' for 'sm_90'
ptxas info    : Function properties for kf_softmax
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 17 registers, used 1 barriers, 384 bytes smem
ptxas info    : Compile time = 3.169 ms
ptxas info    : Compiling entry function 'kf_a' for 'sm_80'
ptxas info    : Function properties for kf_a
    128 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, used 0 barriers, 128 bytes cumulative stack size, \
368 bytes cmem[0]
ptxas info    : Compile time = 2.547 ms
ptxas info    : Function properties for _Z6helperPfi
    16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Compiling entry function 'kf_old' for 'sm_80'
ptxas info    : Function properties for kf_old
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 1 register, 356 bytes cmem[0], 4 bytes cmem[2]
ptxas info    : Function properties for _Z6helperPfi
    16 bytes stack frame, 0 bytes spill stores, 12 bytes spill loads
"""

PTX_SAMPLE = """\
.extern .func  (.param .b32 func_retval0) vprintf
(
\t.param .b64 vprintf_param_0,
\t.param .b64 vprintf_param_1
)
;
.global .align 4 .u32 kf_calls;
.global .align 4 .b8 __cudart_i2opi_f[24] = {65, 144, 67, 60, 153, 149, 98, 219};
.global .align 1 .b8 _ZN30_INTERNAL_0de81f8f_4_t_cu_clut4cuda3std3__45__cpo5beginE[1];
.extern .shared .align 16 .b8 row[];

.visible .entry kf_lb(
\t.param .u64 kf_lb_param_0,
\t.param .u64 kf_lb_param_1
)
.maxntid 256, 1, 1
.minnctapersm 2
{
\tmov.u64 \t%rd2, %globaltimer;
\tmov.u64 \t%rd3, %clock64;
\tld.global.u32 \t%r1, [kf_calls];
}
.visible .entry kf_p(
\t.param .align 8 .b8 kf_p_param_0[16],
\t.param .u32 kf_p_param_1,
\t.param .u64 .ptr .global .align 4 kf_p_param_2
)
{
}
.visible .entry kf_empty()
{
}
"""


def planted(name: str) -> str:
    return (PLANTED / f"{name}.cu").read_text()


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cuda-cache")


def build(
    source: str,
    cache: Path,
    flags: tuple[str, ...] = ("-O3",),
    arch: str = "sm_90",
    dtype: str = "fp32",
) -> CudaBuild:
    result = compile_cuda(source, flags, problem=SOFTMAX, dtype=dtype, arch=arch, cache_dir=cache)
    assert isinstance(result, CudaBuild), result
    return result


def rejection(source: str, cache: Path, arch: str = "sm_90") -> Rejection:
    built = build(source, cache, arch=arch)
    found = static_check(built, parse_launch_plan(source, SOFTMAX), shapes=SHAPES)
    assert found is not None
    assert found.stage == "static"
    return found


# Without nvcc ------------------------------------------------------------------------


def test_the_ptxas_report_is_read_per_function() -> None:
    by_name = {r.kernel: r for r in parse_ptxas_report(PTXAS_SAMPLE)}
    assert list(by_name) == ["kf_spills", "kf_softmax", "kf_a", "kf_old", "_Z6helperPfi"]
    spills = by_name["kf_spills"]
    assert (spills.registers, spills.stack_frame_bytes) == (64, 808)
    assert (spills.spill_store_bytes, spills.spill_load_bytes) == (1872, 1872)
    assert spills.shared_bytes == 0 and spills.entry
    softmax = by_name["kf_softmax"]
    assert (softmax.registers, softmax.barriers, softmax.shared_bytes) == (17, 1, 384)
    assert softmax.constant_bytes == 0 and softmax.max_threads_per_block is None
    assert (by_name["kf_a"].registers, by_name["kf_a"].constant_bytes) == (40, 368)
    assert (by_name["kf_old"].registers, by_name["kf_old"].constant_bytes) == (1, 360)
    helper = by_name["_Z6helperPfi"]
    assert not helper.entry and helper.registers == 0
    # reported after each caller: the largest figures are kept
    assert (helper.spill_store_bytes, helper.spill_load_bytes) == (8, 12)
    lines = report_lines(PTXAS_SAMPLE, "kf_softmax").splitlines()
    assert lines[0].endswith("Compiling entry function 'kf_softmax' for 'sm_90'")
    assert lines[-1].endswith("Used 17 registers, used 1 barriers, 384 bytes smem")


def test_the_ptx_gives_signatures_bounds_and_what_the_code_reaches() -> None:
    facts = parse_ptx(PTX_SAMPLE)
    entries = {e.name: e for e in facts.entries}
    assert entries["kf_lb"].param_bytes == (8, 8)
    assert entries["kf_lb"].max_threads == (256, 1, 1)
    assert entries["kf_p"].param_bytes == (16, 4, 8)
    assert entries["kf_empty"].param_bytes == ()
    assert facts.extern_functions == ("vprintf",)
    assert [g.name for g in facts.global_variables] == [
        "kf_calls",
        "__cudart_i2opi_f",
        "_ZN30_INTERNAL_0de81f8f_4_t_cu_clut4cuda3std3__45__cpo5beginE",
    ]
    assert facts.special_registers == ("%clock64", "%globaltimer")


def test_arch_limits() -> None:
    assert set(ARCHES) >= {"sm_80", "sm_86", "sm_89", "sm_90"}
    assert limits_for("sm_90").max_shared_per_block_optin == 232448
    assert limits_for("sm_80").max_shared_per_block_optin == 166912
    assert limits_for("sm_86").max_shared_per_block_optin == 101376
    with pytest.raises(UnknownArch, match="sm_75"):
        limits_for("sm_75")
    h100 = limits_for("sm_90")
    assert registers_per_block(h100, 64, 1024) == 65536  # the most a full block may use
    assert registers_per_block(h100, 65, 1024) == 32 * 2304  # rounded up per warp


def test_flags_are_allowlisted(tmp_path: Path) -> None:
    ok = ("-O3", "--use_fast_math", "-maxrregcount=64", "-lineinfo", "-DTILE=64", "--ftz=true")
    assert bad_flags(ok) == []
    refused = ("-arch=sm_80", "-gencode", "-I/etc", "-L/tmp", "-lcuda", "-o", "-x", "-ccbin")
    assert bad_flags((*refused, "-maxrregcount=999", "-Xptxas", "-G")) == [
        *refused,
        "-maxrregcount=999",
        "-Xptxas",
        "-G",
    ]
    result = compile_cuda(GOOD, ("-O3", "-I/etc"), problem=SOFTMAX, dtype="fp32")
    assert isinstance(result, CompileFailure)
    assert result.reason == "bad_flags" and "-I/etc" in result.message


def test_launch_lines_and_dtype_are_checked_before_compiling() -> None:
    no_launch = GOOD.replace("// kf-launch:", "// launch:")
    result = compile_cuda(no_launch, ("-O3",), problem=SOFTMAX, dtype="fp32")
    assert isinstance(result, CompileFailure) and result.reason == "bad_launch"
    assert "declares no launch" in result.message
    unknown_arg = GOOD.replace("kf_softmax(x, y, rows, cols) grid", "kf_softmax(x, z) grid")
    result = compile_cuda(unknown_arg, ("-O3",), problem=SOFTMAX, dtype="fp32")
    assert isinstance(result, CompileFailure) and result.reason == "bad_launch"
    assert "unknown arguments ['z']" in result.message
    result = compile_cuda(GOOD, ("-O3",), problem=SOFTMAX, dtype="fp64")
    assert isinstance(result, CompileFailure) and result.reason == "unsupported_dtype"


def test_a_missing_nvcc_says_how_to_name_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KFACTORY_NVCC", "/nonexistent/nvcc")
    result = compile_cuda(GOOD, ("-O3",), problem=SOFTMAX, dtype="fp32")
    assert isinstance(result, CompileFailure)
    assert result.reason == "no_compiler"
    assert "KFACTORY_NVCC" in result.message and "/nonexistent/nvcc" in result.message


@pytest.mark.parametrize(
    "line",
    [
        '#include "kernel.h"',
        "#include </etc/passwd>",
        "#include <../../etc/passwd>",
        "#include KF_HEADER",
        "#include_next <stdint.h>",
        "#import <stdint.h>",
        '#embed "/etc/passwd"',
        '# /* a comment */ include "/etc/passwd"',
        '%:include "/etc/passwd"',
        '#\\\ninclude "/etc/passwd"',
        "#include <stdio.h>",
        'asm(".incbin \\"/etc/passwd\\"");',
    ],
)
def test_source_check_refuses_reading_files(line: str) -> None:
    found = source_check(f"#include <stdint.h>\n{line}\n{GOOD}")
    assert found is not None and found.stage == "static"
    assert found.reason in {"forbidden_include", "forbidden_construct"}


def test_source_check_allows_the_listed_headers() -> None:
    headers = ["cuda_bf16.h", "mma.h", "cooperative_groups.h", "cooperative_groups/reduce.h"]
    source = "".join(f"#include <{h}>\n" for h in headers) + GOOD
    assert source_check(source) is None


def test_a_planted_include_is_refused_before_nvcc_runs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    source = planted("cuda_includes_host_file")
    found = source_check(source)
    assert found is not None and found.reason == "forbidden_include"
    assert "/etc/passwd" in found.evidence["directive"]
    monkeypatch.setenv("KFACTORY_NVCC", "/nonexistent/nvcc")  # the include check comes first
    outcome = CudaBackend(cache_dir=tmp_path, arch="sm_90").compile(SOFTMAX, source, ("-O3",))
    assert outcome.build is None and outcome.rejection is not None
    assert (outcome.rejection.stage, outcome.rejection.reason) == ("static", "forbidden_include")


# With nvcc ---------------------------------------------------------------------------


@needs_nvcc
def test_a_good_kernel_builds_and_passes_the_static_stage(cache: Path) -> None:
    built = build(GOOD, cache)
    assert Path(built.cubin).is_file() and Path(built.ptx).is_file()
    assert Path(built.source).read_text() == GOOD
    assert built.arch == "sm_90" and built.dtype == "fp32" and built.flags == ("-O3",)
    (res,) = [r for r in built.resources if r.entry]
    assert res.kernel == "kf_softmax"
    assert 0 < res.registers <= 255
    assert res.shared_bytes == 32 * 4  # the __shared__ float[32]
    assert res.barriers >= 1
    assert res.max_threads_per_block == 256  # from __launch_bounds__, read from the PTX
    assert res.spill_store_bytes == res.spill_load_bytes == 0
    assert "Compiling entry function 'kf_softmax' for 'sm_90'" in built.log
    assert [e.param_bytes for e in built.entries] == [(8, 8, 8, 8)]
    assert static_check(built, parse_launch_plan(GOOD, SOFTMAX), shapes=SHAPES) is None


@needs_nvcc
def test_the_build_cache_is_keyed_by_source_flags_arch_and_dtype(tmp_path: Path) -> None:
    first = build(GOOD, tmp_path)
    again = build(GOOD, tmp_path)
    assert not first.cache_hit and again.cache_hit
    assert again.cubin == first.cubin
    assert msgspec.structs.replace(again, cache_hit=False) == first
    others = [
        build(GOOD, tmp_path, flags=("-O3", "--use_fast_math")),
        build(GOOD + "\n", tmp_path),
        build(GOOD, tmp_path, arch="sm_80"),
        build(GOOD, tmp_path, dtype="bf16"),
    ]
    assert not any(o.cache_hit for o in others)
    assert len({first.cubin, *(o.cubin for o in others)}) == 5
    # a cache entry whose cubin is gone is built again
    os.unlink(first.cubin)
    rebuilt = build(GOOD, tmp_path)
    assert not rebuilt.cache_hit and Path(rebuilt.cubin).is_file()


@needs_nvcc
def test_concurrent_compiles_of_one_source_all_succeed(tmp_path: Path) -> None:
    with ThreadPoolExecutor(4) as pool:
        results = list(
            pool.map(
                lambda _: compile_cuda(
                    GOOD, ("-O2",), problem=SOFTMAX, dtype="fp32", cache_dir=tmp_path
                ),
                range(4),
            )
        )
    assert all(isinstance(r, CudaBuild) for r in results), results
    builds = [r for r in results if isinstance(r, CudaBuild)]
    assert len({b.cubin for b in builds}) == 1
    assert Path(builds[0].cubin).read_bytes()[:4] == b"\x7fELF"
    (meta,) = tmp_path.glob("*/*/meta.json")
    assert msgspec.json.decode(meta.read_bytes(), type=CudaBuild).cubin == builds[0].cubin
    assert not list(tmp_path.glob("*/build-*"))  # no temporary build folders left


@needs_nvcc
def test_a_compile_error_carries_the_log(tmp_path: Path) -> None:
    source = GOOD.replace("float s = 0.0f;", "float s = undefined_thing;")
    result = compile_cuda(source, ("-O3",), problem=SOFTMAX, dtype="fp32", cache_dir=tmp_path)
    assert isinstance(result, CompileFailure)
    assert result.reason == "compile_error"
    assert 'identifier "undefined_thing" is undefined' in result.message
    assert "kernel.cu(" in result.message
    assert "1 error detected" in result.log


@needs_nvcc
def test_a_compile_past_the_time_limit_is_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("gpu_workers.cuda.nvcc.COMPILE_TIMEOUT_S", 0.05)
    result = compile_cuda(GOOD, ("-O3",), problem=SOFTMAX, dtype="fp32", cache_dir=tmp_path)
    assert isinstance(result, CompileFailure)
    assert result.reason == "compile_timeout"
    assert not list(tmp_path.glob("*/build-*"))


@needs_nvcc
def test_spills_are_refused_with_the_ptxas_figures(cache: Path) -> None:
    source = planted("cuda_spills")
    found = rejection(source, cache)
    assert found.reason == "register_spill"
    ptxas = parse_ptxas_report(build(source, cache).log)
    (res,) = [r for r in ptxas if r.kernel == "kf_softmax"]
    assert res.spill_store_bytes > 0 and res.registers <= 64
    assert found.evidence["kernel"] == "kf_softmax"
    assert found.evidence["spill_store_bytes"] == str(res.spill_store_bytes)
    assert found.evidence["spill_load_bytes"] == str(res.spill_load_bytes)
    assert found.evidence["registers"] == str(res.registers)
    assert f"{res.spill_store_bytes} bytes spill stores" in found.evidence["ptxas"]


@needs_nvcc
def test_static_shared_memory_over_48_kib_is_a_ptxas_compile_error(cache: Path) -> None:
    result = compile_cuda(
        planted("cuda_static_smem_overflow"),
        ("-O3",),
        problem=SOFTMAX,
        dtype="fp32",
        cache_dir=cache,
    )
    assert isinstance(result, CompileFailure)
    assert result.reason == "compile_error"
    assert "uses too much shared data" in result.message
    assert "0x40000 bytes, 0xc000 max" in result.log  # 256 KiB asked, 48 KiB allowed


@needs_nvcc
def test_dynamic_shared_memory_over_the_arch_limit_is_refused(cache: Path) -> None:
    source = planted("cuda_dynamic_smem_overflow")
    found = rejection(source, cache)
    assert found.reason == "shared_memory_exceeded"
    assert found.evidence["dynamic_shared_bytes"] == "240000"
    assert found.evidence["limit_total"] == "232448"
    assert found.evidence["arch"] == "sm_90"
    # the same kernel asking for 200000 bytes fits sm_90 but not sm_86 (99 KiB)
    smaller = source.replace("smem=240000", "smem=200000")
    assert static_check(build(smaller, cache), parse_launch_plan(smaller, SOFTMAX)) is None
    on_ampere = rejection(smaller, cache, arch="sm_86")
    assert on_ampere.reason == "shared_memory_exceeded"
    assert on_ampere.evidence["limit_total"] == "101376"


@needs_nvcc
@pytest.mark.parametrize(
    ("name", "reason", "words"),
    [
        ("cuda_missing_kernel", "missing_entry_point", "kf_softmax_rows"),
        ("cuda_not_extern_c", "missing_entry_point", 'extern "C"'),
        ("cuda_int_dims", "signature_mismatch", "[8, 8, 4, 4]"),
        ("cuda_calls_printf", "forbidden_symbol", "vprintf"),
        ("cuda_reads_globaltimer", "forbidden_construct", "%globaltimer"),
        ("cuda_stops_after_warmup", "forbidden_construct", "kf_calls"),
        ("cuda_exceeds_launch_bounds", "launch_bounds", "__launch_bounds__ of 128"),
        ("cuda_too_many_registers", "too_many_registers", "1024 threads"),
    ],
)
def test_planted_kernels_are_refused_at_the_static_stage(
    cache: Path, name: str, reason: str, words: str
) -> None:
    found = rejection(planted(name), cache)
    assert found.reason == reason
    assert words in found.message + str(found.evidence)


@needs_nvcc
def test_too_many_registers_evidence(cache: Path) -> None:
    found = rejection(planted("cuda_too_many_registers"), cache)
    registers = int(found.evidence["registers"])
    assert registers > 64  # more than 1024 threads a block can have each
    assert int(found.evidence["registers_per_block"]) > 65536
    assert f"Used {registers} registers" in found.evidence["ptxas"]


@needs_nvcc
def test_a_block_size_over_the_dims_is_checked_at_the_given_shapes(cache: Path) -> None:
    source = planted("cuda_exceeds_launch_bounds").replace("block=(256)", "block=(min(cols, 512))")
    built = build(source, cache)
    plan = parse_launch_plan(source, SOFTMAX)
    assert static_check(built, plan) is None  # no shapes: the block is unknown, not checked
    found = static_check(built, plan, shapes=SHAPES)
    assert found is not None and found.reason == "launch_bounds"
    assert int(found.evidence["threads_per_block"]) > 128
    assert "cols" in found.evidence["shape"]


def test_a_size_function_named_but_not_called_is_refused_when_parsed() -> None:
    for size in ("min", "cdiv(max, 2)", "rows + cdiv"):
        source = GOOD.replace("grid=(rows)", f"grid=({size})")
        with pytest.raises(LaunchError, match="without calling it"):
            parse_launch_plan(source, SOFTMAX)
    assert parse_launch_plan(GOOD.replace("grid=(rows)", "grid=(min(rows, 8))"), SOFTMAX)
