"""The preprocessor's view of an untrusted C source, taken before anything is compiled.

The source goes through the real preprocessor once, with the flags it will be built with
(`scan_source`; a build runs it with the compile in one confined set-up,
`scan_and_compile`, and the static stage then reads what it found). Every file it reads
must resolve under the compiler's own system include directories (a refusal names only
the path, never what a file says), so the compiler is never made to read another file
into its log or the object; and the kernel's own tokens, after macro expansion (system
macros expanded in the kernel included), may hold no assembler keyword. Line markers in
the preprocessed text tell the kernel's tokens from a system header's; a source that
writes its own (`#line`, GNU markers, however spelled) to pass its tokens off as a
header's is refused (`line_control_directives`). A source that fails the scan is never
compiled to an object (`scan_failure`), and the static stage reports the same findings
as its own (`static.source_check`).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections import OrderedDict
from pathlib import Path

import msgspec

from gpu_workers.compile_failure import CompileFailure
from gpu_workers.cpu.compile_root import unavailable
from gpu_workers.cpu.toolchain import (
    COMPILER,
    DIAGNOSTIC_FLAGS,
    KERNEL_FILE,
    kernel_lines,
    prelude,
    run_tool,
    system_include_dirs,
)

PP_OUT = ("-o", "kernel.i")
_MISSING = re.compile(r"fatal error: (.+?): No such file or directory")


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
    host_probes: tuple[str, ...] = ()
    """`__has_include` of an absolute or `..` path, where the compile cannot be confined
    (`compile_root.unavailable`): it would tell the kernel whether a host file exists."""

    @property
    def clean(self) -> bool:
        return not (
            self.outside_includes
            or self.assembler
            or self.forged_line_markers
            or self.failure
            or self.host_probes
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


SCANS_KEPT = 64
"""Scans remembered in this process, the latest first out: a build's scan is the static
stage's, with no second preprocessor run."""
_scans: OrderedDict[tuple[str, tuple[str, ...], str], SourceScan] = OrderedDict()

_SCAN_THEN_COMPILE = (
    '"$@" -H -E kernel.c -o kernel.i 2> kernel.scan.log; echo $? > kernel.scan.status\n'
    'exec "$@" -S kernel.c -o kernel.s\n'
)
"""The preprocessor's scan and the compile to assembler, in one confined set-up: the
scan's output goes to files, the compile's to the caller."""


def _remember(key: tuple[str, tuple[str, ...], str], scan: SourceScan) -> SourceScan:
    _scans[key] = scan
    _scans.move_to_end(key)
    while len(_scans) > SCANS_KEPT:
        _scans.popitem(last=False)
    return scan


def scan_source(source: str, flags: tuple[str, ...], *, prototype: str) -> SourceScan:
    """Run the preprocessor on `source` as it will be compiled and report what it read and
    whether the kernel's own tokens hold assembler. Nothing any file says is reported. A
    source this process scanned already (its build did) is not run again."""
    key = (source, flags, prototype)
    if key in _scans:
        return _scans[key]
    forged = list(line_control_directives(source))
    if unavailable() is not None and (probes := host_path_probes(source)):
        return _remember(key, SourceScan(host_probes=probes))
    with tempfile.TemporaryDirectory(prefix="kf-cpp-") as tmp:
        work = Path(tmp)
        (work / KERNEL_FILE).write_text(prelude(prototype) + source)
        code, out = run_tool(
            [COMPILER, *flags, "-fPIC", *DIAGNOSTIC_FLAGS, "-H", "-E", KERNEL_FILE, *PP_OUT],
            work,
            confine=True,
        )
        return _remember(key, _read_scan(code, out, work, forged))


def scan_and_compile(
    source: str, flags: tuple[str, ...], *, prototype: str, work: Path
) -> tuple[SourceScan, int | None, str]:
    """The scan of `scan_source` and the compile of `work/kernel.c` (written here) to
    `kernel.s`, in one confined set-up (two cost twice the namespace's): the scan, and the
    compile's exit status and output (not to be used where the scan refuses)."""
    key = (source, flags, prototype)
    forged = list(line_control_directives(source))
    if unavailable() is not None and (probes := host_path_probes(source)):
        return _remember(key, SourceScan(host_probes=probes)), None, ""
    (work / KERNEL_FILE).write_text(prelude(prototype) + source)
    compiler = shutil.which(COMPILER)  # through any links the root does not hold
    common = [os.path.realpath(compiler) if compiler else COMPILER, *flags, "-fPIC"]
    code, out = run_tool(
        ["/bin/sh", "-c", _SCAN_THEN_COMPILE, "sh", *common, *DIAGNOSTIC_FLAGS],
        work,
        confine=True,
        compiler=COMPILER,
    )
    status = work / "kernel.scan.status"
    scanned = int(status.read_text()) if code is not None and status.exists() else None
    log = (work / "kernel.scan.log").read_text(errors="replace") if scanned is not None else ""
    return _remember(key, _read_scan(scanned, log, work, forged)), code, out


def _read_scan(code: int | None, out: str, work: Path, forged: list[str]) -> SourceScan:
    """The scan from the preprocessor's exit status (None: it timed out), its log (`-H`'s
    header lines and errors) and `work/kernel.i`."""
    if code is None:
        return SourceScan(
            failure=CompileFailure(
                reason="compile_timeout",
                message="the preprocessor timed out",
                log="",
            )
        )
    headers = [m.group(2) for ln in out.splitlines() if (m := _HEADER_LINE.match(ln))]
    # confined, a file outside the compile's root is not there: the include names it
    headers += [m.group(1) for m in _MISSING.finditer(kernel_lines(out))]
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
        return SourceScan(failure=CompileFailure(reason="compile_error", message=str(exc), log=""))
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


_PROBE = re.compile(r"__has_include(?:_next)?\s*\(\s*([^)]*)\)")


def host_path_probes(source: str) -> tuple[str, ...]:
    """`__has_include` (or `_next`) whose argument is not a plain header name: an absolute
    path, a `..`, or anything but a literal `<...>` or `"..."` (a macro could spell a
    path), as 'argument at kernel.c:N'."""
    text = _SPLICE.sub("", source.replace("\r\n", "\n").replace("\r", "\n"))
    found = []
    for m in _PROBE.finditer(text):
        arg = m.group(1).strip()
        literal = re.fullmatch(r'<[^<>"]*>|"[^<>"]*"', arg) is not None
        if not literal or arg[1:].lstrip().startswith("/") or ".." in arg:
            found.append(f"{arg} at kernel.c:{text.count(chr(10), 0, m.start()) + 1}")
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


def scan_failure(scan: SourceScan, *, trusted_assembler: bool = False) -> CompileFailure | None:
    """A source the preprocessor scan refuses, as a build that did not happen: paths and
    positions only, never what a file says."""
    if scan.failure is not None:
        return scan.failure
    if scan.host_probes:
        return CompileFailure(
            reason="forbidden_include",
            message="the source asks whether host files exist (__has_include), and this host "
            f"cannot hide them from the compiler ({unavailable()}): " + "; ".join(scan.host_probes),
            log="",
        )
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
