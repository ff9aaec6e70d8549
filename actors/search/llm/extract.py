"""Find the kernel's C source in an LLM reply, and the flags it asks for."""

from __future__ import annotations

import re
from typing import Final

import msgspec

from kernels.spec import Problem

FLAGS_COMMENT: Final = re.compile(
    r"^[ \t]*//[ \t]*kfactory-flags:[ \t]*(\S.*?)[ \t]*(?:\n|\Z)", re.M
)
"""The same convention `kfactory check` reads: the first such line names the flags."""
_FENCE: Final = re.compile(
    r"^[ \t]*```[ \t]*([A-Za-z0-9_+#.-]*)[^\n]*\n(.*?)(?:^[ \t]*```[ \t]*$|\Z)", re.M | re.S
)
_C_LANGS: Final = frozenset({"", "c", "c99", "c11", "h", "cpp", "c++", "cc", "cxx", "cuda", "cu"})
_CODE_START: Final = re.compile(
    r"^[ \t]*(#|//|/\*|typedef\b|static\b|void\b|float\b|double\b|int\b|const\b|inline\b"
    r"|struct\b|enum\b|extern\b|unsigned\b|size_t\b|int64_t\b|__attribute__\b)",
    re.M,
)


class NoCodeFound(Exception):
    """The reply holds no usable definition of the kernel; the message says why."""


class ExtractedKernel(msgspec.Struct, frozen=True, kw_only=True):
    source: str
    """The C source, without the leading flags comment."""
    flags: tuple[str, ...] | None
    """The flags the `// kfactory-flags:` line asked for; None when there was no such line."""


def kernel_name(problem: Problem, dtype: str = "fp32") -> str:
    found = re.match(r"\s*void\s+(\w+)\s*\(", problem.c_signature(dtype))
    if found is None:
        raise ValueError(f"cannot read the function name of {problem.c_signature(dtype)!r}")
    return found.group(1)


def split_flags(source: str) -> ExtractedKernel:
    found = FLAGS_COMMENT.search(source)
    if found is None:
        return ExtractedKernel(source=source, flags=None)
    rest = source[: found.start()] + source[found.end() :]
    return ExtractedKernel(source=rest, flags=tuple(found.group(1).split()))


def extract_kernel(reply_text: str, problem: Problem, dtype: str = "fp32") -> ExtractedKernel:
    """The C block that defines the kernel (the last one, if several do); else NoCodeFound.

    A fenced block is taken whole; unfenced code runs from its first C-looking line to the
    end of the kernel's body, so prose around it is left out.
    """
    name = kernel_name(problem, dtype)
    arity = len(problem.args) + len(problem.dims)
    fenced = [m.group(2) for m in _FENCE.finditer(reply_text) if m.group(1).lower() in _C_LANGS]
    blocks = fenced
    if not fenced:
        start = _CODE_START.search(reply_text)
        if start is None:
            raise NoCodeFound("the reply contains no code block and no C code")
        blocks = [reply_text[start.start() :]]
    defective: list[str] = []
    for block in reversed(blocks):
        try:
            body_end = _kernel_body_end(block, name, arity)
        except _NoDefinition:
            continue
        except NoCodeFound as why:
            defective.append(str(why))
            continue
        code = block if fenced else block[: body_end + 1]
        return split_flags(code.strip("\n") + "\n")
    if defective:
        raise NoCodeFound(defective[0])
    raise NoCodeFound(
        f"none of the {len(blocks)} code block(s) defines the kernel function {name}(...)"
    )


class _NoDefinition(NoCodeFound):
    pass


def _kernel_body_end(block: str, name: str, arity: int) -> int:
    """Where the kernel's body closes in `block`; NoCodeFound says what is wrong otherwise."""
    masked = _mask(block)
    header = re.compile(rf"\bvoid\s+{re.escape(name)}\s*\(")
    for found in header.finditer(masked):
        close = _matching(masked, found.end() - 1, "(", ")")
        if close is None:
            raise NoCodeFound(f"the parameter list of {name}(...) is not closed")
        if not masked[close + 1 :].lstrip().startswith("{"):
            continue  # a prototype or a call; the definition may follow
        params = [p for p in masked[found.end() : close].split(",") if p.strip()]
        if len(params) != arity:
            raise NoCodeFound(
                f"{name}(...) takes {len(params)} parameters; the signature has {arity}"
            )
        end = _matching(masked, masked.index("{", close), "{", "}")
        if end is None:
            raise NoCodeFound(f"the body of {name}(...) is not closed; was the reply cut off?")
        return end
    raise _NoDefinition(f"no definition of {name}(...)")


def _matching(text: str, at: int, open_char: str, close_char: str) -> int | None:
    depth = 0
    for i in range(at, len(text)):
        if text[i] == open_char:
            depth += 1
        elif text[i] == close_char:
            depth -= 1
            if depth == 0:
                return i
    return None


def _mask(code: str) -> str:
    """The same text with comments, strings and char literals blanked (lengths kept)."""
    out = list(code)
    i, n = 0, len(code)
    while i < n:
        two = code[i : i + 2]
        if two == "//":
            j = code.find("\n", i)
            j = n if j < 0 else j
        elif two == "/*":
            j = code.find("*/", i + 2)
            j = n if j < 0 else j + 2
        elif code[i] in "\"'":
            j = i + 1
            while j < n and code[j] != code[i] and code[j] != "\n":
                j += 2 if code[j] == "\\" else 1
            j = min(j + 1, n)
        else:
            i += 1
            continue
        for k in range(i, j):
            if out[k] != "\n":
                out[k] = " "
        i = j
    return "".join(out)
