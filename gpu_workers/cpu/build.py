"""Compile C kernels with the system compiler into shared objects, with a content-keyed cache.

The kernel is compiled after a prelude declaring the problem's exact prototype, so a
wrong signature is a compile error. The object is linked with a small support file that
wraps the allocator (`-Wl,--wrap`) so a refused allocation leaves a note on stderr.

Before anything is compiled the source goes through the real preprocessor once
(`scan_source`): the files it reads must all lie in the compiler's own system include
directories, and the kernel's own tokens (after macro expansion) may hold no assembler.
Only a source that passes is compiled, so the compiler never reads another file into its
log or the object. After compiling, the kernel's object is read for what it can do
(`ObjectFacts`): writable or thread-local sections, code run at load, data placed among
code, and the instructions it contains. The static stage (`static.py`) judges those.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import struct
import subprocess
import tempfile
from pathlib import Path

import msgspec

from gpu_workers.build_cache import cached_build
from gpu_workers.cache_root import cache_root
from gpu_workers.compile_failure import CompileFailure
from gpu_workers.compiler_process import run_compiler
from gpu_workers.sandbox_outcome import ALLOCATION_REFUSED_MARK

COMPILER = os.environ.get("KFACTORY_CC", "cc")
COMPILE_TIMEOUT_S = 60.0
COMPILER_ADDRESS_SPACE = 4 << 30
LOG_LIMIT = 8000
WRAPPED = ("malloc", "calloc", "realloc", "aligned_alloc", "posix_memalign")
KERNEL_FILE = "kernel.c"
DIAGNOSTIC_FLAGS = ("-fdiagnostics-color=never", "-fno-diagnostics-show-caret")
LINK_FLAGS = ("-Wl,-z,relro,-z,now,-z,noexecstack",)
"""Relocations resolved and made read-only at load; never an executable stack."""
PP_OUT = ("-o", "kernel.i")
CHECKS_VERSION = "object-facts-4"
"""Part of the cache key: a build recorded by older checks is checked again."""

_ALLOWED_FLAGS = re.compile(
    r"^(-O[0-3s]|-Ofast|-march=native|-mtune=native"
    r"|-m(sse4\.2|avx|avx2|fma|avx512f|avx512bw|avx512vl|avx512dq|f16c|bmi2)"
    r"|-mprefer-vector-width=(128|256|512)"
    r"|-f(no-)?(fast-math|unroll-loops|unroll-all-loops|tree-vectorize|tree-loop-vectorize"
    r"|tree-slp-vectorize|math-errno|trapping-math|signed-zeros|finite-math-only"
    r"|associative-math|reciprocal-math|prefetch-loop-arrays|omit-frame-pointer"
    r"|strict-aliasing|vect-cost-model)"
    r"|-fvect-cost-model=(unlimited|dynamic|cheap|very-cheap)"
    r"|-fopenmp|-fopenmp-simd|-g|-w|-Wall|-Wextra"
    r"|-D[A-Za-z_][A-Za-z0-9_]*(=[A-Za-z0-9_.+-]+)?)$"
)

SUPPORT_SOURCE = r"""
#include <stddef.h>
#include <stdio.h>
#include <unistd.h>
void *__real_malloc(size_t);
void *__real_calloc(size_t, size_t);
void *__real_realloc(void *, size_t);
void *__real_aligned_alloc(size_t, size_t);
int __real_posix_memalign(void **, size_t, size_t);
static void kf_note(const char *fn, size_t n) {
    char buf[160];
    int len = snprintf(buf, sizeof buf, "%s %s(%zu bytes)\n", "MARK", fn, n);
    if (len > 0) (void)!write(2, buf, (size_t)len);
}
void *__wrap_malloc(size_t n) {
    void *p = __real_malloc(n); if (!p && n) kf_note("malloc", n); return p; }
void *__wrap_calloc(size_t a, size_t b) {
    void *p = __real_calloc(a, b); if (!p && a && b) kf_note("calloc", a * b); return p; }
void *__wrap_realloc(void *q, size_t n) {
    void *p = __real_realloc(q, n); if (!p && n) kf_note("realloc", n); return p; }
void *__wrap_aligned_alloc(size_t a, size_t n) {
    void *p = __real_aligned_alloc(a, n); if (!p && n) kf_note("aligned_alloc", n); return p; }
int __wrap_posix_memalign(void **out, size_t a, size_t n) {
    int r = __real_posix_memalign(out, a, n); if (r && n) kf_note("posix_memalign", n); return r; }
""".replace("MARK", ALLOCATION_REFUSED_MARK)


class CompiledKernel(msgspec.Struct, frozen=True, kw_only=True):
    library: str
    """Path of the shared object."""
    source_sha256: str
    flags: tuple[str, ...]
    undefined_symbols: tuple[str, ...]
    """What the kernel's own object needs from outside (weak references included)."""
    defined_symbols: tuple[str, ...]
    writable_sections: tuple[str, ...]
    """Every section of the kernel's object that is writable or thread-local and not empty,
    whatever its name, as 'name [flags, type, N bytes]: its symbols'; and COMMON symbols.
    The state a kernel could carry from one call into the next."""
    static_storage: tuple[str, ...]
    """The variables in those sections (and COMMON ones), as 'name (section, N bytes)'."""
    load_time_code: tuple[str, ...]
    """Code that would run when the library is loaded or unloaded: init/fini arrays,
    .ctors/.dtors, .init/.fini, GNU ifunc resolvers, a defined _init/_fini."""
    executable_data: tuple[str, ...]
    """Variables placed in executable sections (bytes that could be jumped into)."""
    forbidden_instructions: tuple[str, ...]
    """Instructions a compute kernel never needs, as 'mnemonic in function+0xOFFSET'."""
    log: str
    cache_hit: bool


FINITE_MATH_FLAGS = frozenset({"-ffast-math", "-Ofast", "-ffinite-math-only"})
NAN_SAFE_FLAG = "-fno-finite-math-only"


def nan_safe(flags: tuple[str, ...]) -> tuple[str, ...]:
    """The flags a kernel is built with, verified and timed alike: its own, and
    `-fno-finite-math-only` last where one of them lets the compiler assume there is no
    NaN or infinity (-ffast-math, -Ofast, -ffinite-math-only). What a kernel does with
    non-finite input is judged (`Problem.nonfinite`); a flag must not license ignoring it.
    Reassociation, reciprocals and contraction stay allowed."""
    flags = tuple(flags)
    if not FINITE_MATH_FLAGS.intersection(flags) or (flags and flags[-1] == NAN_SAFE_FLAG):
        return flags
    return (*flags, NAN_SAFE_FLAG)


def source_sha256(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


def bad_flags(flags: tuple[str, ...]) -> list[str]:
    return [f for f in flags if not _ALLOWED_FLAGS.match(f)]


@functools.cache
def compiler_identity() -> str:
    try:
        out = subprocess.run(
            [COMPILER, "--version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unavailable: {exc}"
    return out.stdout.splitlines()[0] if out.stdout else "unknown"


@functools.cache
def system_include_dirs() -> tuple[str, ...]:
    """The directories the compiler searches for `#include <...>`, real paths, asked of
    the compiler itself (`cc -E -v -x c /dev/null`)."""
    try:
        out = subprocess.run(
            [COMPILER, "-E", "-v", "-x", "c", "/dev/null", "-o", "/dev/null"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
            stdin=subprocess.DEVNULL,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C"},  # no CPATH
        )
    except (OSError, subprocess.TimeoutExpired):
        return ()
    dirs, inside = [], False
    for line in out.stderr.splitlines():
        if line.startswith("#include <...> search starts here"):
            inside = True
        elif line.startswith("End of search list"):
            inside = False
        elif inside and line.startswith(" "):
            dirs.append(os.path.realpath(line.strip()))
    return tuple(dirs)


def default_cache_dir() -> Path:
    return cache_root() / "cpu-kernels"


def prelude(prototype: str) -> str:
    return f'#include <stdint.h>\n{prototype};\n#line 1 "{KERNEL_FILE}"\n'


def kernel_lines(log: str) -> str:
    """Only the diagnostics about the kernel's own file (or object): a compiler's log may
    otherwise quote other files it read."""
    keep = ("kernel.c:", "kernel.o:", "kernel.c(", "kernel.o(")
    return "\n".join(ln for ln in log.splitlines() if ln.startswith(keep) or "kernel.o" in ln)


# --- the preprocessor's view of a source ---------------------------------------------


class SourceScan(msgspec.Struct, frozen=True, kw_only=True):
    """What the real preprocessor found in a source (with the flags it is built with)."""

    outside_includes: tuple[str, ...] = ()
    """Files read that are not under the compiler's system include directories."""
    assembler: tuple[str, ...] = ()
    """`asm`, `__asm`, `__asm__` among the kernel's own tokens, as 'token at kernel.c:N'."""
    forged_line_markers: tuple[str, ...] = ()
    """Line markers the source wrote itself to pass its tokens off as a system header's."""
    failure: CompileFailure | None = None
    """The preprocessor failed (only the lines about kernel.c are kept)."""

    @property
    def clean(self) -> bool:
        return not (
            self.outside_includes or self.assembler or self.forged_line_markers or self.failure
        )


_HEADER_LINE = re.compile(r"^(\.+) (.+)$")
_MARKER = re.compile(r'^# (\d+) "((?:[^"\\]|\\.)*)"((?: \d+)*)\s*$')
_TOKEN = re.compile(
    r"""(?P<raw>(?:u8|u|U|L)?R"(?P<delim>[^()\\\s"]{0,16})\((?:.|\n)*?\)(?P=delim)")"""
    r"""|(?P<str>(?:u8|u|U|L)?"(?:[^"\\\n]|\\.)*")"""
    r"""|(?P<chr>(?:u8|u|U|L)?'(?:[^'\\\n]|\\.)*')"""
    r"""|(?P<num>\.?[0-9](?:[eEpP][+-]|[A-Za-z0-9_.$])*)"""
    r"""|(?P<id>[A-Za-z_$][A-Za-z0-9_$]*)"""
    r"""|(?P<nl>\n)"""
    r"""|(?P<other>.)""",
)
ASSEMBLER_KEYWORDS = frozenset({"asm", "__asm", "__asm__"})
_PREAMBLE_NAMES = frozenset({"<built-in>", "<command-line>"})


def scan_source(source: str, flags: tuple[str, ...], *, prototype: str) -> SourceScan:
    """Run the preprocessor on `source` as it will be compiled and report what it read and
    whether the kernel's own tokens hold assembler. Nothing any file says is reported."""
    forged = list(line_control_directives(source))
    with tempfile.TemporaryDirectory(prefix="kf-cpp-") as tmp:
        work = Path(tmp)
        (work / KERNEL_FILE).write_text(prelude(prototype) + source)
        code, out = run_compiler(
            [COMPILER, *flags, "-fPIC", *DIAGNOSTIC_FLAGS, "-H", "-E", KERNEL_FILE, *PP_OUT],
            work,
            timeout_s=COMPILE_TIMEOUT_S,
            address_space_bytes=COMPILER_ADDRESS_SPACE,
        )
        if code is None:
            return SourceScan(
                failure=CompileFailure(
                    reason="compile_timeout",
                    message="the preprocessor timed out",
                    log="",
                )
            )
        headers = [m.group(2) for ln in out.splitlines() if (m := _HEADER_LINE.match(ln))]
        outside = _outside_system_dirs(headers, work)
        if outside:
            return SourceScan(outside_includes=outside, forged_line_markers=tuple(forged))
        if code != 0:
            log = kernel_lines(out)
            first = next((ln for ln in log.splitlines() if "error" in ln), "preprocessor error")
            return SourceScan(
                failure=CompileFailure(reason="compile_error", message=first.strip(), log=log)
            )
        try:
            text = (work / "kernel.i").read_text(errors="replace")
        except OSError as exc:
            return SourceScan(
                failure=CompileFailure(reason="compile_error", message=str(exc), log="")
            )
    return _scan_tokens(text, work, forged)


def _outside_system_dirs(headers: list[str], work: Path) -> tuple[str, ...]:
    roots = system_include_dirs()
    outside = []
    for header in headers:
        real = os.path.realpath(os.path.join(work, header))
        if not any(real == r or real.startswith(r.rstrip("/") + "/") for r in roots):
            outside.append(header if real == header else f"{header} ({real})")
    return tuple(dict.fromkeys(outside))


_SPLICE = re.compile(r"\\[ \t\f\v]*\n")
_RAW_STRING = re.compile(r"""(?<![A-Za-z0-9_$])(?:u8|u|U|L)?R\"""")
_PP_LEXEME = re.compile(
    r"""(?P<block>/\*.*?(?:\*/|\Z))"""
    r"""|(?P<line>//[^\n]*)"""
    r"""|(?P<str>(?:u8|u|U|L)?"(?:[^"\\\n]|\\.)*(?:"|(?=\n)|\Z))"""
    r"""|(?P<chr>(?:u8|u|U|L)?'(?:[^'\\\n]|\\.)*(?:'|(?=\n)|\Z))"""
    r"""|(?P<nl>\n)"""
    r"""|(?P<space>[ \t\f\v]+)"""
    r"""|(?P<num>\.?[0-9](?:[eEpP][+-]|[A-Za-z0-9_.$])*)"""
    r"""|(?P<id>[A-Za-z_$][A-Za-z0-9_$]*)"""
    r"""|(?P<hash>%:|#)"""
    r"""|(?P<other>.)""",
    re.DOTALL,
)
_HEADER_NAME = re.compile(r"<[^>\n]*>")
_INCLUDES = frozenset({"include", "include_next", "import"})
_HAS_INCLUDE = frozenset({"__has_include", "__has_include_next"})


def line_control_directives(source: str) -> tuple[str, ...]:
    """`#line` and GNU line markers (`# 1 "x.h" 1 3 4`) in the kernel's source, however
    spelled (`%:`, comments, line splices): with one a source could pass its own tokens
    off as a system header's. Found by translation phases 1-3 as the preprocessor makes
    them (newlines, splices, comments, literals, header names); where they could differ it
    errs towards finding one. Raw strings, which undo splices, are refused outright."""
    text = _SPLICE.sub("", source.replace("\r\n", "\n").replace("\r", "\n"))
    found: list[str] = []
    if _RAW_STRING.search(text):
        found.append('a raw string literal (R"...")')
    line, pos, significant = 1, 0, 0  # significant lexemes since the line began
    directive: list[str] = []  # the significant lexemes of a directive line
    while pos < len(text):
        header = directive and _wants_header(directive) and _HEADER_NAME.match(text, pos)
        if header:
            directive.append(header.group())
            pos = header.end()
            continue
        lexeme = _PP_LEXEME.match(text, pos)
        assert lexeme is not None  # `other` matches any character
        kind, value, pos = lexeme.lastgroup, lexeme.group(), lexeme.end()
        if kind == "nl":
            line, significant, directive = line + 1, 0, []
        elif kind == "block" and "\n" in value:
            # a comment across lines: what follows may begin a line of its own
            line, significant = line + value.count("\n"), 0
        elif kind not in ("space", "line", "block"):
            if significant == 0 and kind == "hash":
                directive = [value]
            elif directive:
                directive.append(value)
                if len(directive) == 2 and (kind == "num" or value == "line"):
                    found.append(f"line control directive at kernel.c:{line}")
            significant += 1
    return tuple(found)


def _wants_header(directive: list[str]) -> bool:
    """Whether the preprocessor lexes a `<...>` header name next on this directive line."""
    if len(directive) == 2 and directive[1] in _INCLUDES:
        return True
    return len(directive) >= 3 and directive[-1] == "(" and directive[-2] in _HAS_INCLUDE


class _Frame(msgspec.Struct):
    name: str
    system: bool


def _scan_tokens(text: str, work: Path, forged: list[str]) -> SourceScan:
    """Walk the preprocessed text: line markers keep the stack of files, so the kernel's
    own tokens (everything not in a system header the preprocessor entered) are lexed for
    assembler keywords, system macros expanded in the kernel included. Only a file the
    preprocessor entered (flag 1 and 3) is a system header; `#line`, `#pragma GCC
    system_header` or a marker flagged 3 alone leave the kernel the kernel, and a source
    that writes its own markers is refused (`line_control_directives`)."""
    stack: list[_Frame] = []
    preamble_entered: list[str] = []
    in_preamble = True
    assembler: list[str] = []
    chunks: list[tuple[int, str, list[str]]] = []  # runs of the kernel's own lines
    line_no, current = 0, ""
    chunk: tuple[int, str, list[str]] | None = None
    for raw in text.split("\n"):
        marker = _MARKER.match(raw)
        if marker is not None:
            line_no = int(marker.group(1))
            name = marker.group(2)
            marks = set(marker.group(3).split())
            system = "3" in marks
            if "1" in marks:
                if in_preamble:
                    preamble_entered.append(name)
                stack.append(_Frame(name, system))
            elif "2" in marks:
                if len(stack) < 2 or stack[-2].name != name:
                    forged.append(f"return to {name!r} at line {line_no}")
                    stack = [_Frame(name, False)]
                else:
                    stack.pop()  # the frame keeps the system flag it was entered with
            elif not stack:
                stack.append(_Frame(name, False))
            else:
                # `#line`, a GNU marker or `#pragma GCC system_header` in the source, or
                # a system macro expanded in the kernel: none makes the kernel a header
                top = stack[-1]
                if name == KERNEL_FILE and top.name in _PREAMBLE_NAMES:
                    in_preamble = False
                top.name = name
            current, chunk = name, None
            continue
        if stack and not stack[-1].system:
            if chunk is None:
                chunk = (line_no, current, [])
                chunks.append(chunk)
            chunk[2].append(raw)
        line_no += 1
    roots = _outside_system_dirs(preamble_entered, work)
    for first, name, lines in chunks:
        line = first
        for token in _TOKEN.finditer("\n".join(lines)):
            kind = token.lastgroup
            if kind == "id" and token.group() in ASSEMBLER_KEYWORDS:
                assembler.append(f"{token.group()} at {name}:{line}")
            elif kind in ("nl", "raw"):
                line += token.group().count("\n")
    return SourceScan(
        outside_includes=roots,
        assembler=tuple(dict.fromkeys(assembler)),
        forged_line_markers=tuple(dict.fromkeys(forged)),
    )


# --- what the kernel's object can do -------------------------------------------------

SHF_WRITE, SHF_ALLOC, SHF_EXECINSTR, SHF_TLS = 0x1, 0x2, 0x4, 0x400
SHT_SYMTAB, SHT_NOBITS = 2, 8
SHT_INIT_ARRAY, SHT_FINI_ARRAY, SHT_PREINIT_ARRAY = 14, 15, 16
SHN_UNDEF, SHN_COMMON, SHN_LORESERVE = 0, 0xFFF2, 0xFF00
STT_OBJECT, STT_FUNC, STT_SECTION, STT_FILE, STT_TLS, STT_GNU_IFUNC = 1, 2, 3, 4, 6, 10
STB_LOCAL = 0
_FLAG_LETTERS = ((0x1, "W"), (0x2, "A"), (0x4, "X"), (0x10, "M"), (0x20, "S"), (0x400, "T"))
_LOAD_TIME_TYPES = {
    SHT_INIT_ARRAY: "INIT_ARRAY",
    SHT_FINI_ARRAY: "FINI_ARRAY",
    SHT_PREINIT_ARRAY: "PREINIT_ARRAY",
}
_LOAD_TIME_NAME = re.compile(
    r"^(\.init_array|\.fini_array|\.preinit_array|\.ctors|\.dtors)(\..*)?$|^\.(init|fini)$"
)
_LOAD_TIME_SYMBOLS = frozenset({"_init", "_fini"})

FORBIDDEN_INSTRUCTIONS: dict[str, str] = {
    **dict.fromkeys(("syscall", "sysenter", "sysexit", "sysret", "sysretq"), "system call"),
    **dict.fromkeys(("int", "int1", "int3", "into", "icebp"), "software interrupt"),
    **dict.fromkeys(("rdtsc", "rdtscp", "rdpmc", "rdpid", "tpause", "umwait"), "clock"),
    **dict.fromkeys(("umonitor", "monitor", "mwait", "monitorx", "mwaitx"), "clock"),
    **dict.fromkeys(("rdrand", "rdseed"), "randomness"),
    **dict.fromkeys(
        (
            "ldmxcsr",
            "vldmxcsr",
            "fldcw",
            "fldenv",
            "fldenvs",
            "fldenvl",
            "frstor",
            "frstors",
            "frstorl",
            "fninit",
            "finit",
            "fxrstor",
            "fxrstor64",
            "xrstor",
            "xrstor64",
            "xrstors",
            "xrstors64",
        ),
        "floating-point state",
    ),
    **dict.fromkeys(("wrfsbase", "wrgsbase", "wrpkru"), "thread state"),
    **dict.fromkeys(("xbegin", "xend", "xabort", "xtest"), "transactional memory"),
}
"""Instructions no compute kernel needs, whichever way they got into the object
(intrinsics included), and what they would give it."""


class ObjectFacts(msgspec.Struct, frozen=True, kw_only=True):
    undefined_symbols: tuple[str, ...]
    defined_symbols: tuple[str, ...]
    writable_sections: tuple[str, ...]
    static_storage: tuple[str, ...]
    load_time_code: tuple[str, ...]
    executable_data: tuple[str, ...]
    forbidden_instructions: tuple[str, ...] = ()


class _Section(msgspec.Struct, frozen=True):
    index: int
    name: str
    type: int
    flags: int
    size: int
    offset: int
    link: int


class _Symbol(msgspec.Struct, frozen=True):
    name: str
    kind: int
    bind: int
    shndx: int
    size: int


def _flag_text(flags: int) -> str:
    return "".join(letter for bit, letter in _FLAG_LETTERS if flags & bit) or "-"


def _cstr(table: bytes, offset: int) -> str:
    end = table.find(b"\0", offset)
    return table[offset : end if end >= 0 else len(table)].decode("utf-8", "replace")


def _read_elf(data: bytes) -> tuple[list[_Section], list[_Symbol]]:
    """Sections and symbols of a relocatable ELF64 little-endian object (x86-64)."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a little-endian ELF64 object")
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    if shnum == 0 or shstrndx >= SHN_LORESERVE or shentsize < 64:
        raise ValueError("extended section numbering is not read")
    raw = []
    for i in range(shnum):
        fields = struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
        raw.append(fields)
    names = raw[shstrndx]
    strtab = data[names[4] : names[4] + names[5]]
    sections = [
        _Section(i, _cstr(strtab, f[0]), f[1], f[2], f[5], f[4], f[6]) for i, f in enumerate(raw)
    ]
    symbols: list[_Symbol] = []
    for sec in sections:
        if sec.type != SHT_SYMTAB:
            continue
        table = data[sec.offset : sec.offset + sec.size]
        strsec = sections[sec.link]
        names_blob = data[strsec.offset : strsec.offset + strsec.size]
        for off in range(24, len(table) - 23, 24):  # entry 0 is the null symbol
            name, info, _other, shndx, _value, size = struct.unpack_from("<IBBHQQ", table, off)
            symbols.append(_Symbol(_cstr(names_blob, name), info & 0xF, info >> 4, shndx, size))
    return sections, symbols


def object_facts(obj: Path, cwd: Path) -> ObjectFacts:
    """What `obj` can do, from its section headers, symbol table and disassembly."""
    try:
        sections, symbols = _read_elf(obj.read_bytes())
    except (ValueError, struct.error, IndexError) as exc:
        unreadable = (f"the object could not be read ({exc})",)
        return ObjectFacts(
            undefined_symbols=(),
            defined_symbols=(),
            writable_sections=unreadable,
            static_storage=unreadable,
            load_time_code=(),
            executable_data=(),
        )
    named = [s for s in symbols if s.name and s.kind not in (STT_SECTION, STT_FILE)]
    undefined = sorted({s.name for s in named if s.shndx == SHN_UNDEF and s.bind != STB_LOCAL})
    defined = sorted({s.name for s in named if s.shndx != SHN_UNDEF and s.bind != STB_LOCAL})
    by_section: dict[int, list[_Symbol]] = {}
    for s in named:
        by_section.setdefault(s.shndx, []).append(s)

    def describe(sec: _Section, extra: str = "") -> str:
        kind = "NOBITS" if sec.type == SHT_NOBITS else _LOAD_TIME_TYPES.get(sec.type, "")
        inside = ", ".join(sorted(s.name for s in by_section.get(sec.index, []))) or "no symbols"
        head = f"{sec.name} [{_flag_text(sec.flags)}{', ' + kind if kind else ''}{extra}"
        return f"{head}, {sec.size} bytes]: {inside}"

    writable, storage, load_time, in_code = [], [], [], []
    for sec in sections:
        if sec.size and sec.flags & (SHF_WRITE | SHF_TLS):
            writable.append(describe(sec))
            storage += [
                f"{s.name} ({sec.name}, {s.size} bytes)" for s in by_section.get(sec.index, [])
            ]
        if sec.type in _LOAD_TIME_TYPES or _LOAD_TIME_NAME.match(sec.name):
            load_time.append(describe(sec))
        if sec.flags & SHF_EXECINSTR:
            in_code += [
                f"{s.name} ({sec.name}, {s.size} bytes)"
                for s in by_section.get(sec.index, [])
                if s.kind in (STT_OBJECT, STT_TLS)
            ]
    common = [f"{s.name} (COMMON, {s.size} bytes)" for s in named if s.shndx == SHN_COMMON]
    writable += common
    storage += common
    load_time += [
        f"{s.name} (GNU ifunc: its resolver runs at load)" for s in named if s.kind == STT_GNU_IFUNC
    ]
    load_time += [
        f"{s.name} (defined: the loader runs it)"
        for s in named
        if s.name in _LOAD_TIME_SYMBOLS and s.shndx != SHN_UNDEF
    ]
    return ObjectFacts(
        undefined_symbols=tuple(undefined),
        defined_symbols=tuple(defined),
        writable_sections=tuple(writable),
        static_storage=tuple(sorted(storage)),
        load_time_code=tuple(load_time),
        executable_data=tuple(in_code),
        forbidden_instructions=_forbidden_instructions(obj, cwd),
    )


_FUNCTION_HEADER = re.compile(r"^([0-9a-f]+) <(.+)>:$")
_INSTRUCTION = re.compile(r"^\s*([0-9a-f]+):\s+(.*)$")


def _forbidden_instructions(obj: Path, cwd: Path) -> tuple[str, ...]:
    code, out = run_compiler(
        ["objdump", "-d", "-w", "--no-show-raw-insn", str(obj)],
        cwd,
        timeout_s=COMPILE_TIMEOUT_S,
        address_space_bytes=COMPILER_ADDRESS_SPACE,
    )
    if code != 0:
        raise RuntimeError(f"objdump failed on {obj}: {out[-2000:]}")
    found: list[str] = []
    function, start = "?", 0
    for line in out.splitlines():
        header = _FUNCTION_HEADER.match(line)
        if header is not None:
            function, start = header.group(2), int(header.group(1), 16)
            continue
        insn = _INSTRUCTION.match(line)
        if insn is None:
            continue
        words = insn.group(2).split("#", 1)[0].split()
        for word in words[:4]:  # prefixes (lock, rep, notrack, data16, ...) then the mnemonic
            if word in FORBIDDEN_INSTRUCTIONS or word == "(bad)":
                why = FORBIDDEN_INSTRUCTIONS.get(word, "undecodable bytes")
                offset = int(insn.group(1), 16) - start
                found.append(f"{word} ({why}) in {function}+{offset:#x}")
                break
            if word[:1] in "%$(*-0123456789" or "," in word:
                break  # operands begin
    return tuple(found[:50])


# --- what the compiler hands the assembler -------------------------------------------

GCC_DIRECTIVES = frozenset(
    {
        # sections and symbols
        ".text", ".data", ".bss", ".section", ".previous", ".pushsection", ".popsection",
        ".globl", ".global", ".local", ".weak", ".hidden", ".protected", ".internal",
        ".type", ".size", ".comm", ".lcomm", ".set", ".equ", ".file", ".ident",
        # alignment and data
        ".align", ".p2align", ".balign", ".zero", ".skip", ".byte", ".value", ".short",
        ".word", ".int", ".long", ".quad", ".octa", ".float", ".double", ".string",
        ".ascii", ".asciz", ".2byte", ".4byte", ".8byte", ".uleb128", ".sleb128",
        # call frames and line tables
        ".cfi_startproc", ".cfi_endproc", ".cfi_def_cfa", ".cfi_def_cfa_offset",
        ".cfi_def_cfa_register", ".cfi_offset", ".cfi_rel_offset", ".cfi_register",
        ".cfi_restore", ".cfi_undefined", ".cfi_same_value", ".cfi_remember_state",
        ".cfi_restore_state", ".cfi_adjust_cfa_offset", ".cfi_escape", ".cfi_sections",
        ".cfi_personality", ".cfi_lsda", ".cfi_signal_frame", ".cfi_val_offset",
        ".cfi_return_column", ".loc", ".loc_mark_labels",
    }
)  # fmt: skip
"""The directives GCC writes for a C translation unit. Anything else in the assembly
(`.incbin`, `.include`, `.macro`, `.symver`, `.reloc`, ...) came from a string the
source passed through verbatim: a section name, an alias or symver target, `#ident`."""
_ASM_STATEMENT = re.compile(
    r"""(?P<str>"(?:[^"\\\n]|\\.)*"?)|(?P<comment>\#[^\n]*)|(?P<sep>[;\n])|(?P<other>[^"#;\n]+)"""
)
_ASM_LABEL = re.compile(r"^\s*(?:[A-Za-z0-9_.$]+|\"[^\"]*\")\s*:")
_ASM_WORD = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")


def foreign_assembler(text: str) -> tuple[str, ...]:
    """Statements in the compiler's assembly that GCC does not write for C: unknown
    directives, and anything that does not even start like an instruction (comment
    markers, stray punctuation). Instructions themselves are judged in the object."""
    found: list[str] = []
    statement, line = "", 1
    for piece in _ASM_STATEMENT.finditer(text + "\n"):
        kind = piece.lastgroup
        if kind in ("str", "other"):
            statement += piece.group()
            continue
        if kind == "comment":
            continue
        found += _judge_statement(statement, line)
        statement = ""
        if piece.group() == "\n":
            line += 1
    return tuple(found[:20])


def _judge_statement(statement: str, line: int) -> list[str]:
    while (label := _ASM_LABEL.match(statement)) is not None:
        statement = statement[label.end() :]
    words = statement.split(None, 1)
    if not words:
        return []
    head = words[0]
    if head.startswith("."):
        if head.lower() in GCC_DIRECTIVES:
            return []
        return [f"{head} (line {line})"]
    if "/*" in statement or "*/" in statement or not _ASM_WORD.match(head):
        return [f"{statement.strip()[:40]!r} (line {line})"]
    return []


# --- building -------------------------------------------------------------------------


def compile_kernel(
    source: str,
    flags: tuple[str, ...],
    *,
    prototype: str,
    cache_dir: Path | None = None,
    trusted_assembler: bool = False,
) -> CompiledKernel | CompileFailure:
    """Compile `source` (which must define `prototype`) into a cached shared object.

    A source whose preprocessing reads files outside the system include directories, or
    whose own tokens hold assembler, is not compiled (the same checks as the static
    stage's `source_check`, kept here too so that no caller can compile one). Only the
    harness's own sources (the calibration kernels) may hold assembler:
    `trusted_assembler`."""
    rejected = bad_flags(flags)
    if rejected:
        return CompileFailure(
            reason="bad_flags",
            message=f"compiler flags not allowed: {' '.join(rejected)}",
            log="allowed: optimisation levels, -march/-mtune=native, ISA -m flags, "
            "vectorisation and fast-math -f flags, -fopenmp, -D macros",
        )
    key = (
        source,
        " ".join(flags),
        prototype,
        compiler_identity(),
        SUPPORT_SOURCE,
        " ".join((*DIAGNOSTIC_FLAGS, *LINK_FLAGS)),
        "|".join(system_include_dirs()),
        CHECKS_VERSION,
        f"trusted_assembler={trusted_assembler}",
    )
    return cached_build(
        cache_dir or default_cache_dir(),
        key,
        CompiledKernel,
        lambda kernel: (kernel.library,),
        lambda work, entry: _build(source, flags, prototype, work, entry, trusted_assembler),
    )


def scan_failure(scan: SourceScan, *, trusted_assembler: bool = False) -> CompileFailure | None:
    """A source the preprocessor scan refuses, as a build that did not happen: paths and
    positions only, never what a file says."""
    if scan.failure is not None:
        return scan.failure
    if scan.outside_includes:
        paths = ", ".join(scan.outside_includes)
        return CompileFailure(
            reason="forbidden_include",
            message=f"the source reads files outside the system include directories: {paths}",
            log="",
        )
    found = (*(() if trusted_assembler else scan.assembler), *scan.forged_line_markers)
    if found:
        return CompileFailure(
            reason="forbidden_construct",
            message=f"assembler or forged line markers in the source: {'; '.join(found)}",
            log="",
        )
    return None


def _run(argv: list[str], cwd: Path) -> tuple[int | None, str]:
    code, out = run_compiler(
        argv, cwd, timeout_s=COMPILE_TIMEOUT_S, address_space_bytes=COMPILER_ADDRESS_SPACE
    )
    return code, out[-LOG_LIMIT:]


def _build(
    source: str,
    flags: tuple[str, ...],
    prototype: str,
    work: Path,
    entry: Path,
    trusted_assembler: bool,
) -> CompiledKernel | CompileFailure:
    scan = scan_source(source, flags, prototype=prototype)
    refused = scan_failure(scan, trusted_assembler=trusted_assembler)
    if refused is not None:
        return refused
    (work / KERNEL_FILE).write_text(prelude(prototype) + source)
    (work / "support.c").write_text(SUPPORT_SOURCE)
    common = [COMPILER, *flags, "-fPIC"]
    code, out = run_compiler(
        [*common, *DIAGNOSTIC_FLAGS, "-S", KERNEL_FILE, "-o", "kernel.s"],
        work,
        timeout_s=COMPILE_TIMEOUT_S,
        address_space_bytes=COMPILER_ADDRESS_SPACE,
    )
    log = kernel_lines(out)[-LOG_LIMIT:]
    if code is None:
        return CompileFailure(reason="compile_timeout", message=out, log="")
    if code != 0:
        first = next((ln for ln in log.splitlines() if "error" in ln), "compiler error")
        return CompileFailure(reason="compile_error", message=first.strip(), log=log)
    if not trusted_assembler:
        foreign = foreign_assembler((work / "kernel.s").read_text(errors="replace"))
        if foreign:
            return CompileFailure(
                reason="forbidden_construct",
                message="the compiler's output holds assembler statements it never writes "
                "itself (strings the source passed through to the assembler): "
                + "; ".join(foreign),
                log="",
            )
    code, out = run_compiler(
        [*common, "-c", "kernel.s", "-o", "kernel.o"],
        work,
        timeout_s=COMPILE_TIMEOUT_S,
        address_space_bytes=COMPILER_ADDRESS_SPACE,
    )
    if code != 0:
        return CompileFailure(
            reason="compile_error", message="the assembler refused the compiler's output", log=""
        )
    facts = object_facts(work / "kernel.o", work)
    code, support_log = _run([COMPILER, "-O2", "-fPIC", "-c", "support.c", "-o", "support.o"], work)
    if code != 0:
        raise RuntimeError(f"the sandbox support file failed to compile: {support_log}")
    libs = ["-lm"]
    if any(s.startswith("_ZGV") for s in facts.undefined_symbols):
        libs.insert(0, "-lmvec")
    wrap = "-Wl," + ",".join(f"--wrap={name}" for name in WRAPPED)
    objects = ("kernel.o", "support.o", wrap)
    code, link_out = run_compiler(
        [*common, *DIAGNOSTIC_FLAGS, "-shared", *objects, *LINK_FLAGS, *libs, "-o", "kernel.so"],
        work,
        timeout_s=COMPILE_TIMEOUT_S,
        address_space_bytes=COMPILER_ADDRESS_SPACE,
    )
    link_log = kernel_lines(link_out)
    if code != 0:
        return CompileFailure(
            reason="link_error", message="link failed", log=(log + "\n" + link_log).strip()
        )
    entry.mkdir(parents=True, exist_ok=True)
    library = entry / "kernel.so"
    os.replace(work / "kernel.so", library)
    os.replace(work / KERNEL_FILE, entry / KERNEL_FILE)
    return CompiledKernel(
        library=str(library),
        source_sha256=source_sha256(source),
        flags=flags,
        undefined_symbols=facts.undefined_symbols,
        defined_symbols=facts.defined_symbols,
        writable_sections=facts.writable_sections,
        static_storage=facts.static_storage,
        load_time_code=facts.load_time_code,
        executable_data=facts.executable_data,
        forbidden_instructions=facts.forbidden_instructions,
        log=(log + "\n" + link_log).strip()[-LOG_LIMIT:],
        cache_hit=False,
    )
