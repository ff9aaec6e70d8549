"""The CPU static stage judges the object by what it can do, never by what things are
called: writable or thread-local sections whatever their names, code run at load,
instructions a kernel never needs, the OpenMP runtime's settings, assembler however it is
spelled, and includes as the real preprocessor resolves them. Real compiler, no mocks."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from gpu_workers.compile_failure import CompileFailure
from gpu_workers.cpu import compile_root, source_scan
from gpu_workers.cpu.backend import CpuBackend
from gpu_workers.cpu.build import CompiledKernel, compile_kernel
from gpu_workers.cpu.object_facts import object_facts
from gpu_workers.cpu.source_scan import line_control_directives
from gpu_workers.cpu.static import source_check
from gpu_workers.cpu.toolchain import prelude
from gpu_workers.results import Rejection
from kernels.builtin import BUILTIN
from kernels.templates import TEMPLATES
from tests.cpu_support import EXAMPLES, FLAGS, PLANTED, planted

SOFTMAX = BUILTIN["softmax"]
PROTOTYPE = SOFTMAX.c_signature()
COPY = (
    "void kernel(const float *x, float *y, int64_t rows, int64_t cols) {\n"
    "    for (int64_t i = 0; i < rows * cols; ++i) y[i] = x[i];\n"
    "}\n"
)


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> CpuBackend:
    return CpuBackend(cache_dir=tmp_path_factory.mktemp("kf-static-cache"))


def _static(backend: CpuBackend, source: str, flags: tuple[str, ...] = FLAGS) -> Rejection | None:
    """The verifier's first two stages, as the back end runs them."""
    outcome = backend.compile(SOFTMAX, source, flags)
    if outcome.rejection is not None:
        return outcome.rejection
    return backend.static_check(SOFTMAX, outcome.build)


@pytest.mark.parametrize(
    ("name", "reason", "evidence"),
    [
        ("static_rodata_named_writable", "kernel_state", [".rodata.k [WA", "kf_cached_n"]),
        ("static_data_rel_ro_named", "kernel_state", [".data.rel.ro.x [WA", "kf_calls"]),
        ("static_omp_settings_as_storage", "forbidden_symbol", ["omp_set_num_threads"]),
        ("static_omp_settings_as_storage", "forbidden_symbol", ["omp_set_dynamic"]),
        ("static_constructor", "load_time_code", [".init_array [WA, INIT_ARRAY", "bytes]"]),
        ("static_ifunc", "load_time_code", ["kernel (GNU ifunc"]),
        ("static_rdtsc", "forbidden_instruction", ["rdtsc (clock) in kernel+0x"]),
        ("static_setcsr", "forbidden_instruction", ["ldmxcsr (floating-point state) in kernel+0x"]),
    ],
)  # fmt: skip
def test_what_the_object_can_do_is_refused_at_the_static_stage(
    backend: CpuBackend, name: str, reason: str, evidence: list[str]
) -> None:
    rejection = _static(backend, planted(name))
    assert rejection is not None, name
    assert (rejection.stage, rejection.reason) == ("static", reason)
    text = rejection.message + " ".join(rejection.evidence.values())
    for expected in evidence:
        assert expected in text, (expected, text)


def _object_of(source: str, work: Path) -> Path:
    """Compile straight to an object, as if the source check had let it through."""
    (work / "kernel.c").write_text(prelude(PROTOTYPE) + source)
    subprocess.run(
        ["cc", *FLAGS, "-fPIC", "-c", "kernel.c", "-o", "kernel.o"], cwd=work, check=True
    )
    return work / "kernel.o"


@pytest.mark.parametrize(
    ("name", "in_object"),
    [
        ("static_asm_lcomm", ("writable_sections", [".data [WA, 8 bytes]: kf_slot", ".bss [WA"])),
        ("static_syscall_asm", ("forbidden_instructions", ["syscall (system call) in kernel+0x"])),
    ],
)  # fmt: skip
def test_assembler_is_refused_in_the_source_and_what_it_makes_in_the_object(
    backend: CpuBackend, tmp_path: Path, name: str, in_object: tuple[str, list[str]]
) -> None:
    rejection = _static(backend, planted(name))
    assert rejection is not None
    assert (rejection.stage, rejection.reason) == ("static", "forbidden_construct")
    assert "__asm__ at kernel.c:" in rejection.evidence["assembler"]
    # compile_kernel itself never compiles it, whoever calls it
    failure = compile_kernel(planted(name), FLAGS, prototype=PROTOTYPE, cache_dir=tmp_path)
    assert isinstance(failure, CompileFailure) and failure.reason == "forbidden_construct"
    # and had it been compiled, the object itself gives it away
    field, expected = in_object
    found = "; ".join(getattr(object_facts(_object_of(planted(name), tmp_path), tmp_path), field))
    for entry in expected:
        assert entry in found, (entry, found)


@pytest.mark.parametrize(
    "trick",
    [
        # a macro pastes the keyword together
        '#define GLUE(a, b) a##b\n#define A GLUE(__as, m__)\nvoid f(void) { A("nop"); }\n',
        # a system header's macro does the pasting
        '#include <sys/cdefs.h>\nvoid f(void) { __CONCAT(__as, m__)("nop"); }\n',
        # the source declares itself a system header
        '#pragma GCC system_header\nvoid f(void) { __asm__("nop"); }\n',
        # a forged line marker pretends to enter a system header
        '# 1 "/usr/include/stdio.h" 1 3 4\nvoid f(void) { __asm__("nop"); }\n# 3 "kernel.c" 2\n',
        # a raw string literal must not hide what follows it
        'const char *s = R"x(")x"; void f(void) { asm("nop"); }\n',
        # an asm label renames a symbol (and could inject directives)
        'extern unsigned sleepy(unsigned) __asm__("usleep");\n',
    ],
)
def test_assembler_is_found_however_the_preprocessor_is_made_to_spell_it(trick: str) -> None:
    rejection = source_check("#include <stdint.h>\n" + trick + COPY, FLAGS, prototype=PROTOTYPE)
    assert rejection is not None, trick
    assert (rejection.stage, rejection.reason) == ("static", "forbidden_construct")


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ('# 1 "/usr/include/stdio.h" 1 3 4\n', True),
        ('%: 7 "kernel.c" 2\n', True),
        ("#/**/line 12\n", True),
        ("#li\\\nne 12\n", True),
        ("# \\  \n 3\n", True),
        ('int x; /*\n*/ # 1 "/usr/include/math.h" 1 3 4\n', True),
        ('#define S "a" /* spans\n lines */\n#1 "k.h"\n', True),
        ("#if __has_include(</*>)\n#endif\n# 2\n", True),
        ('const char *s = R"x(")x";\n', True),
        ('#include <stdint.h>\n// # 1 "x"\nconst char *s = "\\n# 1";\n/* # 2 */\n', False),
        ("#pragma omp parallel for\n#define TILE 64\n#if TILE > 2\n#endif\n", False),
    ],
)
def test_line_control_directives_are_found_however_spelled(source: str, found: bool) -> None:
    assert bool(line_control_directives(source)) is found, source


@pytest.mark.parametrize(
    "name_or_source",
    [
        "static_section_injection",
        # `#ident` is copied into the assembly too
        '#ident ".x\\n.inc" "bin \\"/etc/hostname\\""\n' + COPY,
    ],
)
def test_strings_passed_through_to_the_assembler_cannot_add_directives(
    backend: CpuBackend, tmp_path: Path, name_or_source: str
) -> None:
    source = (
        planted(name_or_source)
        if name_or_source.startswith("static_")
        else ("#include <stdint.h>\n" + name_or_source)
    )
    failure = compile_kernel(source, FLAGS, prototype=PROTOTYPE, cache_dir=tmp_path)
    assert isinstance(failure, CompileFailure) and failure.reason == "forbidden_construct"
    assert ".inc" in failure.message and failure.log == ""
    rejection = _static(backend, source)
    assert rejection is not None and rejection.reason == "forbidden_construct"


def test_debug_builds_of_honest_kernels_pass(backend: CpuBackend) -> None:
    for name in ("softmax", "matmul"):
        source = (EXAMPLES / f"{name}.c").read_text()
        outcome = backend.compile(BUILTIN[name], source, ("-O2", "-g", "-march=native", "-fopenmp"))
        assert outcome.rejection is None, outcome.rejection
        assert backend.static_check(BUILTIN[name], outcome.build) is None


def test_assembler_keywords_in_strings_and_comments_are_not_assembler(backend: CpuBackend) -> None:
    source = (
        '#include <stdint.h>\n// __asm__("syscall")\nstatic const char note[] = "__asm__ asm";\n'
        "static const char quote = '\"';\n" + COPY
    )
    assert source_check(source, FLAGS, prototype=PROTOTYPE) is None
    assert _static(backend, source) is None


def _file_lines(path: str) -> list[str]:
    return [ln.strip() for ln in Path(path).read_text().splitlines() if ln.strip()]


@pytest.mark.parametrize(
    ("name", "path"),
    [
        ("static_include_digraph", "/etc/passwd"),
        ("static_include_comment", "/etc/hostname"),
        ("static_include_splice", "/etc/passwd"),
        ("static_include_macro", "/etc/passwd"),
    ],
)
def test_includes_are_judged_by_the_real_preprocessor_and_nothing_they_say_is_reported(
    backend: CpuBackend, tmp_path: Path, name: str, path: str
) -> None:
    if not Path(path).is_file():
        pytest.skip(f"{path} is not on this host")
    lines = _file_lines(path)
    rejection = _static(backend, planted(name))
    assert rejection is not None
    assert (rejection.stage, rejection.reason) == ("static", "forbidden_include")
    assert path in rejection.evidence["includes"]
    failure = compile_kernel(planted(name), FLAGS, prototype=PROTOTYPE, cache_dir=tmp_path)
    assert isinstance(failure, CompileFailure) and failure.reason == "forbidden_include"
    reported = "\n".join(
        [rejection.message, *rejection.evidence.values(), failure.message, failure.log]
    )
    for line in lines:
        assert line not in reported, f"a line of {path} reached the report"


def test_a_compile_error_after_including_a_file_quotes_nothing_of_it(tmp_path: Path) -> None:
    """Even when the preprocessor is made to fail, only paths are reported."""
    source = '#include <stdint.h>\n#include "/etc/passwd"\n#error stop\n' + COPY
    failure = compile_kernel(source, FLAGS, prototype=PROTOTYPE, cache_dir=tmp_path)
    assert isinstance(failure, CompileFailure) and failure.reason == "forbidden_include"
    reported = failure.message + failure.log
    for line in _file_lines("/etc/passwd"):
        assert line not in reported


def test_compiler_logs_keep_only_the_kernels_own_lines(tmp_path: Path) -> None:
    source = "#include <stdint.h>\n#include <math.h>\nint sqrtf;\n" + COPY
    failure = compile_kernel(source, FLAGS, prototype=PROTOTYPE, cache_dir=tmp_path)
    assert isinstance(failure, CompileFailure) and failure.reason == "compile_error"
    assert failure.log and all(ln.startswith("kernel.c") for ln in failure.log.splitlines())
    assert "sqrtf" in failure.log


@pytest.mark.parametrize(
    ("source", "reason", "evidence"),
    [
        # a weak reference is still an import
        (
            "extern unsigned usleep(unsigned) __attribute__((weak));\n"
            "void kernel(const float *x, float *y, int64_t r, int64_t c) {\n"
            "    if (usleep) usleep(1);\n    for (int64_t i = 0; i < r * c; ++i) y[i] = x[i];\n}\n",
            "forbidden_symbol",
            "usleep",
        ),
        # bytes among the code, to be jumped into
        (
            'const unsigned char kf_code[] __attribute__((section(".text")))\n'
            "    = {0x0f, 0x05, 0xc3};\n" + COPY,
            "executable_data",
            "kf_code (.text, 3 bytes)",
        ),
        # the clock of the OpenMP runtime
        (
            "#include <omp.h>\n"
            "void kernel(const float *x, float *y, int64_t r, int64_t c) {\n"
            "    double t = omp_get_wtime();\n"
            "    for (int64_t i = 0; i < r * c; ++i) y[i] = t < 0 ? 0.0f : x[i];\n}\n",
            "forbidden_symbol",
            "omp_get_wtime",
        ),
        # a COMMON symbol
        (
            "__attribute__((common)) int kf_common;\n"
            "void kernel(const float *x, float *y, int64_t r, int64_t c) {\n"
            "    kf_common += 1;\n    for (int64_t i = 0; i < r * c; ++i) y[i] = x[i];\n}\n",
            "kernel_state",
            "kf_common (COMMON, 4 bytes)",
        ),
        # a thread-local in a custom section name
        (
            '__attribute__((section(".tdata.k"), tls_model("initial-exec")))\n'
            "_Thread_local int kf_seen = 1;\n"
            "void kernel(const float *x, float *y, int64_t r, int64_t c) {\n"
            "    kf_seen += 1;\n    for (int64_t i = 0; i < r * c; ++i) y[i] = x[i];\n}\n",
            "kernel_state",
            "kf_seen",
        ),
    ],
)
def test_more_of_each_class(backend: CpuBackend, source: str, reason: str, evidence: str) -> None:
    rejection = _static(backend, "#include <stdint.h>\n" + source)
    assert rejection is not None
    assert (rejection.stage, rejection.reason) == ("static", reason)
    assert evidence in rejection.message + " ".join(rejection.evidence.values())


def test_every_example_kernel_passes(backend: CpuBackend) -> None:
    for path in sorted(EXAMPLES.glob("*.c")):
        text = path.read_text()
        flags = tuple(text.splitlines()[0].split(":", 1)[1].split())
        problem = BUILTIN[path.stem]
        outcome = backend.compile(problem, text, flags)
        assert outcome.rejection is None, (path.name, outcome.rejection)
        assert backend.static_check(problem, outcome.build) is None, path.name


def test_template_points_pass(backend: CpuBackend) -> None:
    for template in TEMPLATES.values():
        if template.target != "cpu":
            continue
        rendered = template.render(template.defaults)
        outcome = backend.compile(BUILTIN[template.problem], rendered.source, rendered.flags)
        assert outcome.rejection is None, (template.name, outcome.rejection)
        build = outcome.build
        assert isinstance(build, CompiledKernel)
        assert backend.static_check(BUILTIN[template.problem], build) is None, template.name


def test_the_compile_cannot_tell_which_host_files_exist(tmp_path: Path) -> None:
    """Issue 33, class 7: `__has_include("/any/path")` is in no list of files read, and
    told the kernel which host files exist. The compiler now runs in a root that holds only
    its installation, the system headers and the kernel's source: every such path is
    absent, and the planted kernel compiles as though the host were empty."""
    result = compile_kernel(
        planted("static_has_include_host_path"), FLAGS, prototype=PROTOTYPE, cache_dir=tmp_path
    )
    if compile_root.unavailable() is None:
        assert isinstance(result, CompiledKernel), result
    else:  # the fallback: the source scan refuses the probe
        assert isinstance(result, CompileFailure) and result.reason == "forbidden_include"


def test_where_the_compile_cannot_be_confined_host_path_probes_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(source_scan, "unavailable", lambda: "no mount namespace (a test)")
    result = compile_kernel(
        planted("static_has_include_host_path"), FLAGS, prototype=PROTOTYPE, cache_dir=tmp_path
    )
    assert isinstance(result, CompileFailure) and result.reason == "forbidden_include", result
    assert "__has_include" in result.message and "/etc/passwd" in result.message
    assert source_scan.host_path_probes("__has_include(<stdint.h>)") == ()
    assert source_scan.host_path_probes("__has_include(P)")  # a macro could spell a path


def test_planted_static_kernels_are_all_exercised() -> None:
    here = Path(__file__).read_text()
    for path in PLANTED.glob("static_*.c"):
        assert f'"{path.stem}"' in here, path.stem
