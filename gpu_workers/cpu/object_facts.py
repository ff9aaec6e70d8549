"""What a compiled kernel can do, read from what the compiler made of it.

Judged by what it can do, never by what things are called. The kernel's relocatable
object (`object_facts`, an ELF64 reader of its own) gives what it imports and defines;
every section that is writable or thread-local and not empty, whatever its name, and
COMMON symbols (state one call could hand to the next); code that runs at load or unload
(init/fini arrays, .ctors/.dtors, .init/.fini, GNU ifuncs, a defined _init/_fini); data
placed among code; and, by disassembly, instructions a compute kernel never needs
(system calls, interrupts, clocks, randomness, setting floating-point or thread state,
transactional memory), however they got there. The compiler's assembly, read before it
is assembled (`foreign_assembler`), may hold only what GCC writes for C: any other
directive came from a string the source passed through to the assembler. The static
stage (`static.py`) turns these facts into verdicts.
"""

from __future__ import annotations

import re
import struct
from pathlib import Path

import msgspec

from gpu_workers.cpu.toolchain import run_tool

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
    code, out = run_tool(["objdump", "-d", "-w", "--no-show-raw-insn", str(obj)], cwd)
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
