"""The CPU back end: compiler cache, static stage, guarded arena buffers, host calibration."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from gpu_workers.calibration_cache import contended_path, is_quiet
from gpu_workers.compile_failure import CompileFailure
from gpu_workers.cpu import compile_root, toolchain
from gpu_workers.cpu.arena import PAGE, Arena, guard_ranges, layout
from gpu_workers.cpu.backend import CpuBackend
from gpu_workers.cpu.build import CompiledKernel, compile_kernel
from gpu_workers.cpu.calibrate import calibration_path, llc_bytes, load_or_calibrate
from gpu_workers.cpu.static import source_check, static_check
from gpu_workers.cpu.toolchain import bad_flags
from gpu_workers.results import HostCalibration
from kernels.builtin import BUILTIN
from tests.cpu_support import EXAMPLES, FLAGS, calibration, kf_cache, planted

__all__ = ["calibration", "kf_cache"]
PROTOTYPE = BUILTIN["softmax"].c_signature()


def test_the_compile_cache_is_keyed_by_source_and_flags(tmp_path: Path) -> None:
    source = (EXAMPLES / "softmax.c").read_text()
    first = compile_kernel(source, FLAGS, prototype=PROTOTYPE, cache_dir=tmp_path)
    again = compile_kernel(source, FLAGS, prototype=PROTOTYPE, cache_dir=tmp_path)
    other_flags = compile_kernel(
        source, ("-O2", "-fopenmp"), prototype=PROTOTYPE, cache_dir=tmp_path
    )
    other_source = compile_kernel(source + "\n", FLAGS, prototype=PROTOTYPE, cache_dir=tmp_path)
    assert isinstance(first, CompiledKernel) and not first.cache_hit
    assert isinstance(again, CompiledKernel) and again.cache_hit
    assert again.library == first.library
    assert isinstance(other_flags, CompiledKernel) and not other_flags.cache_hit
    assert isinstance(other_source, CompiledKernel) and not other_source.cache_hit
    assert len({first.library, other_flags.library, other_source.library}) == 3
    assert Path(first.library).is_file()


def test_a_wrong_signature_is_a_compile_error(tmp_path: Path) -> None:
    source = "#include <stdint.h>\nvoid kernel(float *x, int64_t n) { x[0] = (float)n; }\n"
    result = compile_kernel(source, FLAGS, prototype=PROTOTYPE, cache_dir=tmp_path)
    assert isinstance(result, CompileFailure)
    assert result.reason == "compile_error"
    assert "conflicting types for 'kernel'" in result.log


def test_flags_are_allowlisted() -> None:
    assert bad_flags(("-O3", "-march=native", "-fopenmp", "-ffast-math", "-DTILE=64")) == []
    assert bad_flags(("-fplugin=x.so", "-Wl,-rpath,/tmp", "@opts", "-o", "-B/tmp")) == [
        "-fplugin=x.so",
        "-Wl,-rpath,/tmp",
        "@opts",
        "-o",
        "-B/tmp",
    ]


def test_static_stage_allows_math_memory_and_openmp_only(tmp_path: Path) -> None:
    ok = compile_kernel(
        (EXAMPLES / "softmax.c").read_text(), FLAGS, prototype=PROTOTYPE, cache_dir=tmp_path
    )
    assert isinstance(ok, CompiledKernel)
    assert static_check(ok) is None
    assert any(s.startswith("GOMP_") for s in ok.undefined_symbols)
    sleepy = compile_kernel(
        planted("sleeps_with_usleep"), FLAGS, prototype=PROTOTYPE, cache_dir=tmp_path
    )
    assert isinstance(sleepy, CompiledKernel)
    rejection = static_check(sleepy)
    assert rejection is not None and rejection.reason == "forbidden_symbol"
    assert rejection.evidence["forbidden"] == "usleep"
    nameless = compile_kernel(
        "#include <stdint.h>\nvoid helper(void) {}\n",
        FLAGS,
        prototype=PROTOTYPE,
        cache_dir=tmp_path,
    )
    assert isinstance(nameless, CompiledKernel)
    missing = static_check(nameless)
    assert missing is not None and missing.reason == "missing_entry_point"


STATEFUL_SOURCE = """
#include <stdint.h>
static const float table[4] = {1, 2, 3, 4};          /* read-only: allowed */
static const float *const rows[2] = {table, table + 2};  /* .data.rel.ro: writable */
int calls;
static float previous[8];
__attribute__((tls_model("initial-exec"))) _Thread_local int64_t seen;
__attribute__((section("kf_hidden"))) float hidden = 1.0f;
float *last = (float[]){0.0f};
void kernel(const float *x, float *y, int64_t rows_, int64_t cols) {
    static int64_t inner;
    for (int64_t i = 0; i < rows_ * cols; ++i) y[i] = x[i] * rows[i & 1][i & 1];
    y[0] += previous[(calls + 1) & 7];
    previous[calls & 7] = y[0] + hidden + *last;
    calls += 1; seen += cols; inner += rows_;
}
"""


def test_variables_that_outlive_a_call_are_refused_but_constant_tables_are_not(
    tmp_path: Path,
) -> None:
    stateful = compile_kernel(STATEFUL_SOURCE, FLAGS, prototype=PROTOTYPE, cache_dir=tmp_path)
    assert isinstance(stateful, CompiledKernel)
    rejection = static_check(stateful)
    assert rejection is not None
    assert (rejection.stage, rejection.reason) == ("static", "kernel_state")
    named = {entry.split(" (")[0] for entry in stateful.static_storage}
    assert {"calls", "previous", "seen", "hidden", "last", "rows"} <= named
    assert any(name.startswith("inner") for name in named)  # a function's static
    assert "table" not in named
    assert "previous (.bss, 32 bytes)" in rejection.evidence["static_storage"]
    assert ".tbss [WAT, NOBITS, 8 bytes]: seen" in rejection.evidence["writable_sections"]


def test_buffers_sit_between_guard_pages_at_varied_offsets_with_canaries_around() -> None:
    rng = np.random.default_rng(0)
    starts = set()
    for _ in range(20):
        (slot,) = layout([(3, 7)], 4, rng)
        assert slot.offset % 64 == 0 and slot.start <= slot.offset
        assert slot.offset + slot.nbytes <= slot.end
        assert (slot.start % PAGE, slot.end % PAGE) == (0, 0)
        starts.add(slot.offset - slot.start)
    assert len(starts) > 5  # where a buffer starts in its pages varies
    arena = Arena(slot.end + PAGE)
    assert (slot.start - PAGE, PAGE) in guard_ranges([slot])
    arena.fill_canaries([slot])
    arena.floats(slot)[...] = 1.0
    assert arena.damaged(slot) is None
    arena.bytes[slot.offset - 1] = 0
    assert arena.damaged(slot) == "before"
    arena.fill_canaries([slot])
    arena.bytes[slot.offset + slot.nbytes] = 0
    assert arena.damaged(slot) == "after"
    arena.close()


def test_calibration_measures_real_ceilings_once(
    calibration: HostCalibration, kf_cache: Path
) -> None:
    assert calibration.llc_bytes == llc_bytes() > 0
    assert calibration.memory_bandwidth_gbs > 1.0
    assert calibration.peak_fp32_gflops == max(
        calibration.sgemm_gflops, calibration.fma_peak_gflops
    )
    assert calibration.sgemm_gflops > 1.0
    assert calibration.streaming_stores
    assert calibration.host_contention_cores is not None
    if is_quiet(calibration):
        assert calibration_path(kf_cache).is_file()
        assert load_or_calibrate(kf_cache) == calibration  # from the cache, not measured again
    else:  # measured while other work ran: kept beside the quiet file for a few minutes
        # (whether a quiet one exists depends on what other xdist workers measured since;
        # test_calibration.py proves a contended one never becomes it)
        assert contended_path(calibration_path(kf_cache)).is_file()
        assert "kept for minutes only" in calibration.method


@pytest.mark.slow
def test_recalibration_agrees_with_the_cached_figures(
    tmp_path: Path, calibration: HostCalibration
) -> None:
    fresh = load_or_calibrate(tmp_path, force=True)  # measured afresh, beside the shared cache
    assert 0.5 < fresh.memory_bandwidth_gbs / calibration.memory_bandwidth_gbs < 2


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ('#include "/etc/passwd"', "forbidden_include"),
        ("#include <../../etc/passwd>", "forbidden_include"),
        ('__asm__(".incbin \\"/etc/passwd\\"");', "forbidden_construct"),
    ],
)
def test_sources_cannot_make_the_compiler_read_other_files(line: str, reason: str) -> None:
    rejection = source_check(f"#include <stdint.h>\n{line}\n")
    assert rejection is not None
    assert (rejection.stage, rejection.reason) == ("static", reason)
    assert source_check((EXAMPLES / "matmul.c").read_text()) is None


def test_concurrent_compiles_of_one_kernel_share_the_cache(tmp_path: Path) -> None:
    source = (EXAMPLES / "rmsnorm.c").read_text()
    prototype = BUILTIN["rmsnorm"].c_signature()
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(
            pool.map(
                lambda _: compile_kernel(source, FLAGS, prototype=prototype, cache_dir=tmp_path),
                range(4),
            )
        )
    assert all(isinstance(r, CompiledKernel) for r in results)
    assert len({r.library for r in results if isinstance(r, CompiledKernel)}) == 1
    again = compile_kernel(source, FLAGS, prototype=prototype, cache_dir=tmp_path)
    assert isinstance(again, CompiledKernel) and again.cache_hit


def test_a_compile_sets_up_the_compilers_root_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 33 (cost): a cold compile confines the compiler once, scanning the source and
    compiling it in the same mount namespace (the static stage reads that scan); a cached
    build needs none. It took three: the static scan, the build's scan and the compile."""
    if compile_root.unavailable() is not None:
        pytest.skip(f"this host cannot confine a compile: {compile_root.unavailable()}")
    set_ups: list[list[str]] = []
    real = toolchain.confined

    def counted(
        argv: list[str], work: Path, **options: str | None
    ) -> tuple[list[str], dict[str, str]]:
        set_ups.append(argv)
        return real(argv, work, **options)

    monkeypatch.setattr(toolchain, "confined", counted)
    backend = CpuBackend(cache_dir=tmp_path / "cpu-kernels")
    source = f"// {tmp_path.name}\n" + (EXAMPLES / "softmax.c").read_text()
    built = backend.compile(BUILTIN["softmax"], source, FLAGS)
    assert built.build is not None and not built.cache_hit, built.rejection
    assert len(set_ups) == 1, set_ups
    again = backend.compile(BUILTIN["softmax"], source, FLAGS)
    assert again.cache_hit and len(set_ups) == 1
    refused = backend.compile(BUILTIN["softmax"], planted("static_include_macro"), FLAGS)
    assert refused.rejection is not None and refused.rejection.stage == "static"
    assert len(set_ups) == 2
